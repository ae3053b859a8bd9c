r"""Kernel benchmark: ``python -m paged bench kernel [--quick] [--out DIR] [--impl {solutions,exercises}]``.

Decode attention, fp16, 32 query heads over 8 KV heads of dim 128 (a Llama-3-8B layer).

**Bytes.** Decode must read every context token's K and V once per KV head, and the query and the output
once: ``bytes = 2 x B x L x KVH x D x e + 2 x B x H x D x e`` (``e`` = 2 bytes in fp16; block-table reads
are not counted). Achieved bandwidth = bytes / time, reported in GB/s and as a % of the GPU's peak HBM
bandwidth (:data:`PEAK_HBM_GBPS`, spec sheets; an unknown GPU reports GB/s only and says so).

**Timing on a GPU.** Every side gets untimed warm-up calls (compilation included), then the best (minimum)
of several calls, each timed with CUDA events after writing a buffer larger than the L2 cache (at least
2x L2, 256 MB), so no call finds K/V left in L2 by the previous one (FlashInfer's convention).

**Sides.** ``tuned`` (``paged.kernels.launch_decode``, split count by its heuristic) on shuffled block
tables; ``contiguous``, the same kernel on a contiguous pool holding the same values (sequence ``s``'s
block ``j`` at ``s * width + j``: an identity block table), so paged / contiguous is the cost of paging
itself (seed claim E2); ``teaching``, chapter 04's first kernel (``paged_course.kernel_lab``); ``sdpa``,
PyTorch's ``scaled_dot_product_attention`` on contiguous ``[B, KVH, L, D]`` K/V; ``flash_attn``
(``flash_attn_with_kvcache``, contiguous) and ``flashinfer`` (paged decode) when installed, else skipped
with the reason.

**Tables.** A sweep of batch x context at block size 16 (plus block sizes 8 and 32 at the two target
shapes); the **steps** of chapter 04's performance lab at batch 64 / context 4,096, batch 8 / 4,096 and
batch 1 / 8,192 (teaching kernel; the group in ``tl.dot`` with one block per tile; tiles of 64 tokens
across blocks; pipelining; the split heuristic); a split-K sweep (forced counts against the heuristic's
pick); a GQA-group sweep for the roofline plot (arithmetic intensity = flops / bytes against achieved
bandwidth). The targets are reported with their measured numbers, never asserted.

**On CPU** the kernels run in Triton's interpreter: tiny shapes, correctness columns (max error against
``paged_course.reference``), and interpreter seconds that say nothing about a GPU. ``--impl`` runs the
learner's kernel of ``ex04_fast_decode.py`` instead (on CPU correctness only, not timed).
Writes ``kernel.png`` into ``out``; the caller writes ``kernel.json``. The shapes, inputs and byte model are
``kernel_shapes``, the GPU run ``kernel_gpu``; this module is the entry point, the CPU check, the learner's
kernel and the committed GPU runs.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import torch

from paged_course.bench.kernel_gpu import _gpu
from paged_course.bench.kernel_shapes import (
    BYTE_FORMULA,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    ROOT,
    STEPS,
    TARGET_SHAPES,
    _args,
    _err,
    _rate,
    bytes_moved,
    cuda_timer,
    flops,
    kernel_fn,
    make_inputs,
    peak_bandwidth_gbps,
)
from paged_course.reference import paged_attention_gather

# ---------------------------------------------------------------------------- CPU (interpreter)


def cpu_check(shapes=None, seed: int = 0) -> list[dict]:
    """Interpreter run on tiny shapes: max error vs ``paged_attention_gather`` and seconds per call.

    ``shapes``: tuples ``(batch, context, block_size, num_splits)`` with 4 query heads over 2 KV heads of
    dim 32 (``num_splits=None``: the heuristic). Both kernels, float32 and float16; the tuned kernel also
    on the contiguous pool (must equal the paged result). Times are Triton-interpreter seconds on this CPU:
    they say nothing about a GPU.
    """
    shapes = shapes or [(2, 64, 16, 1), (1, 200, 8, None), (3, 100, 16, 3)]
    rows = []
    for batch, context, block_size, splits in shapes:
        for dtype in (torch.float32, torch.float16):
            inp = make_inputs(
                batch,
                context,
                block_size,
                heads=4,
                kv_heads=2,
                head_dim=32,
                dtype=dtype,
                device="cpu",
                seed=seed,
            )
            reference = paged_attention_gather(
                *[t.float() if t.is_floating_point() else t for t in _args(inp)]
            )
            row = {
                "batch": batch,
                "context": context,
                "block_size": block_size,
                "num_splits": splits,
                "dtype": str(dtype).replace("torch.", ""),
            }
            for kernel in ("tuned", "teaching"):
                fn = kernel_fn(inp, kernel, splits)
                start = time.perf_counter()
                result = fn()
                row[f"{kernel}_interpreter_s"] = time.perf_counter() - start
                row[f"{kernel}_max_err"] = _err(result, reference)
                if kernel == "tuned":
                    row["paged_equals_contiguous"] = bool(
                        torch.equal(result, kernel_fn(inp, contiguous=True, num_splits=splits)())
                    )
            rows.append(row)
    return rows


def _cpu(quick: bool, out: Path) -> dict:
    from paged.kernels import MODE

    shapes = [(1, 100, 8, None)] if quick else None
    rows = cpu_check(shapes)
    print(
        f"Triton mode: {MODE}. CPU run: correctness and interpreter time only; no bandwidth (run "
        "scripts/gpu_check.sh on a GPU for that)."
    )
    print(BYTE_FORMULA + " (what a GPU run divides by the time)")
    for r in rows:
        print(
            f"B={r['batch']} ctx={r['context']:3d} bs={r['block_size']:2d} splits={r['num_splits']} {r['dtype']:7s}: "
            f"tuned err {r['tuned_max_err']:.1e}, teaching err {r['teaching_max_err']:.1e}, paged == contiguous "
            f"{r['paged_equals_contiguous']}; interpreter s (not GPU time): tuned {r['tuned_interpreter_s']:.2f}, "
            f"teaching {r['teaching_interpreter_s']:.2f}"
        )
    from paged_course.viz.kernels import plot_cpu_check

    fig = plot_cpu_check(rows)
    fig.savefig(out / "kernel.png", dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    tol = {"float32": 1e-4, "float16": 3e-3}
    correct = all(r[f"{k}_max_err"] < tol[r["dtype"]] for r in rows for k in ("tuned", "teaching"))
    return {
        "mode": "cpu-interpreter",
        "note": "correctness and Triton-interpreter time on tiny shapes; no GPU "
        "numbers (bandwidth, paged vs contiguous time) were measured in this run",
        "triton_mode": MODE,
        "byte_formula": BYTE_FORMULA,
        "cpu_rows": rows,
        "correct": correct,
        "all_paged_equal_contiguous": all(r["paged_equals_contiguous"] for r in rows),
        "plot": str(out / "kernel.png"),
    }


# ---------------------------------------------------------------------------- the learner's kernel


def _exercise(impl: str, quick: bool, out: Path) -> dict:
    """``--impl``: the learner's ``ex04_fast_decode`` kernel: self-check, then (GPU) its bandwidth."""
    module = importlib.import_module(f"{impl}.ex04_fast_decode")
    print(f"== {impl}/ex04_fast_decode.py: self-check against paged_course.reference")
    checks = module.self_check(verbose=True)
    result = {
        "mode": "exercise",
        "impl": impl,
        "self_check": checks,
        "correct": all(r["ok"] for r in checks),
    }
    if not torch.cuda.is_available():
        print(
            "not timed on CPU: correctness only (the interpreter's times say nothing about a GPU); run this on "
            "a GPU for the bandwidth"
        )
        return result
    device_name = torch.cuda.get_device_name(0)
    peak = peak_bandwidth_gbps(device_name)
    best_ms = cuda_timer(reps=10 if quick else 20)
    rows = []
    for batch, context in TARGET_SHAPES:
        inp = make_inputs(batch, context, 16)
        moved = bytes_moved(batch, context, HEADS, KV_HEADS, HEAD_DIM, 2)
        sides = {
            "yours": lambda inp=inp: module.launch_learner_decode(*_args(inp)),
            "teaching": kernel_fn(inp, "teaching"),
            "tuned": kernel_fn(inp, num_splits=1),
        }
        rates = {k: _rate(best_ms(fn), moved, peak) for k, fn in sides.items()}
        rows.append({"batch": batch, "context": context, "rates": rates})
        print(
            f"B={batch:2d} ctx={context:5d}: "
            + "  ".join(
                f"{k} {v['us']:8.1f} us {v['gbps']:6.0f} GB/s"
                + (f" ({v['pct_peak']:.0f}%)" if peak else "")
                for k, v in rates.items()
            )
            + "  (tuned: single pass, like yours)"
        )
        del inp
    return {**result, "device": device_name, "peak_hbm_gbps": peak, "rows": rows}


