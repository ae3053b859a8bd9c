"""Chunked prefill (vLLM v1 scheduling) proved on the real engine and at scheduler level.

Engine level (the real ``LLM`` on the tiny models of ``tests/engine/tiny.py``): greedy tokens equal
transformers' ``generate`` with budgets of 5, 8 and 16 tokens; with a prefix-cache hit that ends inside
a chunk; under recompute and swap preemption of a half-computed prompt; with ``n > 1`` (the fork comes
after the last chunk); a decoding request keeps decoding every step while a long prompt is prefilled;
``long_prefill_token_threshold`` caps a chunk; ``enable_chunked_prefill=False`` keeps whole prompts; the
latency statistics.

Scheduler level (the ``FakeEngine`` of ``test_scheduler.py``, which checks every K/V slot a step reads):
random arrivals, lengths, budgets, thresholds, pools, preemption modes and prefix caching; every request
finishes, no block leaks, and every request's tokens equal those of an unconstrained run of the same
requests (the fake token rule depends only on a sequence's own tokens).

Token comparison as in ``test_engine.py`` (``tests/engine/tiny.py``): equal, or parted at a near-tie.
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler import FakeEngine, assert_all_free

from paged.config import SchedulerConfig
from paged.core.block_table import blocks_needed
from paged.core.scheduler import CacheConfig, Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged.engine.llm import LLM
from paged.worker.attention import use_attention
from tests.engine.tiny import greedy_agreement, tiny_model


def prefills(out) -> list:
    """The step's prompt chunks (``SchedulerOutputs.scheduled`` entries that are prefills)."""
    return [s for s in out.scheduled if s.is_prefill]


S = SequenceStatus
MAX_TOKENS = 8
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


# ====================================================================== helpers (engine level)
@pytest.fixture(scope="module")
def llama():
    """The tiny Llama (vocab 128, 512 positions) and a deep copy kept on SDPA for the references."""
    model = tiny_model("llama")
    return model, copy.deepcopy(model)  # never share the config object with the engine's model


def _prompt(length: int, seed: int, vocab: int = 127) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (length,), generator=gen).tolist()


@torch.inference_mode()
def _reference(ref, prompts, max_tokens=MAX_TOKENS):
    """transformers' greedy ``generate``, one prompt at a time."""
    use_attention(ref, "sdpa")
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = ref.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        outs.append(out[0, len(p) :].tolist())
    return outs


def _assert_agree(ref, prompts, got, want, what):
    use_attention(ref, "sdpa")
    for p, a, b in zip(prompts, got, want):
        result = greedy_agreement(ref, p, a, b)
        assert result.ok, (
            f"{what}: a {len(p)}-token prompt gave {a}, transformers {b}; first divergence at "
            f"{result.position} with logit gap {result.gap} (not a near-tie)"
        )


def _llm(model, **kwargs) -> LLM:
    kwargs = {
        "block_size": 4,
        "num_gpu_blocks": 128,
        "enable_prefix_caching": False,
        "max_model_len": 128,
        "max_num_seqs": 4,
        "verbose": False,
        **kwargs,
    }
    return LLM(model, **kwargs)


def _spy(sched: Scheduler) -> list[tuple[dict, object, list[bool]]]:
    """Record every ``schedule()``: ``(num_computed_tokens by seq_id before it, its SchedulerOutputs, samples)``.
    ``samples`` holds each entry's ``ScheduledSeq.samples_next_token`` as the step saw it (the property
    reads the sequence's current length, which grows once the engine appends the sampled token)."""
    log = []
    real = sched.schedule

    def schedule():
        before = {
            s.seq_id: s.num_computed_tokens
            for q in (sched.running, sched.swapped, sched.waiting)
            for s in q
        }
        out = real()
        log.append((before, out, [s.samples_next_token for s in out.scheduled]))
        return out

    sched.schedule = schedule
    return log


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _no_block_in_use(llm):
    bm = llm.engine.scheduler.block_manager
    assert bm.get_num_free_gpu_blocks() == bm.num_gpu_blocks, (
        "GPU blocks still in use after generate"
    )
    assert bm.get_num_free_cpu_blocks() == bm.num_cpu_blocks, (
        "CPU swap blocks still in use after generate"
    )


