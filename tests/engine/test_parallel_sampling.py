"""Parallel sampling when blocks are short: all n samples finish in full, siblings never crowd each other
into ``kv_cache_exhausted``, no block leaks, and greedy children equal the n = 1 output."""

from __future__ import annotations

import pytest

from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM, IgnoredRequestWarning
from tests.engine.tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab_size=128)


@pytest.mark.parametrize("mode, cpu", [("recompute", 0), ("swap", 32)])
def test_n_children_that_cannot_all_fit_at_once_still_finish_in_full(model, mode, cpu):
    # bs 4, 10 blocks: one sequence of 6 + 24 tokens needs 8 blocks; four of them can never hold the pool
    # together (about 4 x 7 = 28 blocks), so the children must take turns
    llm = LLM(
        model,
        block_size=4,
        num_gpu_blocks=10,
        num_cpu_blocks=cpu,
        preemption_mode=mode,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        verbose=False,
    )
    prompt = [5, 6, 7, 8, 9, 10]
    (alone,) = llm.generate(
        [prompt], SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False
    )
    (out,) = llm.generate(
        [prompt], SamplingParams(n=4, max_tokens=24, ignore_eos=True), use_tqdm=False
    )
    assert [c.finish_reason for c in out.outputs] == ["length"] * 4, [
        c.finish_message for c in out.outputs
    ]
    assert all(c.token_ids == alone.outputs[0].token_ids for c in out.outputs), (
        "greedy children = the n=1 output"
    )
    stats = llm.stats()
    assert stats["preemptions"] > 0, (
        "the pool is too small for four children at once: some must wait"
    )
    assert stats["kv_blocks_used"] == 0, "every block is back in the pool"
    assert llm.engine.scheduler.block_manager.get_num_free_cpu_blocks() == cpu, (
        "every CPU block is back"
    )


def test_exhausted_means_one_sequence_alone_cannot_fit(model):
    llm = LLM(
        model,
        block_size=4,
        num_gpu_blocks=4,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        verbose=False,
    )
    with pytest.warns(IgnoredRequestWarning, match="KV cache exhausted"):
        (out,) = llm.generate(
            [[1, 2, 3]], SamplingParams(n=2, max_tokens=20, ignore_eos=True), use_tqdm=False
        )
    # 3 + 20 tokens need 6 blocks: one child alone cannot fit in 4, whatever its sibling does
    assert [c.finish_reason for c in out.outputs] == ["kv_cache_exhausted"] * 2
    assert all(len(c.token_ids) == 14 for c in out.outputs), (
        "each grows until it alone holds the 16 slots"
    )
    assert "alone already holds the whole cache of 4 blocks" in out.outputs[0].finish_message
    assert llm.stats()["kv_blocks_used"] == 0
