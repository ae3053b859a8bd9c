"""The engine end to end on tiny transformers models: greedy tokens equal transformers' ``generate``
(Llama, Qwen2, Mistral, GPT-2; prefix caching on and off; preemption by recompute and by swap),
hash collisions, chained block keys, copy-on-write of a shared partial block, a fully cached prompt,
mixed hit/miss batches and a swapped-out request coming back, parallel sampling, stop conditions, bad
input, and no block left in use.

Comparison as vLLM's tests do (``tests/engine/tiny.py``): tokens equal, or the first differing position is a
near-tie of the two tokens' logits under a plain forward pass.
"""

from __future__ import annotations

import copy

import pytest
import torch

from paged.core.block_manager import BlockSpaceManager
from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged.engine.llm_engine import MaxModelLenWarning
from paged.worker.attention import use_attention
from tests.engine.tiny import greedy_agreement, tiny_model

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def _prompts(vocab=120, seed=0):
    """Six prompts of 3-21 tokens; four share an 8-token prefix (two full blocks of 4)."""
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(1, vocab, (8,), generator=gen).tolist()
    tails = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (5, 13, 1, 2)]
    alone = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (3, 17)]
    return [shared + t for t in tails] + alone


@torch.inference_mode()
def _reference(model, prompts, max_tokens):
    use_attention(model, "sdpa")
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        outs.append(out[0, len(p) :].tolist())
    return outs


def _assert_agree(ref_model, prompts, got, want, what):
    use_attention(ref_model, "sdpa")
    for p, a, b in zip(prompts, got, want):
        result = greedy_agreement(ref_model, p, a, b)
        assert result.ok, (
            f"{what}: prompt {p} gave {a}, transformers {b}; first divergence at "
            f"{result.position} with logit gap {result.gap} (not a near-tie)"
        )


def _no_block_in_use(llm):
    stats = llm.stats()
    assert stats["kv_blocks_used"] == 0, (
        f"{stats['kv_blocks_used']} blocks still in use after generate"
    )
    bm = llm.engine.scheduler.block_manager
    assert bm.get_num_free_cpu_blocks() == bm.num_cpu_blocks, (
        "CPU swap blocks still in use after generate"
    )


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral", "gpt2"])
def arch_models(request):
    model = tiny_model(request.param)
    ref = copy.deepcopy(
        model
    )  # the config trap: never share the config object with the engine's model
    prompts = _prompts()
    return request.param, model, ref, prompts, _reference(ref, prompts, GREEDY.max_tokens)


@pytest.mark.parametrize("mode", ["prefix_on", "prefix_off", "recompute", "swap"])
def test_greedy_equals_transformers(arch_models, mode):
    arch, model, ref, prompts, want = arch_models
    kwargs = dict(block_size=4, num_gpu_blocks=64, enable_prefix_caching=mode != "prefix_off")
    if mode in ("recompute", "swap"):  # 14 blocks of 4 slots for six sequences of up to 31 tokens
        kwargs.update(
            num_gpu_blocks=14, preemption_mode=mode, num_cpu_blocks=32 if mode == "swap" else 0
        )
    llm = LLM(model, verbose=False, **kwargs)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    assert all(
        o.outputs[0].finish_reason == "length" and len(o.outputs[0].token_ids) == 10 for o in outs
    )
    _assert_agree(ref, prompts, got, want, f"{arch} {mode}")
    stats = llm.stats()
    if mode in ("recompute", "swap"):
        assert stats["preemptions"] > 0, (
            f"{mode}: the small pool should force preemption, stats {stats}"
        )
    if mode == "swap":
        assert stats["swap_outs"] > 0 and stats["swap_ins"] > 0, f"swap mode never swapped: {stats}"
    if mode == "prefix_on":
        assert stats["prefix_cache_hit_rate"] > 0, (
            "four prompts share two full blocks: expected hits"
        )
    _no_block_in_use(llm)


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama", vocab_size=256)
    return model, copy.deepcopy(model)