# ====================================================================== engine: budgets
BUDGET_PROMPTS = {5: (20, 33, 47), 8: (21, 64, 100, 38), 16: (100, 20, 57, 81)}


@pytest.mark.parametrize("budget", sorted(BUDGET_PROMPTS))
def test_chunked_tokens_equal_transformers_at_small_budgets(llama, budget):
    model, ref = llama
    prompts = [_prompt(n, seed=budget * 10 + i) for i, n in enumerate(BUDGET_PROMPTS[budget])]
    llm = _llm(model, max_num_batched_tokens=budget, max_num_seqs=min(budget, 4))
    log = _spy(llm.engine.scheduler)
    got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    _assert_agree(ref, prompts, got, _reference(ref, prompts), f"budget {budget}")
    assert all(len(t) == MAX_TOKENS for t in got)
    assert all(out.num_batched_tokens <= budget for _, out, _ in log), (
        "a step went over the token budget"
    )
    pieces = {}
    for _, out, _ in log:
        for s in prefills(out):
            pieces.setdefault(s.seq.seq_id, []).append((s.start, s.num_tokens))
    for chunks in pieces.values():  # each prompt's chunks tile it: contiguous, no gap, no overlap
        assert [start for start, _ in chunks] == list(
            itertools.accumulate([0] + [n for _, n in chunks[:-1]])
        )
    assert sorted(sum(n for _, n in c) for c in pieces.values()) == sorted(map(len, prompts))
    assert (
        llm.stats()["prefill_chunks"]
        == sum(map(len, pieces.values()))
        >= sum(math.ceil(len(p) / budget) for p in prompts)
    ), "every prompt is cut into at least len / budget chunks"
    _no_block_in_use(llm)


# ====================================================================== engine: prefix-cache hit inside a chunk
@pytest.mark.parametrize("same_call", [False, True], ids=["cached-earlier", "cached-this-step"])
def test_prefix_hit_that_ends_inside_a_chunk(llama, same_call):
    """A 30-token prompt, then one sharing its first 26 tokens: 6 full blocks of 4 (24 tokens) hit. With a
    budget of 10 the first request's chunks are 0-9, 10-19, 20-29: the hit boundary 24 is inside a chunk,
    the second request computes 24-33, 34-43, 44-45 (chunk ends inside blocks). ``cached-this-step``: a
    64-token budget admits both in one step, the second hitting blocks the first fills in that very step."""
    model, ref = llama
    first = _prompt(30, seed=1)
    second = first[:26] + _prompt(20, seed=2)
    budget = 64 if same_call else 10
    llm = _llm(model, enable_prefix_caching=True, max_num_batched_tokens=budget, max_num_seqs=4)
    log = _spy(llm.engine.scheduler)
    if same_call:
        outs = llm.generate([first, second], GREEDY, use_tqdm=False)
    else:
        outs = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in (first, second)]
    assert [o.num_cached_tokens for o in outs] == [0, 24], (
        "six full blocks of the shared 26 tokens hit"
    )
    chunks = [
        (s.start, s.num_tokens)
        for _, out, _ in log
        for s in prefills(out)
        if s.seq.num_prompt_tokens == 46
    ]
    assert chunks == ([(24, 22)] if same_call else [(24, 10), (34, 10), (44, 2)])
    if same_call:
        assert [(s.start, s.num_tokens) for s in prefills(log[0][1])] == [(0, 30), (24, 22)], (
            "both in step 1: the hit names blocks the first request writes in that step"
        )
    _assert_agree(
        ref,
        [first, second],
        _tokens(outs),
        _reference(ref, [first, second]),
        "prefix hit inside a chunk",
    )
    off = _tokens(
        _llm(model, max_num_batched_tokens=budget).generate([first, second], GREEDY, use_tqdm=False)
    )
    assert _tokens(outs) == off, "prefix caching on must give the tokens of caching off"
    _no_block_in_use(llm)


