"""Graded: chapter 07, preparing a step's inputs and applying its update (exercises/ex07_engine.py).

``prepare_inputs`` (ch07.ex6) is compared field by field with the reference (``paged.worker.attention``) and
with the contract computed by hand, on random steps (chunks first, decodes last, prefix hits, chunks and
decodes ending on block boundaries) and with each edge case placed at every position of a batch; the
``slot_mapping`` it is given must be the one it uses, and the block tables it reads come back unchanged.
``update_sequence`` (ch07.ex7) is checked for each finish reason at its exact boundary. ``update_from_output``
(ch07.ex8) drives a real scheduler step after step beside a twin on the reference update, with parallel
sampling, stop tokens, length limits, ignored requests and a pool small enough to preempt, comparing the
sequences, the freed blocks and the reported requests after every step. Finally the engine serves a tiny
model on your parts and must give the reference parts' tokens.
"""

from __future__ import annotations

import copy
import random
import warnings

import pytest
import torch

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_table import slot_mapping as reference_slot_mapping
from paged.core.scheduler import Scheduler
from paged.core.scheduler import update_from_output as reference_update
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged.engine.llm import LLM
from paged.engine.llm_engine import MaxModelLenWarning
from paged.engine.parts import Parts
from paged.worker.attention import AttentionMetadata
from paged.worker.attention import prepare_inputs as reference_prepare

S = SequenceStatus