def _run(model, prompts, params=GREEDY, **kwargs):
    kwargs = {"block_size": 4, "num_gpu_blocks": 8, "verbose": False, **kwargs}
    llm = LLM(model, **kwargs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    _no_block_in_use(llm)
    return llm, outs


def test_case1_hash_collision_no_false_hit(llama):
    model, _ = llama
    weak = lambda parent, tokens, extra=None: (parent * 7 + sum(tokens)) % 5  # noqa: E731
    llm = LLM(model, block_size=4, num_gpu_blocks=8, verbose=False)
    llm.engine.scheduler.block_manager = BlockSpaceManager(
        4, 8, 0, watermark=0.01, enable_prefix_caching=True, hash_fn=weak
    )
    first, second = llm.generate([[1, 2, 3, 4, 9]], GREEDY, use_tqdm=False)[0], None
    second = llm.generate([[4, 3, 2, 1, 9]], GREEDY, use_tqdm=False)[0]
    assert weak(0, (1, 2, 3, 4)) == weak(0, (4, 3, 2, 1)), "the test needs colliding keys"
    assert second.num_cached_tokens == 0, "a hash collision must not give a false prefix-cache hit"
    _, off = _run(model, [[4, 3, 2, 1, 9]], enable_prefix_caching=False)
    assert second.outputs[0].token_ids == off[0].outputs[0].token_ids, (
        "output must equal a caching-off run"
    )
    assert first.outputs[0].token_ids != [], "first request ran"


def test_case2_keys_chain_their_parent(llama):
    model, _ = llama
    llm = LLM(model, block_size=4, num_gpu_blocks=8, verbose=False)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    llm.generate([list(range(1, 9))], params, use_tqdm=False)
    other_parent = llm.generate([[9, 9, 9, 9, 5, 6, 7, 8]], params, use_tqdm=False)[0]
    assert other_parent.num_cached_tokens == 0, "block [5,6,7,8] under another parent must not hit"
    repeat = llm.generate([[1, 2, 3, 4, 1, 2, 3, 4]], params, use_tqdm=False)[0]
    assert repeat.num_cached_tokens == 4, "only the first block [1,2,3,4] (root parent) may hit"
    _no_block_in_use(llm)


def test_case3_partial_tail_copy_on_write(llama):
    model, ref = llama
    llm = LLM(model, block_size=4, num_gpu_blocks=8, verbose=False)
    engine = llm.engine
    engine.add_request(
        list(range(10, 16)), SamplingParams(n=2, temperature=1.0, max_tokens=3, ignore_eos=True)
    )
    real_sample = engine.sampler.sample
    engine.sampler.sample = lambda logits, params, gens=None: [
        100,
        200,
    ]  # force the two children apart
    engine.step()  # prefill [10..15], sample 100 and 200, fork
    engine.sampler.sample = real_sample
    bm = engine.scheduler.block_manager
    seqs = engine.scheduler.running[0].group.seqs
    tables = [bm.get_block_table(s) for s in seqs]
    assert [s.output_token_ids for s in seqs] == [[100], [200]]
    assert tables[0] == tables[1], "after the fork the children share both blocks"
    assert bm.gpu_allocator.ref_count(tables[0][0]) == 2, "the full block is shared (ref count 2)"
    captured = {}
    real_forward = engine.runner.forward

    def spy(batch):
        captured["logits"] = real_forward(batch)
        assert [e.seq for e in batch.sampling] == seqs, "rows are the children in order"
        return captured["logits"]

    engine.runner.forward = spy
    engine.step()  # decode 100 and 200: copy-on-write of the shared partial tail
    tables = [bm.get_block_table(s) for s in seqs]
    assert tables[0][0] == tables[1][0] and tables[0][1] != tables[1][1], (
        f"tails must differ after the first decode step, tables {tables}"
    )
    use_attention(ref, "sdpa")
    with torch.inference_mode():
        for row, token in enumerate((100, 200)):
            alone = ref(torch.tensor([list(range(10, 16)) + [token]])).logits[0, -1]
            torch.testing.assert_close(
                captured["logits"][row],
                alone,
                atol=1e-4,
                rtol=1e-4,
                msg=f"child {token}: logits differ from its own sequence run alone",
            )
    while engine.has_unfinished_requests():
        engine.step()
    assert all(bm.gpu_allocator.ref_count(b) == 0 for b in range(8)), (
        "every ref count must return to 0"
    )


def test_case4_fully_cached_prompt_computes_last_token(llama):
    model, _ = llama
    llm = LLM(model, block_size=4, num_gpu_blocks=8, verbose=False)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    first = llm.generate([list(range(1, 9))], params, use_tqdm=False)[0]
    again = llm.generate([list(range(1, 9))], params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 4, (
        "8-token prompt, bs 4: only block 0 may come from cache (last token computed)"
    )
    assert again.outputs[0].token_ids == first.outputs[0].token_ids, (
        "a cached run must give the same 3 tokens"
    )
    control = llm.generate([list(range(1, 8))], params, use_tqdm=False)[0]
    assert control.num_cached_tokens == 4, "7-token control: block 0 hits"
    _no_block_in_use(llm)


def test_case9_mixed_hit_and_miss_batch(llama):
    model, _ = llama
    llm = LLM(model, block_size=4, num_gpu_blocks=16, verbose=False)
    llm.generate([list(range(1, 9))], GREEDY, use_tqdm=False)
    prompts = [list(range(1, 11)), list(range(30, 35))]
    hit, miss = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert (hit.num_cached_tokens, miss.num_cached_tokens) == (8, 0), (
        "2 blocks hit, 0 for the other"
    )
    _, off = _run(model, prompts, num_gpu_blocks=16, enable_prefix_caching=False)
    alone = [_run(model, [p], num_gpu_blocks=16)[1][0] for p in prompts]
    for o, f, a in zip((hit, miss), off, alone):
        assert o.outputs[0].token_ids == f.outputs[0].token_ids == a.outputs[0].token_ids, (
            "each request of a mixed batch must keep its own block table"
        )
    _no_block_in_use(llm)


def test_case10_swapped_out_sequence_comes_back(llama):
    model, _ = llama
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [list(range(40, 47)), list(range(60, 67))]
    llm, outs = _run(
        model,
        prompts,
        params,
        num_gpu_blocks=4,
        num_cpu_blocks=4,
        preemption_mode="swap",
        watermark=0.0,
    )
    stats = llm.stats()
    assert stats["swap_outs"] >= 1 and stats["swap_ins"] >= 1, f"growth must force a swap: {stats}"
    for p, o in zip(prompts, outs):
        solo = _run(model, [p], params, num_gpu_blocks=4)[1][0]
        assert o.outputs[0].token_ids == solo.outputs[0].token_ids, (
            "a swapped sequence must match its solo run"
        )
    sched = llm.engine.scheduler
    assert not (sched.waiting or sched.running or sched.swapped), "queues must be empty at the end"


def test_parallel_sampling_greedy_n3_identical(llama):
    model, _ = llama
    llm, (out,) = _run(
        model,
        [[5, 6, 7, 8, 9, 10]],
        SamplingParams(n=3, max_tokens=7, ignore_eos=True),
        num_gpu_blocks=16,
    )
    tokens = [c.token_ids for c in out.outputs]
    assert len(tokens) == 3 and tokens[0] == tokens[1] == tokens[2] and len(tokens[0]) == 7, tokens
    assert llm.stats()["cow_copies"] >= 2, (
        "two children writing into the shared tail need copy-on-write"
    )


def test_parallel_sampling_random_children_differ_and_reproduce(llama):
    model, _ = llama
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=7, ignore_eos=True)
    _, (a,) = _run(model, [[5, 6, 7]], params, num_gpu_blocks=32)
    other = SamplingParams(temperature=1.0, max_tokens=5)
    _, (_, b) = _run(model, [[1, 2], [5, 6, 7]], [other, params], num_gpu_blocks=32)
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1, "random children should differ"
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs], (
        "a seeded request must reproduce whatever else is in the batch"
    )


