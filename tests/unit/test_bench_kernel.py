"""``python -m paged bench kernel``: the CPU run, the GPU path dry-run on CPU, targets, committed runs, --impl.

The GPU path runs here through the interpreter on tiny shapes with a stand-in timer (``best_ms``):
that checks its code (every side, the steps, the split and group sweeps, the JSON, the figure), not
any GPU number.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from paged import kernels
from paged_course.bench import kernel as bench
from paged_course.bench import kernel_gpu

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

pytestmark = pytest.mark.triton
cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="interpreter path; gpu_check.sh runs the GPU one"
)


def test_byte_formula_and_peaks():
    # batch 64, context 4096, 8 KV heads of dim 128, fp16: 1.07 GB of K/V, ~224 us at 4.8 TB/s
    moved = bench.bytes_moved(64, 4096, 32, 8, 128, 2)
    assert moved == 2 * 64 * 4096 * 8 * 128 * 2 + 2 * 64 * 32 * 128 * 2
    assert round(moved / 4.8e12 * 1e6) == 224
    assert (
        bench.peak_bandwidth_gbps("NVIDIA H200") == 4800
        and bench.peak_bandwidth_gbps("NVIDIA GH200") == 4000
    )
    assert (
        bench.peak_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350
        and bench.peak_bandwidth_gbps("Mystery") is None
    )
    assert (
        bench.flops(1, 10, 32, 128) / bench.bytes_moved(1, 10, 32, 8, 128, 2) < 4.1
    )  # ~ the GQA group


@cpu_only
def test_cpu_run_is_correct_and_labelled(tmp_path):
    res = bench.run(quick=True, out=tmp_path)
    assert res["mode"] == "cpu-interpreter" and res["correct"] and res["all_paged_equal_contiguous"]
    assert "no GPU" in res["note"] and (tmp_path / "kernel.png").stat().st_size > 0
    assert {"tuned_interpreter_s", "teaching_interpreter_s", "tuned_max_err"} <= set(
        res["cpu_rows"][0]
    )


@cpu_only
def test_gpu_path_dry_run_on_cpu(tmp_path):
    def best_ms(
        fn,
    ):  # stand-in timer: one call, interpreter milliseconds (meaningless, but exercises the path)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    sweep = {
        "batch": [1, 2],
        "context": [16, 64],
        "targets": [(2, 64), (1, 64)],
        "split_batch": [1],
        "split_context": [128],
        "splits": [1, 2],
        "kv_heads": [2, 1],
        "reps": 1,
    }
    shape = {"heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": torch.float32}
    res = bench._gpu(
        quick=True, out=tmp_path, sweep=sweep, best_ms=best_ms, device="cpu", shape=shape
    )
    json.dumps(res, default=str)
    assert (
        res["mode"] == "gpu" and res["peak_hbm_gbps"] is None and (tmp_path / "kernel.png").exists()
    )
    assert len(res["sweep"]) == 4 + 2 * 2, (
        "4 shapes at block size 16, block sizes 8 and 32 at the 2 targets"
    )
    for row in res["sweep"]:
        assert row["max_err_vs_sdpa"] < 1e-4 and row["paged_equals_contiguous"], row
        assert {"paged_ms", "paged_over_contiguous", "batch", "context", "block_size"} <= set(
            row
        )  # chapter 08
    sides = set(res["sweep"][0]["ms"])
    assert {"tuned", "contiguous", "teaching", "sdpa"} <= sides
    assert all(p in sides or p in res["peers_skipped"] for p in ("flash_attn", "flashinfer")), (
        "a peer vanished"
    )
    assert [r["step"] for r in res["steps"]] == [s[0] for s in bench.STEPS] * 2
    assert res["split_k"][0]["heuristic_splits"] >= 1 and {r["group"] for r in res["groups"]} == {
        2,
        4,
    }


def test_targets_report_numbers_and_verdicts():
    def row(batch, context, bs, pct, ratio, vs_sdpa):
        return {
            "batch": batch,
            "context": context,
            "block_size": bs,
            "pct_peak": pct,
            "paged_gbps": 48 * pct,
            "paged_over_contiguous": ratio,
            "tuned_over_sdpa": vs_sdpa,
        }

    rows = [
        row(64, 4096, 16, 85.0, 1.01, 0.9),
        row(64, 4096, 8, 80.0, 1.07, None),
        row(1, 8192, 16, 30.0, 1.0, 3.0),
        row(8, 4096, 16, 60.0, 1.0, 1.2),
    ]
    out = kernel_gpu._targets(rows, 4800.0)
    assert out["B=64 ctx=4096 >= 80% of peak HBM"] == "85.0% (met)"
    assert out["B=1 ctx=8192 >= 40% of peak HBM"] == "30.0% (not met)"
    assert out["B>=8 never slower than SDPA"] == "worst tuned/SDPA time 1.20 (not met)"
    assert out["paging overhead at B=64 ctx=4096 <= 5%"].startswith("worst paged/contiguous 1.070")
    unknown = kernel_gpu._targets([dict(rows[0], pct_peak=None)], None)
    assert "unknown GPU" in unknown["B=64 ctx=4096 >= 80% of peak HBM"]


def test_committed_run_gives_the_teaching_kernels_numbers_and_nothing_else(tmp_path):
    run = bench.committed_kernel_runs()
    assert run is not None and run["peak_hbm_gbps"]
    if run["path"].endswith(
        "h200-2026-11-30/kernel.json"
    ):  # the run from before the lab: no tuned step
        teaching = run["steps"][("teaching", 64, 4096)]
        assert round(teaching["pct_peak"], 1) == 11.5 and round(teaching["us"]) == 1948
        assert (
            not any(step != "teaching" for step, _, _ in run["steps"])
            and run["sweep_kernel"] == "teaching"
        )
        assert round(run["sdpa"][(64, 4096)]["us"]) == 250
        assert round(run["teaching_by_block_size"][(64, 4096, 32)]) == 2873
        assert max(run["paging"].values()) < 1.025
    else:  # a run of the lab: every step at every target shape
        assert {(s, b, c) for s, *_ in bench.STEPS for b, c in bench.TARGET_SHAPES} <= set(
            run["steps"]
        )
    assert bench.committed_kernel_runs(tmp_path) is None


@cpu_only
@pytest.mark.parametrize("impl", ["solutions", "exercises"])
def test_impl_runs_the_learner_kernel_untimed_on_cpu(impl, tmp_path, capsys):
    """The answer passes; the untouched starter runs the learner's unwritten ch04.ex2 walk and is reported
    incorrect, without stopping the benchmark."""
    res = bench.run(quick=True, out=tmp_path, impl=impl)
    assert res["mode"] == "exercise" and res["correct"] is (impl == "solutions"), res
    assert "not timed on CPU" in capsys.readouterr().out