def test_fully_cached_prompt_still_computes_its_last_token_in_chunks(llama):
    """The same 32-token prompt twice (8 full blocks of 4): 7 blocks hit, the last block is computed again,
    and with a budget of 3 its 4 tokens take two chunks (3 + 1); the tokens are those of the first run."""
    model, _ = llama
    prompt = _prompt(32, seed=20)
    llm = _llm(model, enable_prefix_caching=True, max_num_batched_tokens=3, max_num_seqs=2)
    first = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    log = _spy(llm.engine.scheduler)
    again = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 28)
    assert [(s.start, s.num_tokens) for _, out, _ in log for s in prefills(out)] == [
        (28, 3),
        (31, 1),
    ]
    assert [flags for *_, flags in log[:2]] == [[False], [True]], (
        "the first token comes after the last chunk"
    )
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    _no_block_in_use(llm)


# ====================================================================== engine: preemption of a half-computed prompt
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempting_a_half_computed_prompt(llama, mode):
    """Budget 8, a pool of 14 blocks of 4: A (24 tokens) decodes while B (40 tokens) is prefilled in chunks;
    A's growth takes B's blocks before B's prompt is done. Recompute restarts B's prompt from 0; swap resumes it
    where it stopped. Tokens still equal transformers'."""
    model, ref = llama
    prompts = [_prompt(24, seed=3), _prompt(40, seed=4), _prompt(22, seed=5)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    llm = _llm(
        model,
        num_gpu_blocks=14,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        watermark=0.0,
        preemption_mode=mode,
        num_cpu_blocks=32 if mode == "swap" else 0,
    )
    log = _spy(llm.engine.scheduler)
    got = _tokens(llm.generate(prompts, params, use_tqdm=False))
    _assert_agree(ref, prompts, got, _reference(ref, prompts, 12), f"{mode} preemption mid-prefill")
    stats = llm.stats()
    assert stats["preemptions"] > 0, f"the small pool should force preemption: {stats}"
    half = [
        (k, seq, before[seq.seq_id])
        for k, (before, out, _) in enumerate(log)
        for seq in out.preempted
        if 0 < before[seq.seq_id] < seq.num_prompt_tokens
    ]
    assert half, "a sequence must be preempted while its prompt is partly computed"
    k, seq, done = half[0]
    back = next(s for _, out, _ in log[k + 1 :] for s in out.scheduled if s.seq is seq)
    if mode == "swap":
        assert stats["swap_outs"] > 0 and stats["swap_ins"] > 0, f"swap mode never swapped: {stats}"
        assert stats["recomputes"] == 0
        assert back.start == done, f"a swapped-out prompt resumes after its {done} computed tokens"
        assert seq in next(out for _, out, _ in log[k + 1 :] if back in out.scheduled).swapped_in
    else:
        assert stats["recomputes"] > 0 and stats["swap_outs"] == 0
        assert back.start == 0, (
            f"a recomputed prompt starts again from token 0 (had {done} computed)"
        )
    _no_block_in_use(llm)


# ====================================================================== engine: n > 1
def test_parallel_sampling_forks_after_the_last_chunk(llama):
    model, ref = llama
    prompt = _prompt(30, seed=6)
    llm = _llm(model, max_num_batched_tokens=8, max_num_seqs=4)
    engine = llm.engine
    log = _spy(llm.engine.scheduler)
    engine.add_request(prompt, SamplingParams(n=3, max_tokens=MAX_TOKENS, ignore_eos=True))
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
        _, out, _ = log[-1]
        group = out.scheduled[0].seq.group
        parent = group.seqs[0]
        computed = parent.num_computed_tokens >= parent.num_prompt_tokens
        assert (len(group.seqs) == 3) == computed, (
            f"step {len(log)}: {len(group.seqs)} sequences with {parent.num_computed_tokens} of 30 computed"
        )
        if len(log) > 1 and log[-2][2] == [True] and not log[-2][1].scheduled[0].seq.is_finished:
            assert len(out.scheduled) == 3 and all(s.num_tokens == 1 for s in out.scheduled), (
                "after the fork each sample is its own one-token decode"
            )
    assert [[(s.start, s.num_tokens) for s in out.scheduled] for _, out, _ in log[:4]] == [
        [(0, 8)],
        [(8, 8)],
        [(16, 8)],
        [(24, 6)],
    ], "30 tokens in four chunks"
    assert [flags for *_, flags in log[:4]] == [[False], [False], [False], [True]], (
        "samples only after the last"
    )
    (out,) = finished
    children = [c.token_ids for c in out.outputs]
    single = _tokens(
        _llm(model, max_num_batched_tokens=8).generate([prompt], GREEDY, use_tqdm=False)
    )[0]
    assert children == [single] * 3, "greedy children equal the n = 1 output"
    _assert_agree(ref, [prompt], [single], _reference(ref, [prompt]), "n = 1 reference")
    _no_block_in_use(llm)


# ====================================================================== engine: decodes keep going
def test_a_decoding_request_decodes_every_step_while_a_long_prompt_is_chunked(llama):
    model, ref = llama
    short, long = _prompt(6, seed=7), _prompt(100, seed=8)
    llm = _llm(model, max_num_batched_tokens=8, max_num_seqs=4)
    engine, log = llm.engine, _spy(llm.engine.scheduler)
    engine.add_request(short, SamplingParams(max_tokens=30, ignore_eos=True), request_id="decoding")
    engine.step()  # the short prompt in one step: it samples its first token
    engine.add_request(long, GREEDY, request_id="long")
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    steps = [out for _, out, _ in log[1:]]
    chunked = [
        out
        for out in steps
        if any(s.seq.group.request_id == "long" and s.is_prefill for s in out.scheduled)
    ]
    assert len(chunked) == math.ceil(100 / 7), (
        "100 prompt tokens in chunks of budget 8 - 1 decode token"
    )
    for out in chunked:
        kinds = [(s.seq.group.request_id, s.num_tokens) for s in out.scheduled]
        assert kinds[0] == ("decoding", 1), f"the decode runs first in every step: {kinds}"
        assert out.num_batched_tokens <= 8
    assert chunked == steps[: len(chunked)], (
        "the prompt's chunks run in consecutive steps, each beside the decode"
    )
    by_id = {o.request_id: o.outputs[0].token_ids for o in finished}
    want = _reference(ref, [short], 30) + _reference(ref, [long])
    _assert_agree(
        ref, [short, long], [by_id["decoding"], by_id["long"]], want, "decode beside chunks"
    )


# ====================================================================== engine: threshold and chunking off
def test_long_prefill_token_threshold_caps_each_chunk(llama):
    model, ref = llama
    prompts = [_prompt(20, seed=9), _prompt(20, seed=10), _prompt(3, seed=11)]
    llm = _llm(model, max_num_batched_tokens=32, max_num_seqs=4, long_prefill_token_threshold=6)
    log = _spy(llm.engine.scheduler)
    got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    first = [(s.start, s.num_tokens) for s in prefills(log[0][1])]
    assert first == [(0, 6), (0, 6), (0, 3)], (
        "three prompts share step 1, none over the 6-token cap"
    )
    sizes = [s.num_tokens for _, out, _ in log for s in prefills(out)]
    assert max(sizes) == 6 and sizes.count(6) == 6, "each 20-token prompt: 6 + 6 + 6 + 2"
    _assert_agree(ref, prompts, got, _reference(ref, prompts), "threshold 6")


def test_chunking_off_keeps_whole_prompts_and_its_config_error(llama):
    model, ref = llama
    with pytest.raises(
        ValueError, match=r"max_num_batched_tokens \(16\) must be >= max_model_len \(128\)"
    ):
        _llm(model, enable_chunked_prefill=False, max_num_batched_tokens=16)
    with pytest.raises(
        ValueError,
        match="long_prefill_token_threshold=8 cuts prompts .* enable_chunked_prefill=True",
    ):
        _llm(
            model,
            enable_chunked_prefill=False,
            max_num_batched_tokens=128,
            long_prefill_token_threshold=8,
        )
    prompts = [_prompt(100, seed=12), _prompt(60, seed=13), _prompt(20, seed=14)]
    llm = _llm(model, enable_chunked_prefill=False, max_num_seqs=4)
    assert llm.config.scheduler.max_num_batched_tokens == 2048, (
        "default budget: max(max_model_len, 2048)"
    )
    llm = _llm(model, enable_chunked_prefill=False, max_num_batched_tokens=128, max_num_seqs=4)
    log = _spy(llm.engine.scheduler)
    got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    chunks = [[(s.start, s.num_tokens) for s in prefills(out)] for _, out, _ in log]
    assert chunks[0] == [(0, 100)], (
        "the 60-token prompt does not fit the 28 tokens left, and is never cut"
    )
    assert chunks[1] == [(0, 60), (0, 20)], (
        "step 2: the whole 60 and 20-token prompts beside the decode"
    )
    assert all(p == [] for p in chunks[2:])
    _assert_agree(ref, prompts, got, _reference(ref, prompts), "chunking off")


# ====================================================================== engine: statistics
def test_prefill_chunks_and_latency_stats_of_the_last_generate(llama):
    model, _ = llama
    llm = _llm(model, max_num_batched_tokens=8, max_num_seqs=4)
    llm.generate([_prompt(49, seed=15)], GREEDY, use_tqdm=False)
    stats = llm.stats()
    assert stats["prefill_chunks"] == 7, (
        "49 tokens with budget 8: six chunks of 8 and a last one of 1"
    )
    assert stats["steps"] == 7 + MAX_TOKENS - 1, (
        "the last chunk samples the first token; 7 decodes follow"
    )
    for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"):
        assert 0 < stats[key] < math.inf, f"{key} = {stats[key]}"
    assert stats["ttft_p50"] <= stats["ttft_p99"] and stats["itl_p50"] <= stats["itl_p99"]
    assert len(llm.engine.metrics.ttft) == 1 and len(llm.engine.metrics.itl) == MAX_TOKENS - 1
    llm.generate(
        [_prompt(5, seed=16), _prompt(9, seed=17)],
        SamplingParams(max_tokens=3, ignore_eos=True),
        use_tqdm=False,
    )
    again, metrics = llm.stats(), llm.engine.metrics
    assert len(metrics.ttft) == 2 and len(metrics.itl) == 2 * 2, (
        "the window holds the last call's requests only"
    )
    assert again["prefill_chunks"] == 7 + 3, (
        "cumulative; budget 8: the 5-token prompt, then the 9 in 3 + 6"
    )
    assert min(metrics.ttft) <= again["ttft_p50"] <= again["ttft_p99"] <= max(metrics.ttft)
    assert min(metrics.itl) <= again["itl_p50"] <= again["itl_p99"] <= max(metrics.itl)
    assert again["ttft_p50"] > 0 and again["itl_p50"] > 0


# ====================================================================== scheduler level: random runs
def _run(
    reqs,
    *,
    bs,
    budget,
    max_num_seqs,
    threshold,
    n_gpu,
    n_cpu,
    mode,
    prefix,
    chunked,
    max_model_len,
    watermark=0.0,
    check=True,
):
    """Run ``reqs`` (``(rid, prompt, max_tokens, n, arrival step)``) through a FakeEngine; returns the tokens
    of every sequence by request (in ``group.seqs`` order), the engine and the groups."""
    s = Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            preemption_mode=mode,
            enable_chunked_prefill=chunked,
            long_prefill_token_threshold=threshold,
        ),
        CacheConfig(
            block_size=bs,
            num_gpu_blocks=n_gpu,
            num_cpu_blocks=n_cpu,
            watermark=watermark,
            enable_prefix_caching=prefix,
        ),
    )
    eng, groups = FakeEngine(s), {}
    eng.schedules = log = _spy(s)
    pending = sorted(reqs, key=lambda r: r[4])
    ids = itertools.count()
    bound = 50 + sum(4 * (len(p) + m) * n for _, p, m, n, _ in reqs)
    for t in itertools.count():
        while pending and pending[0][4] <= t:
            rid, prompt, m, n, _ = pending.pop(0)
            groups[rid] = SequenceGroup(
                rid, [Sequence(next(ids), prompt, bs)], SamplingParams(n=n, max_tokens=m)
            )
            s.add_request(groups[rid])
        if not pending and not s.has_unfinished_requests():
            break
        assert t < bound, f"no progress after {bound} steps"
        forks = {rid: len(g.seqs) for rid, g in groups.items()}
        lengths = {x.seq_id: len(x) for g in groups.values() for x in g.seqs}
        out = eng.step()
        if not check:
            continue
        _, _, samples = log[-1]
        assert out.num_batched_tokens <= budget, "token budget exceeded"
        assert len(out.scheduled) <= max_num_seqs, "more sequences in a step than max_num_seqs"
        for e, sampled in zip(out.scheduled, samples):
            remaining = lengths[e.seq.seq_id] - e.start
            if threshold and e.num_tokens > 1:
                assert e.num_tokens <= threshold, (
                    f"a chunk of {e.num_tokens} over the threshold {threshold}"
                )
            if not chunked:
                assert e.num_tokens == remaining, (
                    "chunking off: a sequence computes all its tokens at once"
                )
            assert sampled == (e.num_tokens == remaining), (
                "a sequence samples exactly when its last token ran"
            )
        for (
            rid,
            g,
        ) in groups.items():  # n > 1: the fork happens exactly when the prompt's last chunk ran
            if len(g.seqs) > forks.get(rid, 1):
                assert any(e.seq is g.seqs[0] and f for e, f in zip(out.scheduled, samples)), (
                    "a fork before the prompt's last chunk"
                )
                assert len(g.seqs) == g.sampling_params.n
            if len(g.seqs) == 1 and g.sampling_params.n > 1:
                assert not g.seqs[0].output_token_ids, (
                    "a request with n > 1 sampled without forking"
                )
    tokens = {rid: [list(x.output_token_ids) for x in g.seqs] for rid, g in groups.items()}
    return tokens, eng, groups


