"""Chapter 06's tooling: vLLM v0's step orders as scheduler subclasses, the content-checked fake engine, the
chunk-budget sweeps in the simulator and on the engine, and their plots."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from paged.config import CacheConfig, SchedulerConfig  # noqa: E402
from paged.core.scheduler import Scheduler  # noqa: E402
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup  # noqa: E402
from paged_course.sim import step_order  # noqa: E402
from paged_course.sim.kv_check import CheckedEngine, assert_all_free  # noqa: E402
from paged_course.sim.scheduling import CostModel, chunk_budget_sweep, make_workload, simulate  # noqa: E402
from paged_course.viz import chunked  # noqa: E402

ORDERS, TraceRequest, run_trace = step_order.ORDERS, step_order.TraceRequest, step_order.run_trace
V0ChunkedScheduler, V0DefaultScheduler = (
    step_order.V0ChunkedScheduler,
    step_order.V0DefaultScheduler,
)

TRACE = [
    TraceRequest("A", 4, 8, 0),
    TraceRequest("B", 4, 8, 0),
    TraceRequest("C", 24, 3, 2),
    TraceRequest("D", 3, 4, 3),
]


def test_v0_default_runs_prompts_first_whole_and_alone():
    steps = run_trace(
        V0DefaultScheduler,
        TRACE,
        max_model_len=32,
        max_num_batched_tokens=32,
        enable_chunked_prefill=False,
    )
    assert steps[2] == {"A": "stall", "B": "stall", "C": "P24"}, (
        "a step that admits a prompt runs no decodes"
    )
    assert steps[3] == {"A": "stall", "B": "stall", "C": "stall", "D": "P3"}
    assert all(row.get(r) == "D" for row in steps[4:8] for r in "AB")


@pytest.mark.parametrize("cls", [V0ChunkedScheduler, Scheduler])
def test_chunked_orders_run_decodes_first_and_cut_prompts(cls):
    steps = run_trace(cls, TRACE, max_model_len=32, max_num_batched_tokens=8)
    assert [steps[i].get("C") for i in range(2, 6)] == ["P6"] * 4, "6 = 8 - two decodes"
    assert all(row.get(r) == "D" for row in steps[1:8] for r in "AB"), "decodes never stall"


def test_v0_chunked_admits_in_a_step_that_preempted_v1_does_not():
    v0 = run_trace(
        V0ChunkedScheduler, TRACE, max_model_len=32, num_gpu_blocks=7, max_num_batched_tokens=8
    )
    v1 = run_trace(Scheduler, TRACE, max_model_len=32, num_gpu_blocks=7, max_num_batched_tokens=8)
    assert v0[4]["C"] == "pre+P6" and v0[5]["C"] == "pre", (
        "v0: the victim is admitted again at once, then preempted"
    )
    assert v1[4]["C"] == "pre" and v1[5]["C"] == "wait"
    assert not any(cell.startswith("pre+") for row in v1 for cell in row.values())


def test_checked_engine_catches_a_swap_whose_blocks_are_never_copied():
    class NoSwapCopies(Scheduler):
        def _preempt(self, seq, out):
            before = len(out.blocks_to_swap_out)
            super()._preempt(seq, out)
            del out.blocks_to_swap_out[before:]

    def run(cls):
        s = cls(
            SchedulerConfig(
                max_num_seqs=4, max_model_len=32, max_num_batched_tokens=32, preemption_mode="swap"
            ),
            CacheConfig(block_size=4, num_gpu_blocks=4, num_cpu_blocks=4, watermark=0.0),
        )
        for i in range(2):
            s.add_request(
                SequenceGroup(
                    f"r{i}", [Sequence(i, list(range(1, 8)), 4)], SamplingParams(max_tokens=6)
                )
            )
        CheckedEngine(s).run(max_steps=40)
        return s

    assert_all_free(run(Scheduler))
    with pytest.raises(AssertionError, match="its own prefix"):
        run(NoSwapCopies)


def test_simulate_runs_the_scheduler_class_it_is_given():
    calls = []

    class Counting(Scheduler):
        def schedule(self):
            calls.append(1)
            return super().schedule()

    work = make_workload(5, seed=0, mean_prompt=20, mean_output=5, max_len=64)
    cfg, cache = (
        SchedulerConfig(max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64),
        CacheConfig(block_size=4, num_gpu_blocks=64),
    )
    res = simulate(work, cfg, cache, scheduler_cls=Counting)
    assert len(calls) == len(res.steps) > 0
    assert simulate(work, cfg, cache).output_tokens == res.output_tokens


def test_chunk_budget_sweep_trades_ttft_for_itl():
    work = make_workload(40, seed=3, mean_prompt=512, mean_output=32, max_len=2048, rate=3.0)
    cost = CostModel()
    rows = chunk_budget_sweep(
        work, [128, 2048], CacheConfig(block_size=16, num_gpu_blocks=2048), cost
    )
    assert [r["budget"] for r in rows] == [128, 2048, 2048] and rows[-1]["name"].startswith("v0")
    small, large, v0 = rows
    assert small["max_step_s"] <= cost.step_seconds(128) + 1e-12, (
        "no step computes more tokens than the budget"
    )
    assert small["itl_p99"] < large["itl_p99"] <= v0["itl_p99"] + 1e-9
    assert small["ttft_p50"] > large["ttft_p50"], "small chunks pay the step overhead more often"


def test_engine_budget_sweep_and_plots():
    from paged_course.reference.models import tiny_model

    model = tiny_model("llama", vocab_size=128)
    # r0 decodes for a while; the 40-token prompt is admitted when r1 is done, beside r0's decodes
    prompts = [[3] * 4, [4] * 4, [5] * 40, [6] * 4]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (12, 2, 3, 3)]
    rows = chunked.engine_budget_sweep(
        model,
        prompts,
        params,
        [8, 64],
        repeats=1,
        block_size=4,
        num_gpu_blocks=64,
        max_num_seqs=2,
        enable_prefix_caching=False,
    )
    assert [r["budget"] for r in rows] == [8, 64]
    assert rows[0]["prefill_chunks"] > rows[1]["prefill_chunks"], (
        "a small budget cuts the 40-token prompt"
    )
    assert rows[0]["max_decode_step_tokens"] <= 8 and rows[1]["max_decode_step_tokens"] > 8
    assert all(r[k] >= 0 for r in rows for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99"))
    assert (
        chunked.plot_latency_vs_budget(rows + [{**rows[1], "name": "v0 default"}], "t") is not None
    )
    v0 = V0DefaultScheduler
    traces = {
        name: run_trace(
            cls,
            TRACE,
            max_model_len=32,
            max_num_batched_tokens=32 if cls is v0 else 8,
            enable_chunked_prefill=cls is not v0,
        )
        for name, cls in ORDERS.items()
    }
    assert len(chunked.plot_step_orders(traces, list("ABCD")).axes) == 3
    assert chunked.trace_text(traces["vLLM v1 (this engine)"], ["C"]).splitlines()[1].split()[
        :3
    ] == ["C", "P6", "P6"]