# ---------------------------------------------------------------------------- committed GPU runs


def committed_kernel_runs(root: Path | None = None) -> dict | None:
    """The newest committed GPU ``kernel.json`` under ``docs/gpu/*/`` (by its run time), digested for chapter 04.

    Returns None when no GPU run is committed, else ``{"path", "device", "time", "peak_hbm_gbps", "targets",
    "sweep_kernel", "steps", "sdpa", "teaching_by_block_size", "paging", "split_k"}``:

    - ``steps[(step, batch, context)]`` and ``sdpa[(batch, context)]``: ``{"us", "gbps", "pct_peak"}``;
    - ``teaching_by_block_size[(batch, context, block_size)]``: the teaching kernel's microseconds;
    - ``paging[(batch, context, block_size)]``: paged / contiguous time of ``sweep_kernel``.

    Runs from before the performance lab timed only the kernel then in ``paged.kernels``, the teaching
    kernel (``sweep_kernel == "teaching"``): they fill the ``"teaching"`` step and no other; a step that a
    run did not measure is absent, never filled in.
    """
    root = Path(root) if root is not None else ROOT / "docs" / "gpu"
    records = []
    for path in root.glob("*/kernel.json"):
        record = json.loads(path.read_text())
        if record.get("results", {}).get("mode") == "gpu":
            records.append((record["environment"].get("time", ""), path.parent.name, path, record))
    if not records:
        return None
    _, _, path, record = max(records, key=lambda r: (r[0], r[1]))
    res = record["results"]
    peak = res.get("peak_hbm_gbps")
    legacy = "steps" not in res
    digest = {
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "device": res.get("device"),
        "time": record["environment"].get("time"),
        "peak_hbm_gbps": peak,
        "targets": res.get("targets", {}),
        "sweep_kernel": "teaching" if legacy else "tuned",
        "steps": {(r["step"], r["batch"], r["context"]): r for r in res.get("steps", [])},
        "sdpa": {},
        "teaching_by_block_size": {},
        "paging": {},
        "split_k": res.get("split_k", []),
    }
    for r in res.get("sweep", []):
        shape = (r["batch"], r["context"])
        bytes_ = r.get("bytes") or bytes_moved(*shape, HEADS, KV_HEADS, HEAD_DIM, 2)
        teaching_ms = r["paged_ms"] if legacy else r["ms"].get("teaching")
        sdpa_ms = (r.get("peers_ms") or r.get("ms") or {}).get("sdpa")
        digest["paging"][(*shape, r["block_size"])] = r["paged_over_contiguous"]
        if teaching_ms is not None:
            digest["teaching_by_block_size"][(*shape, r["block_size"])] = teaching_ms * 1e3
        if r["block_size"] == 16:
            if legacy:
                digest["steps"][("teaching", *shape)] = _rate(teaching_ms, bytes_, peak)
            if sdpa_ms is not None:
                digest["sdpa"][shape] = _rate(sdpa_ms, bytes_, peak)
    return digest


def run(quick: bool, out: Path, impl: str | None = None) -> dict:
    """Benchmark entry point (see the module docstring); returns JSON-able results."""
    from paged.kernels import HAS_TRITON, REASON

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not HAS_TRITON:
        print(f"skipped: {REASON}")
        return {"mode": "skipped", "reason": REASON}
    if impl:
        return _exercise(impl, quick, out)
    if torch.cuda.is_available():
        return _gpu(quick, out)
    return _cpu(quick, out)


if __name__ == "__main__":  # pragma: no cover
    print(run(quick=True, out=Path("bench-results")))


__all__ = [  # chapter 04 reads these here
    "BYTE_FORMULA",
    "STEPS",
    "TARGET_SHAPES",
    "bytes_moved",
    "committed_kernel_runs",
    "cpu_check",
    "flops",
    "peak_bandwidth_gbps",
    "run",
]