def test_stop_token_and_eos(llama):
    model, _ = llama
    _, (free,) = _run(model, [[3, 1, 4, 1, 5]], num_gpu_blocks=16)
    stop = free.outputs[0].token_ids[3]
    first = free.outputs[0].token_ids.index(stop)
    _, (stopped,) = _run(
        model,
        [[3, 1, 4, 1, 5]],
        SamplingParams(max_tokens=10, stop_token_ids=[stop]),
        num_gpu_blocks=16,
    )
    assert stopped.outputs[0].token_ids == free.outputs[0].token_ids[: first + 1]
    assert stopped.outputs[0].finish_reason == "stop"
    llm = LLM(model, block_size=4, num_gpu_blocks=16, verbose=False)
    llm.engine.eos_token_ids = {stop}
    (eos,) = llm.generate([[3, 1, 4, 1, 5]], SamplingParams(max_tokens=10), use_tqdm=False)
    assert eos.outputs[0].finish_reason == "stop" and eos.outputs[0].token_ids[-1] == stop
    (ignored,) = llm.generate(
        [[3, 1, 4, 1, 5]], SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False
    )
    assert ignored.outputs[0].token_ids == free.outputs[0].token_ids, (
        "ignore_eos runs to max_tokens"
    )


def test_max_model_len_ends_sequences_and_says_so_once(llama):
    model, _ = llama
    with pytest.warns(MaxModelLenWarning) as caught:
        _, outs = _run(
            model,
            [[1, 2, 3, 4, 5, 6], [7, 8, 9]],
            SamplingParams(max_tokens=50, ignore_eos=True),
            num_gpu_blocks=16,
            max_model_len=10,
        )
    said = [str(w.message) for w in caught if w.category is MaxModelLenWarning]
    assert said == [
        "request '0': its prompt of 6 tokens plus max_tokens=50 exceed max_model_len=10: it stops at 10 "
        "tokens with finish_reason 'length' (raise max_model_len, up to the model's positions, or lower "
        "max_tokens; said once per engine)"
    ], said
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 7], (
        "a 6-token and a 3-token prompt with max_model_len 10 stop after 4 and 7 tokens"
    )
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_no_max_model_len_warning_when_every_request_fits(llama, recwarn):
    model, _ = llama
    _run(model, [[1, 2, 3]], SamplingParams(max_tokens=7, ignore_eos=True), max_model_len=10)
    assert not [w for w in recwarn if w.category is MaxModelLenWarning], "3 + 7 tokens fit in 10"