# ------------------------------------------------------------------------ ch07.ex6: the step's inputs
def _step(rng: random.Random, block_size: int, num_chunks: int, num_decodes: int, specials=()):
    """Random (tables, context_lens, query_lens) with chunks first; ``specials``: (index, ctx, query)."""
    tables, contexts, queries = [], [], []
    pool = list(range(200))
    rng.shuffle(pool)
    for s in range(num_chunks + num_decodes):
        if s < num_chunks:
            query = rng.randint(2, 3 * block_size)
            context = query + rng.choice([0, 0, rng.randint(1, 3 * block_size)])
        else:
            query, context = 1, rng.randint(1, 4 * block_size)
        for index, ctx, q in specials:
            if index == s:
                context, query = ctx, q
        need = -(-context // block_size)
        tables.append([pool.pop() for _ in range(need + rng.randint(0, 1))])
        contexts.append(context)
        queries.append(query)
    return tables, contexts, queries


def _by_hand(tables, contexts, queries, block_size, keep, width):
    positions = [p for c, q in zip(contexts, queries) for p in range(c - q, c)]
    slots = [
        t[p // block_size] * block_size + p % block_size
        for t, c, q in zip(tables, contexts, queries)
        for p in range(c - q, c)
    ]
    offsets = [0]
    for q in queries:
        offsets.append(offsets[-1] + q)
    rows = [offsets[s + 1] - 1 for s in keep]
    padded = [t + [0] * (width - len(t)) for t in tables]
    return positions, slots, rows, offsets, padded


def _check_step(impl, tables, contexts, queries, block_size, keep=None, width=None, tokens=None):
    learner = impl("ex07_engine")
    before = copy.deepcopy((tables, contexts, queries, keep))
    host, layout = learner.prepare_inputs(
        tables, contexts, queries, block_size, keep, None, tokens, width
    )
    assert (tables, contexts, queries, keep) == before, "an input list was modified"
    want_host, want_layout = reference_prepare(
        tables, contexts, queries, block_size, keep, None, tokens, width
    )
    assert layout == want_layout, "the layout (offsets and widths in the buffer) is the reference's"
    meta = AttentionMetadata.from_buffer(host, layout)
    width = layout.width
    keep_list = list(range(len(tables))) if keep is None else keep
    positions, slots, rows, offsets, padded = _by_hand(
        tables, contexts, queries, block_size, keep_list, width
    )
    assert meta.positions.tolist() == positions, "positions"
    assert meta.slot_mapping.tolist() == slots, "slot mapping"
    assert meta.keep.tolist() == rows, "sampled rows"
    assert meta.query_start.tolist() == offsets, "query_start"
    assert meta.context_lens.tolist() == contexts, "context_lens"
    assert meta.block_tables.tolist() == padded, "padded block tables"
    assert torch.equal(host, want_host), (
        "the host buffer equals the reference's byte for byte (padding included)"
    )


@pytest.mark.exercise("ch07.ex6", points=1)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_random_steps_match_the_contract(impl, block_size):
    rng = random.Random(block_size)
    for trial in range(25):
        num_chunks, num_decodes = rng.randint(0, 4), rng.randint(0, 5)
        if num_chunks + num_decodes == 0:
            num_decodes = 1
        tables, contexts, queries = _step(rng, block_size, num_chunks, num_decodes)
        n = len(tables)
        keep = sorted(rng.sample(range(n), rng.randint(0, n))) if trial % 3 else None
        width = max(len(t) for t in tables) + rng.choice([0, 2]) if trial % 2 else None
        tokens = [rng.randrange(1000) for _ in range(sum(queries))]
        _check_step(impl, tables, contexts, queries, block_size, keep, width, tokens)


# (context, query): a chunk or decode whose new tokens start or end on a block boundary, a prefix hit
EDGES = {
    "decode opening a new block": (9, 1),
    "decode filling a block's last slot": (8, 1),
    "first decode after a one-token prompt": (2, 1),
    "chunk ending on a block boundary": (8, 8),
    "chunk after a prefix hit of two blocks": (13, 5),
    "chunk starting on a block boundary mid-prompt": (16, 4),
    "whole prompt in one chunk across blocks": (11, 11),
}


@pytest.mark.exercise("ch07.ex6", points=1)
@pytest.mark.parametrize("edge", list(EDGES))
def test_edge_cases_at_every_position_of_a_batch(impl, edge):
    context, query = EDGES[edge]
    rng = random.Random(7)
    for num_chunks, num_decodes in [(3, 3)]:
        first = 0 if query > 1 else num_chunks
        last = num_chunks if query > 1 else num_chunks + num_decodes
        for index in range(first, last):
            tables, contexts, queries = _step(
                rng, 4, num_chunks, num_decodes, [(index, context, query)]
            )
            n = len(tables)
            for keep in (None, [index], [s for s in range(n) if s != index]):
                _check_step(impl, tables, contexts, queries, 4, keep)


@pytest.mark.exercise("ch07.ex6", points=1)
def test_the_slot_mapping_part_given_is_the_one_used(impl):
    learner = impl("ex07_engine")
    calls = []

    def shifted(tables, starts, counts, block_size):
        calls.append((copy.deepcopy(tables), list(starts), list(counts), block_size))
        return [1000 + s for s in reference_slot_mapping(tables, starts, counts, block_size)]

    tables, contexts, queries = [[5, 2, 9], [4, 7], [1]], [10, 6, 3], [4, 1, 1]
    host, layout = learner.prepare_inputs(tables, contexts, queries, 4, [0, 2], shifted)
    meta = AttentionMetadata.from_buffer(host, layout)
    assert calls == [(tables, [6, 5, 2], queries, 4)], "slot_mapping called with the new tokens"
    want = [1000 + s for s in reference_slot_mapping(tables, [6, 5, 2], queries, 4)]
    assert meta.slot_mapping.tolist() == want, (
        "the slots are those the given slot_mapping returns (here shifted by 1000), not recomputed"
    )
    assert meta.keep.tolist() == [3, 5], (
        "queries 4, 1, 1 with rows 0 and 2 kept: the last token of each, rows 3 and 5"
    )


@pytest.mark.exercise("ch07.ex6", points=1)
def test_a_decode_graphs_fixed_width_buffer_with_padding_rows(impl, tiny):
    """The CUDA-graph path (run eagerly on CPU): decodes padded to a captured batch size, tables to a fixed
    width; your packed buffer must be the reference's, byte for byte."""
    from paged.config import EngineConfig, ModelConfig, SchedulerConfig
    from paged.core.scheduler_outputs import ScheduledSeq
    from paged.worker.kv_cache import KVCache
    from paged.worker.model_runner import ModelRunner
    from paged.worker.worker import kv_shape

    learner = impl("ex07_engine")
    layers, kv_heads, head_dim = kv_shape(tiny)
    hosts = []
    for parts in (Parts(), Parts(prepare_inputs=learner.prepare_inputs)):
        kv = KVCache(layers, 17, 4, kv_heads, head_dim)
        config = EngineConfig(
            ModelConfig(cuda_graphs=True),
            scheduler=SchedulerConfig(max_num_seqs=4, max_model_len=32),
        )
        runner = ModelRunner(tiny, kv, parts, config)
        seqs = [Sequence(i, [1 + i + j for j in range(5 + 3 * i)], 4) for i in range(3)]
        scheduled = [
            ScheduledSeq(s, len(s) - 1, 1, [(3 * i + j) % 16 for j in range(-(-len(s) // 4))], True)
            for i, s in enumerate(seqs)
        ]
        batch = runner.prepare(scheduled)
        assert batch.graph is not None and batch.graph.size == 4, (
            "set-up: 3 decodes that each sample take the graph path, padded to the captured size 4"
        )
        hosts.append(batch.host)
    assert torch.equal(hosts[1], hosts[0]), "the padded decode buffer differs from the reference's"


# ------------------------------------------------------------------------ ch07.ex7: one token's update
def _seq(prompt_len=5, max_tokens=4, stop=(), ignore_eos=True, eos=()):
    seq = Sequence(0, list(range(10, 10 + prompt_len)), 4)
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=list(stop), ignore_eos=ignore_eos)
    group = SequenceGroup("r", [seq], params)
    group.stop_token_ids |= frozenset(eos)
    seq.status = S.RUNNING
    return seq


def _feed(impl, seq, tokens, max_model_len=100):
    learner = impl("ex07_engine")
    statuses = []
    for token in tokens:
        learner.update_sequence(seq, token, max_model_len)
        statuses.append(seq.status)
    return statuses


@pytest.mark.exercise("ch07.ex7", points=1)
def test_stops_at_exactly_max_tokens(impl):
    for max_tokens in (1, 2, 5):
        seq = _seq(max_tokens=max_tokens)
        statuses = _feed(impl, seq, [50 + i for i in range(max_tokens)])
        assert statuses == [S.RUNNING] * (max_tokens - 1) + [S.FINISHED_LENGTH], (
            f"max_tokens {max_tokens}: running until output token {max_tokens}, which finishes it"
        )
        assert seq.output_token_ids == [50 + i for i in range(max_tokens)], (
            f"max_tokens {max_tokens}: every fed token is appended, the last one included"
        )
        assert seq.num_computed_tokens == 0, "update_sequence changes only the tokens and status"


@pytest.mark.exercise("ch07.ex7", points=1)
def test_stops_at_exactly_max_model_len(impl):
    for prompt_len in (3, 7):
        seq = _seq(prompt_len=prompt_len, max_tokens=50)
        statuses = _feed(impl, seq, [60, 61, 62, 63], max_model_len=prompt_len + 3)
        assert statuses[:3] == [S.RUNNING, S.RUNNING, S.FINISHED_LENGTH], (
            f"prompt {prompt_len}, max_model_len {prompt_len + 3}: the 3rd output token reaches it "
            "and finishes the sequence (length)"
        )
        # nobody feeds a finished sequence; we did, to see
        assert len(seq) == prompt_len + 3 + 1, "update_sequence appends every token it is given"


@pytest.mark.exercise("ch07.ex7", points=2)
def test_stop_tokens_and_eos_are_appended_and_win_over_length(impl):
    for where in range(3):
        seq = _seq(max_tokens=3, stop=[7], eos=[2])
        tokens = [50, 51, 52][:where] + [7]
        statuses = _feed(impl, seq, tokens)
        assert statuses[-1] is S.FINISHED_STOPPED, f"stop token as output token {where + 1}"
        assert seq.output_token_ids == tokens, "the stop token is part of the output"
        seq = _seq(max_tokens=3, stop=[7], eos=[2])
        tokens = [50, 51, 52][:where] + [2]
        assert _feed(impl, seq, tokens)[-1] is S.FINISHED_STOPPED, "EOS (in group.stop_token_ids)"
    seq = _seq(prompt_len=5, max_tokens=9, stop=[7])
    assert _feed(impl, seq, [50, 7], max_model_len=7)[-1] is S.FINISHED_STOPPED, (
        "a stop token that also reaches max_model_len (5 + 2 = 7) ends as stopped: the stop is checked first"
    )
    seq = _seq(max_tokens=3)
    assert _feed(impl, seq, [7, 2, 7]) == [S.RUNNING, S.RUNNING, S.FINISHED_LENGTH], (
        "tokens that are not the request's stop tokens do not stop it"
    )


# ------------------------------------------------------------------------ ch07.ex8: the step's update
def _scheduler(update, num_gpu_blocks, max_model_len=64):
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, max_model_len=max_model_len)
    cc = CacheConfig(block_size=4, num_gpu_blocks=num_gpu_blocks, enable_prefix_caching=True)
    return Scheduler(sc, cc, None, update)


def _requests(rng: random.Random, count: int, max_model_len: int):
    out = []
    for r in range(count):
        prompt = [1, 2, 3, 4, 5] * (r % 2) + [
            rng.randrange(6, 60) for _ in range(rng.randint(1, 11))
        ]
        if r == 3:
            prompt = list(range(max_model_len + 2))  # over max_model_len: ignored
        params = SamplingParams(
            n=(1, 2, 3)[r % 3], max_tokens=rng.randint(1, 9), stop_token_ids=[5] if r % 4 else []
        )
        out.append((str(r), prompt, params))
    return out


def _state(scheduler):
    groups = {**scheduler._requests}
    seqs = [s for q in (scheduler.waiting, scheduler.running, scheduler.swapped) for s in q]
    return (
        sorted(groups),
        sorted((s.seq_id, tuple(s.token_ids), s.status.value, s.num_computed_tokens) for s in seqs),
        scheduler.block_manager.get_num_free_gpu_blocks(),
        {i: list(t) for i, t in scheduler.block_manager.block_tables.items()},
    )


def _lockstep(impl, seed, num_gpu_blocks, max_model_len=40):
    learner = impl("ex07_engine")
    rng, tokens_rng = random.Random(seed), random.Random(seed + 1)
    ours, theirs = (
        _scheduler(learner.update_from_output, num_gpu_blocks, max_model_len),
        _scheduler(reference_update, num_gpu_blocks, max_model_len),
    )
    requests = _requests(rng, 8, max_model_len)
    pending = {}
    for scheduler in (ours, theirs):
        for rid, prompt, params in requests:
            seq = Sequence(next(scheduler.seq_ids), list(prompt), 4)
            scheduler.add_request(SequenceGroup(rid, [seq], params))
            pending.setdefault(id(scheduler), {})[rid] = None
    reported = {id(ours): [], id(theirs): []}
    for step in range(200):
        if not theirs.has_unfinished_requests():
            break
        sampled_by = {}
        results = []
        for scheduler in (theirs, ours):
            out = scheduler.schedule()
            if scheduler is theirs:
                sampled = {}
                for entry in out.scheduled:
                    if entry.samples_next_token:
                        k = entry.seq.group.sampling_params.n - len(entry.seq.group.seqs) + 1
                        sampled[entry.seq.seq_id] = [tokens_rng.randrange(3, 12) for _ in range(k)]
                sampled_by = sampled
            before = copy.deepcopy(sampled_by)
            result = scheduler.update_from_output(out, sampled_by)
            assert sampled_by == before, "the sampled tokens were modified"
            results.append(result)
            reported[id(scheduler)] += [g.request_id for g in result.finished]
        want, got = results
        assert [g.request_id for g in got.finished] == [g.request_id for g in want.finished], (
            f"step {step}: finished requests reported"
        )
        assert [s.seq_id for s in got.sampled] == [s.seq_id for s in want.sampled], (
            f"step {step}: sequences that got a token"
        )
        assert _state(ours) == _state(theirs), f"step {step}: sequences, blocks or queues differ"
    assert not ours.has_unfinished_requests(), (
        "the reference scheduler has finished every request: yours must have none unfinished either"
    )
    assert sorted(reported[id(ours)]) == sorted(r for r, _, _ in requests), (
        "every request reported once"
    )
    assert ours.block_manager.get_num_free_gpu_blocks() == num_gpu_blocks, (
        f"every request finished: all {num_gpu_blocks} blocks must be free, "
        f"{ours.block_manager.get_num_free_gpu_blocks()} are"
    )
    return ours


@pytest.mark.exercise("ch07.ex8", points=1, uses=("ch07.ex7",))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_scheduler_on_your_update_runs_like_the_reference(impl, seed):
    _lockstep(impl, seed, num_gpu_blocks=64)


@pytest.mark.exercise("ch07.ex8", points=2, uses=("ch07.ex7",))
def test_under_preemption_and_exhaustion(impl):
    _lockstep(impl, 5, num_gpu_blocks=9, max_model_len=30)


@pytest.mark.exercise("ch07.ex8", points=1, uses=("ch07.ex7",))
@pytest.mark.parametrize("position", [0, 1, 2])
def test_parallel_samples_fork_from_the_parent_before_its_token(impl, position):
    learner = impl("ex07_engine")
    scheduler = _scheduler(learner.update_from_output, 32)
    prompts = [[20, 21, 22, 23, 24, 25], [30, 31, 32], [40, 41, 42, 43, 44]]
    for r, prompt in enumerate(prompts):
        params = SamplingParams(n=3 if r == position else 1, max_tokens=4, ignore_eos=True)
        seq = Sequence(next(scheduler.seq_ids), prompt, 4)
        scheduler.add_request(SequenceGroup(str(r), [seq], params))
    out = scheduler.schedule()
    free = scheduler.block_manager.get_num_free_gpu_blocks()
    sampled = {
        e.seq.seq_id: ([7, 8, 9] if int(e.seq.group.request_id) == position else [6])
        for e in out.scheduled
    }
    result = scheduler.update_from_output(out, sampled)
    group = next(e.seq.group for e in out.scheduled if e.seq.group.request_id == str(position))
    parent = group.seqs[0]
    assert len(group.seqs) == 3, "n=3: the parent and two children in group.seqs"
    assert [s.output_token_ids for s in group.seqs] == [[7], [8], [9]], (
        f"request {position} (n=3) sampled [7, 8, 9]: the parent keeps 7, its children get 8 and 9"
    )
    assert all(s.prompt_token_ids == prompts[position] for s in group.seqs), (
        f"a child is a fork of its parent: every sequence of request {position} has the prompt "
        f"{prompts[position]}"
    )
    children = group.seqs[1:]
    assert len({s.seq_id for s in scheduler.running}) == len(scheduler.running) == 5, (
        f"3 requests, request {position} with n=3: 5 sequences of distinct ids must run, got ids "
        f"{[s.seq_id for s in scheduler.running]}"
    )
    assert all(c in scheduler.running and c.status is S.RUNNING for c in children), (
        "each child is added to scheduler.running with status RUNNING (scheduler.fork_seq)"
    )
    table = scheduler.block_manager.block_tables
    assert all(list(table[c.seq_id]) == list(table[parent.seq_id]) for c in children), (
        "each child's block table is its parent's (shared blocks)"
    )
    assert scheduler.block_manager.get_num_free_gpu_blocks() == free, "a fork allocates nothing"
    assert result.finished == [], (
        f"max_tokens=4, one token each: no request finishes this step, got "
        f"{[g.request_id for g in result.finished]}"
    )
    assert parent in result.sampled and all(c in result.sampled for c in children), (
        f"request {position}'s parent and both children got a token: all three are in result.sampled"
    )
    sampled_ids = [s.seq_id for s in result.sampled]
    assert sampled_ids.index(children[1].seq_id) < sampled_ids.index(parent.seq_id), (
        f"the children fork (and get their tokens) before the parent's own token: in result.sampled "
        f"{sampled_ids} child {children[1].seq_id} must come before parent {parent.seq_id}"
    )


@pytest.mark.exercise("ch07.ex8", points=1, uses=("ch07.ex7",))
def test_finished_sequences_free_their_blocks_at_once(impl):
    learner = impl("ex07_engine")
    scheduler = _scheduler(learner.update_from_output, 16, max_model_len=12)
    for r, max_tokens in enumerate([1, 5, 1]):
        seq = Sequence(next(scheduler.seq_ids), [10 + r] * 6, 4)
        scheduler.add_request(SequenceGroup(str(r), [seq], SamplingParams(max_tokens=max_tokens)))
    ignored = Sequence(next(scheduler.seq_ids), list(range(13)), 4)
    scheduler.add_request(SequenceGroup("long", [ignored], SamplingParams()))
    out = scheduler.schedule()
    result = scheduler.update_from_output(out, {e.seq.seq_id: [3] for e in out.scheduled})
    assert [g.request_id for g in result.finished] == ["long", "0", "2"], (
        "finished, in order: the ignored 'long' (13 tokens over max_model_len 12), then requests 0 "
        "and 2 (max_tokens=1)"
    )
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 16 - 2, "only request 1's 2 blocks"
    assert [s.group.request_id for s in scheduler.running] == ["1"], (
        "finished sequences leave scheduler.running at once: only request 1 (max_tokens=5) still runs"
    )


# ------------------------------------------------------------------------ the engine on your parts
@pytest.fixture(scope="module")
def tiny():
    from paged_course.reference.models import tiny_model

    return tiny_model("llama", vocab_size=128)


def _serve(model, parts, prompts, params):
    llm = LLM(
        model,
        block_size=4,
        num_gpu_blocks=40,
        max_num_batched_tokens=16,
        max_num_seqs=6,
        max_model_len=24,
        enable_prefix_caching=True,
        parts=parts,
        verbose=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", MaxModelLenWarning
        )  # request 1 stops at max_model_len on purpose
        outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["kv_blocks_used"] == 0, (
        f"every request finished: all 40 KV blocks must be free, {llm.stats()['kv_blocks_used']} "
        "still used"
    )
    return [[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs]


def _engine_workload():
    shared = [11, 12, 13, 14, 15, 16, 17, 18]
    prompts = [shared + [20 + i] * (i + 1) for i in range(4)] + [[90, 91, 92]]
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True),
        SamplingParams(max_tokens=30, ignore_eos=True),  # stops at max_model_len
        SamplingParams(max_tokens=8, n=2, temperature=0.9, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=1.0, seed=4, stop_token_ids=[]),
        SamplingParams(max_tokens=8, ignore_eos=True),
    ]
    return prompts, params


@pytest.mark.timeout(120)
@pytest.mark.exercise("ch07.ex8", points=2, uses=("ch07.ex6", "ch07.ex7"))
def test_the_engine_on_your_inputs_and_update_gives_the_reference_tokens(impl, tiny):
    learner = impl("ex07_engine")
    prompts, params = _engine_workload()
    want = _serve(tiny, None, prompts, params)
    mine = Parts(prepare_inputs=learner.prepare_inputs, update=learner.update_from_output)
    assert _serve(tiny, mine, prompts, params) == want, (
        "the engine on your prepare_inputs and update_from_output must give the reference parts' "
        "(tokens, finish reason) for each of the 5 requests"
    )
    assert any(r == "length" and len(t) < 30 for t, r in want[1]), "max_model_len reached"


# ------------------------------------------------------------------------ chapter 04's kernel as a part
@pytest.mark.triton
@pytest.mark.timeout(300)
@pytest.mark.exercise("ch04.ex2", points=1)
def test_your_triton_kernel_serves_the_engine_as_its_decode_part(impl, tiny):
    """Chapter 04's kernel (``paged_decode`` of your ex04 file; Triton's interpreter on CPU) as the engine's
    ``decode_attention``: 2 requests of 5 greedy tokens give the reference parts' tokens (the 4 x 16 run is
    ``tests/unit/test_triton_decode_part.py``, marked slow)."""
    from paged import kernels

    if not kernels.HAS_TRITON:
        pytest.skip(kernels.REASON)
    ex04 = impl("ex04_online_softmax")
    prompts = [[11, 12, 13, 14, 15], [70, 71, 72]]  # the second crosses a block boundary
    params = [SamplingParams(max_tokens=5, ignore_eos=True)] * 2

    def serve(parts):
        llm = LLM(tiny, block_size=4, num_gpu_blocks=40, parts=parts, verbose=False)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    want = serve(None)
    assert serve(Parts(decode_attention=ex04.paged_decode)) == want, (
        "your paged_decode as the engine's decode_attention: 2 greedy requests of 5 tokens must give "
        "the reference parts' tokens"
    )