# (prompt tail length, shared head length, head id, max_tokens, n, arrival step)
request = st.tuples(
    st.integers(1, 28),
    st.integers(0, 12),
    st.integers(0, 1),
    st.integers(1, 8),
    st.sampled_from([1, 1, 1, 2, 3]),
    st.integers(0, 6),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request, min_size=1, max_size=6),
    bs=st.sampled_from([2, 4, 8]),
    max_num_seqs=st.integers(1, 4),
    extra_budget=st.integers(0, 20),
    threshold=st.sampled_from([0, 0, 1, 3, 7]),
    extra_gpu=st.sampled_from([0, 0, 1, 2, 3, 6, 12]),
    n_cpu=st.integers(0, 24),
    mode=st.sampled_from(["recompute", "swap"]),
    prefix=st.booleans(),
    chunked=st.sampled_from([True, True, True, False]),
    watermark=st.sampled_from([0.0, 0.1]),
)
def test_random_chunked_runs_finish_free_everything_and_match_an_unconstrained_run(
    reqs,
    bs,
    max_num_seqs,
    extra_budget,
    threshold,
    extra_gpu,
    n_cpu,
    mode,
    prefix,
    chunked,
    watermark,
):
    max_model_len = 48
    work = []
    for i, (tail, head, head_id, m, n, arrival) in enumerate(reqs):
        prompt = [1 + (head_id * 11 + j) % 50 for j in range(head)] + [
            51 + (7 * i + j) % 40 for j in range(tail)
        ]
        work.append(
            (f"r{i}", prompt, m, min(n, max_num_seqs), arrival)
        )  # n > max_num_seqs: ignored
    budget = max_num_seqs + extra_budget if chunked else max_model_len + extra_budget
    threshold = (
        threshold if chunked else 0
    )  # a threshold cuts prompts: the config refuses it without chunking
    need = blocks_needed(
        max_model_len, bs
    )  # any one sequence fits the pool alone: nobody ends exhausted
    n_gpu = need + extra_gpu
    while n_gpu - need < int(watermark * n_gpu):
        n_gpu += 1
    if mode == "swap":
        n_cpu = max(n_cpu, 1)
    got, eng, groups = _run(
        work,
        bs=bs,
        budget=budget,
        max_num_seqs=max_num_seqs,
        threshold=threshold,
        n_gpu=n_gpu,
        n_cpu=n_cpu,
        mode=mode,
        prefix=prefix,
        chunked=chunked,
        max_model_len=max_model_len,
        watermark=watermark,
    )
    for rid, g in groups.items():
        assert all(x.status is S.FINISHED_LENGTH for x in g.seqs), f"{rid}: {g.seqs}"
        assert len(g.seqs) == g.sampling_params.n
    assert_all_free(eng.sched)
    free, _, _ = _run(
        [(rid, p, m, n, 0) for rid, p, m, n, _ in work],
        bs=bs,
        budget=10_000,
        max_num_seqs=64,
        threshold=0,
        n_gpu=64 * need,
        n_cpu=0,
        mode="recompute",
        prefix=False,
        chunked=True,
        max_model_len=max_model_len,
        check=False,
    )
    assert got == free, (
        "tokens must not depend on budget, chunking, pool size, preemption or prefix caching"
    )


# ====================================================================== the latency benchmark's functions