@pytest.mark.filterwarnings(
    "ignore::paged.engine.llm.IgnoredRequestWarning"
)  # the warnings: test_errors.py
def test_bad_requests_finish_ignored_others_complete(llama):
    model, _ = llama
    prompts = [[], list(range(1, 30)), [1, 2, 3], [5, 999], [7, 8]]
    llm, outs = _run(model, prompts, num_gpu_blocks=6, max_model_len=20)
    reasons = [o.outputs[0].finish_reason for o in outs]
    assert reasons == ["ignored", "ignored", "length", "ignored", "length"], reasons
    assert "empty" in outs[0].outputs[0].finish_message
    assert "max_model_len=20" in outs[1].outputs[0].finish_message
    assert "999" in outs[3].outputs[0].finish_message
    assert len(outs[2].outputs[0].token_ids) == 10 and len(outs[4].outputs[0].token_ids) == 10
    _, (big,) = _run(model, [list(range(1, 19))], num_gpu_blocks=4, max_model_len=64)
    assert (
        big.outputs[0].finish_reason == "ignored" and "blocks" in big.outputs[0].finish_message
    ), "a prompt larger than the whole cache is rejected with its reason"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n must"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_unknown_model_and_mismatched_params(llama):
    with pytest.raises(ValueError, match="model folder .* does not exist"):
        LLM("./no/such/model-folder", verbose=False)
    with pytest.raises(ValueError, match="exceeds the model's 512 positions"):
        LLM(llama[0], num_gpu_blocks=8, max_model_len=1000, verbose=False)
    llm = LLM(llama[0], block_size=4, num_gpu_blocks=8, verbose=False)
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate([[1, 2]], [GREEDY, GREEDY], use_tqdm=False)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("text without a tokenizer", use_tqdm=False)


def test_abort_request_frees_blocks(llama):
    model, _ = llama
    llm = LLM(model, block_size=4, num_gpu_blocks=16, verbose=False)
    engine = llm.engine
    a = engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=20, ignore_eos=True))
    engine.add_request([6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    assert engine.abort_request(a) is True and engine.abort_request(a) is False
    finished = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    assert [len(o.outputs[0].token_ids) for o in finished] == [3], "the other request completes"
    _no_block_in_use(llm)
