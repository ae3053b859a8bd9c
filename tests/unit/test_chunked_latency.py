"""The course's chunked-prefill latency study (``paged_course.bench.latency``): its workload, the simulated
budget sweep and the engine run behind chapter 07's latency figure. The engine's own chunked-prefill tests
are ``tests/engine/test_chunked_prefill.py``."""

from __future__ import annotations

import math

import pytest

from paged_course.reference.models import tiny_model


@pytest.fixture(scope="module")
def llama():
    """The tiny Llama (the engine run needs one model; the pair mirrors the engine tests' fixture)."""
    return tiny_model("llama"), None


def test_latency_workload_is_seeded_and_spreads_the_long_prompts():
    from paged_course.bench.latency import latency_workload

    work = latency_workload(
        num_short=4, num_long=3, short_output=(20, 30), long_prompt=(1000, 1010), seed=3
    )
    assert work == latency_workload(
        num_short=4, num_long=3, short_output=(20, 30), long_prompt=(1000, 1010), seed=3
    )
    shorts, longs = [r for r in work if not r.long], [r for r in work if r.long]
    assert len(shorts) == 4 and all(
        r.arrival_tokens == 0 and 20 <= r.max_tokens <= 30 for r in shorts
    )
    assert [r.arrival_tokens for r in longs] == [20, 40, 60], "every 4 x 20 // 4 generated tokens"
    assert all(1000 <= len(r.prompt) <= 1010 and min(r.prompt) >= 2 for r in longs)
    with pytest.raises(ValueError, match="long_prompt must be a range"):
        latency_workload(long_prompt=(10, 5))


def test_simulated_budget_sweep_bounds_the_inter_token_latency():
    """The cost model's numbers (no clock): a 256-token budget bounds the p99 ITL of decodes that run beside
    1,000-token prompts, at the same throughput; a 64-token budget costs throughput (more steps)."""
    from paged_course.bench.latency import latency_workload, simulate_budgets
    from paged_course.sim.scheduling import CostModel

    work = latency_workload(
        num_short=6, num_long=2, short_output=(32, 40), long_prompt=(1000, 1050)
    )
    rows = {r["budget"]: r for r in simulate_budgets(work, budgets=(64, 256, None))}
    cost = CostModel()
    assert rows[256]["max_step_tokens"] <= 256 and rows[None]["max_step_tokens"] > 1000
    assert rows[256]["itl_p99"] == pytest.approx(cost.step_seconds(256)), (
        "the p99 gap is a full-budget step"
    )
    assert rows[None]["itl_p99"] > 2.5 * rows[256]["itl_p99"]
    assert rows[256]["tok_s"] == pytest.approx(rows[None]["tok_s"], rel=0.01)
    assert rows[64]["tok_s"] < 0.9 * rows[None]["tok_s"]
    assert rows[None]["ttft_p99"] < rows[256]["ttft_p99"] < rows[64]["ttft_p99"], (
        "long prompts start later"
    )


def test_engine_latency_run_gives_the_same_tokens_with_and_without_chunks(llama):
    import matplotlib.pyplot as plt

    from paged_course.bench.latency import compare_engine, latency_workload, simulate_budgets
    from paged_course.viz.latency import plot_latency

    model, _ = llama
    work = latency_workload(
        num_short=3,
        num_long=2,
        short_prompt=(4, 8),
        short_output=(12, 16),
        long_prompt=(40, 60),
        long_output=(2, 4),
        vocab=127,
    )
    result = compare_engine(
        model, work, budget=8, repeats=1, max_num_seqs=4, block_size=4, max_model_len=128
    )
    assert result["same_tokens"] and result["output_tokens"] == sum(r.max_tokens for r in work)
    assert result["on"]["max_step_tokens"] <= 8 < result["off"]["max_step_tokens"]
    assert result["on"]["prefill_chunks"] > result["off"]["prefill_chunks"] == len(work)
    for name in ("off", "on"):
        r = result[name]
        assert all(
            0 < r[k] < math.inf
            for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tok_s", "cpu_tok_s")
        )
        assert len(r["step_seconds"]) == r["steps"]
    fig = plot_latency(
        result, simulate_budgets(work, budgets=(8, 16, None), max_num_seqs=4, max_model_len=128)
    )
    assert len(fig.axes) == 5
    plt.close(fig)
