"""Scheduling simulator: cost model by hand, timelines consistent, static vs continuous, recompute vs swap."""

from __future__ import annotations

import pytest

from paged.core.scheduler import CacheConfig, SchedulerConfig
from paged_course.sim.scheduling import (
    CostModel,
    Request,
    make_workload,
    recompute_vs_swap,
    simulate,
    simulate_static,
)

COST = CostModel(
    step_overhead_s=1.0, per_token_s=0.1
)  # easy numbers for hand-computed expectations


def test_cost_model_by_hand():
    c = CostModel()  # 80 transfers of 10 us per block + 16 tokens x 800 KiB over 25 GB/s
    assert c.swap_seconds(1, 16) == pytest.approx(80 * 10e-6 + 16 * 819_200 / 25e9)
    assert c.swap_seconds(0, 16) == 0.0
    assert c.step_seconds(100, 2, 16) == pytest.approx(
        0.020 + 100 * 0.00015 + 2 * c.swap_seconds(1, 16)
    )
    per_token = [c.swap_seconds(1, bs) / bs for bs in (1, 16, 256)]
    assert per_token[0] > 10 * per_token[2], "small blocks pay the per-transfer latency many times"


def test_workload_is_seeded_and_bounded():
    a, b = (make_workload(50, seed=7, max_len=64, shared_prefix=5) for _ in range(2))
    assert [(r.prompt, r.output_len) for r in a] == [(r.prompt, r.output_len) for r in b]
    assert all(len(r.prompt) + r.output_len <= 64 and r.output_len >= 1 for r in a)
    assert all(r.prompt[:5] == a[0].prompt[:5] for r in a)
    timed = make_workload(20, seed=1, rate=10.0)
    assert all(x.arrival_s < y.arrival_s for x, y in zip(timed, timed[1:]))


def two_requests():
    return [Request("a", 0.0, [1, 2, 3, 4], 3), Request("b", 0.0, [5, 6, 7, 8], 1)]


def test_continuous_vs_static_by_hand():
    cfg, cache = (
        SchedulerConfig(max_model_len=16, max_num_seqs=8, max_num_batched_tokens=16),
        CacheConfig(block_size=4, num_gpu_blocks=8),
    )
    cont = simulate(two_requests(), cfg, cache, COST)
    # step 1: both prefills (8 tokens) -> 1.8 s; b is done. Steps 2, 3: a decodes alone -> 1.1 s each.
    assert cont.total_s == pytest.approx(1.8 + 1.1 + 1.1)
    assert [s["tokens"] for s in cont.steps] == [8, 1, 1]
    assert cont.requests["b"]["finish_s"] == pytest.approx(1.8)
    static = simulate_static(two_requests(), batch_size=2, cost=COST)
    # padded: prefill 2 x 4 = 8 tokens, then 2 decode steps of 2 rows; b waits for the batch to end.
    assert static.total_s == pytest.approx(1.8 + 1.2 + 1.2)
    assert static.requests["b"]["finish_s"] == pytest.approx(4.2)
    assert cont.output_tokens == static.output_tokens == 4
    assert cont.free_blocks_at_end == 8


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_timelines_cover_each_request_until_it_finishes(mode):
    wl = make_workload(16, seed=3, mean_prompt=40, mean_output=60, max_len=256, rate=20.0)
    cfg = SchedulerConfig(max_model_len=256, max_num_seqs=16, preemption_mode=mode)
    cache = CacheConfig(block_size=8, num_gpu_blocks=48, num_cpu_blocks=48)
    res = simulate(wl, cfg, cache)
    again = simulate(wl, cfg, cache)
    assert res.summary() == again.summary(), "the simulator is deterministic"
    assert res.num_preemptions > 0, "this memory is small enough to force preemption"
    states = {s for tl in res.timelines.values() for *_, s in tl}
    assert states == {"waiting", "running", "swapped" if mode == "swap" else "preempted"}
    for r in wl:
        info, tl = res.requests[r.request_id], res.timelines[r.request_id]
        assert info["output_tokens"] == r.output_len and info["status"] == "length"
        assert tl[0][0] == pytest.approx(r.arrival_s, abs=1.0) and tl[-1][1] == pytest.approx(
            info["finish_s"]
        )
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(tl, tl[1:])), "segments in order, no overlap"
        assert tl[-1][2] == "running"
    assert all(s["used_blocks"] <= 48 for s in res.steps)
    assert res.free_blocks_at_end == 48
    assert (res.recomputed_tokens > 0) == (mode == "recompute") and (res.swap_s > 0) == (
        mode == "swap"
    )


def test_continuous_batching_beats_static_on_a_long_tailed_workload():
    wl = make_workload(48, seed=0, mean_prompt=64, mean_output=96, max_len=512)
    cont = simulate(
        wl, SchedulerConfig(max_model_len=512), CacheConfig(block_size=16, num_gpu_blocks=256)
    )
    static = simulate_static(wl, batch_size=256 * 16 // 512, max_model_len=512)
    assert cont.throughput > 3 * static.throughput
    assert cont.mean_latency_s < static.mean_latency_s


def test_swap_overhead_falls_with_block_size_recompute_does_not_depend_on_it():
    wl = make_workload(24, seed=2, mean_prompt=100, mean_output=150, max_len=512)
    small, large = recompute_vs_swap(wl, [1, 64], kv_slots=1024, max_model_len=512)
    assert small["swap_overhead_s"] > 5 * small["recompute_overhead_s"], (
        "block 1: swap pays per-transfer latency"
    )
    assert large["swap_overhead_s"] < large["recompute_overhead_s"], (
        "block 64: swap is cheaper than recompute"
    )
    assert small["swap_preemptions"] > 0 and large["recompute_preemptions"] > 0


def test_stepper_tiny_memory_preempts_newest_first():
    from paged_course.viz.scheduler import Stepper

    s = Stepper([("A", 6, 6, 0), ("B", 5, 6, 0), ("C", 3, 3, 1)], block_size=4, num_gpu_blocks=5)
    for _ in range(8):
        s.step()
    assert s.log == [
        "step 1: prefill A(6), B(5)",
        "step 2: prefill C(3) decode A, B",
        "step 3: decode A, B, C",
        "step 4: decode A, B preempted C",
        "step 5: decode A preempted B",
        "step 6: decode A",
        "step 7: prefill B(9), C(5)",
        "step 8: decode B",
    ]
    assert s.queues()["finished"] == ["A", "B", "C"] and not s.sched.has_unfinished_requests()


def test_both_simulators_summarise_the_shared_counts_alike():
    """The fragmentation and scheduling results share ``steps``, ``preemptions``, ``recomputed_tokens``."""
    from paged_course.sim.fragmentation import simulate as simulate_pool
    from paged_course.sim.workload import chat_trace

    pool = simulate_pool(chat_trace(40, seed=0, max_seq_len=256), 1024, "paged").summary()
    cfg = SchedulerConfig(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64)
    cache = CacheConfig(block_size=4, num_gpu_blocks=24)
    sched = simulate(make_workload(6, seed=0, max_len=64), cfg, cache).summary()
    shared = {"steps", "preemptions", "recomputed_tokens"}
    assert shared <= set(pool) and shared <= set(sched)
    assert all(isinstance(s[k], int) and s[k] >= 0 for s in (pool, sched) for k in shared)
