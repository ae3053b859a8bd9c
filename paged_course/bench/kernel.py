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
learner's kernel of ``ex04_fast_decode.py`` instead (ungraded; on CPU correctness only).
Writes ``kernel.png`` into ``out``; the caller writes ``kernel.json``.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import torch

from paged_course.reference import paged_attention_gather

# Peak HBM bandwidth in GB/s from the vendors' spec sheets; first substring match of the device name wins.
PEAK_HBM_GBPS = [
    ("GH200", 4000),
    ("H200", 4800),
    ("H100 NVL", 3900),
    ("H100 PCIe", 2000),
    ("H100", 3350),
    ("H800", 3350),
    ("B200", 8000),
    ("A100-SXM4-80GB", 2039),
    ("A100 80GB PCIe", 1935),
    ("A100", 1555),
    ("A800", 2039),
    ("L40S", 864),
    ("L40", 864),
    ("L4", 300),
    ("A10G", 600),
    ("A10", 600),
    ("T4", 320),
    ("V100", 900),
    ("RTX 4090", 1008),
    ("RTX 3090", 936),
    ("RTX A6000", 768),
]
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
ROOT = Path(__file__).resolve().parents[2]
STEPS = [  # chapter 04's performance lab, one idea per step: (id, label, kernel, launch config, num_splits)
    ("teaching", "teaching kernel (one block per step, broadcast-and-sum)", "teaching", None, 1),
    (
        "dot",
        "+ group in tl.dot's rows (tile = one block of 16)",
        "tuned",
        {"BLOCK_N": 16, "num_stages": 1},
        1,
    ),
    ("tiles", "+ tiles of 64 tokens across blocks", "tuned", {"BLOCK_N": 64, "num_stages": 1}, 1),
    ("pipeline", "+ software pipelining (num_stages)", "tuned", {}, 1),
    ("splits", "+ split count from the heuristic", "tuned", {}, None),
]
TARGET_SHAPES = [(64, 4096), (8, 4096), (1, 8192)]
SWEEP = {
    "batch": [1, 8, 32, 64],
    "context": [1024, 4096, 8192],
    "split_batch": [1, 4, 16],
    "split_context": [8192, 32768],
    "splits": [1, 2, 4, 8, 16, 32],
    "kv_heads": [32, 8, 4, 1],
    "reps": 20,
}
QUICK_SWEEP = {
    "batch": [1, 8, 64],
    "context": [4096, 8192],
    "split_batch": [1, 4],
    "split_context": [8192],
    "splits": [1, 4, 16, 32],
    "kv_heads": [8, 1],
    "reps": 10,
}


def peak_bandwidth_gbps(device_name: str) -> float | None:
    """Spec-sheet HBM bandwidth of a device (GB/s), or None when it is not in :data:`PEAK_HBM_GBPS`."""
    for key, gbps in PEAK_HBM_GBPS:
        if key.lower() in device_name.lower():
            return float(gbps)
    return None


def bytes_moved(
    batch: int, context: int, heads: int, kv_heads: int, head_dim: int, elem: int
) -> int:
    """Bytes a decode step must move: K and V once per KV head, the query in and the output out."""
    return 2 * batch * context * kv_heads * head_dim * elem + 2 * batch * heads * head_dim * elem


def flops(batch: int, context: int, heads: int, head_dim: int) -> int:
    """Multiply-adds of ``q k`` and ``p v``, 2 flops each: ``4 x B x H x L x D``."""
    return 4 * batch * heads * context * head_dim


BYTE_FORMULA = (
    "bytes = 2*B*L*KVH*D*e (K and V, once per KV head) + 2*B*H*D*e (query in, output out)"
)


def make_inputs(
    batch: int,
    context: int,
    block_size: int,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    dtype=torch.float16,
    device="cuda",
    seed: int = 0,
) -> dict:
    """Paged inputs with shuffled block tables, plus the same values in a contiguous pool (identity table)."""
    width = -(-context // block_size)
    num_blocks = batch * width
    tables = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = tables.view(batch, width).to(torch.int32).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)  # big tensors drawn on the device itself
    key_cache = torch.randn(
        num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device, dtype=dtype
    )
    value_cache = torch.randn(
        num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device, dtype=dtype
    )
    query = torch.randn(batch, heads, head_dim, generator=gen, device=device, dtype=dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    flat = tables.long().flatten()  # logical order: row s, then block j
    identity = torch.arange(num_blocks, dtype=torch.int32, device=device).view(batch, width)
    return {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_tables": tables,
        "context_lens": lens,
        "contig_key": key_cache[flat].contiguous(),
        "contig_value": value_cache[flat].contiguous(),
        "identity": identity,
    }


def _args(inp: dict, contiguous: bool = False) -> tuple:
    if contiguous:
        return (
            inp["query"],
            inp["contig_key"],
            inp["contig_value"],
            inp["identity"],
            inp["context_lens"],
        )
    return (
        inp["query"],
        inp["key_cache"],
        inp["value_cache"],
        inp["block_tables"],
        inp["context_lens"],
    )


def kernel_fn(
    inp: dict, kernel: str = "tuned", num_splits=None, config: dict | None = None, contiguous=False
):
    """A no-argument call of one of our kernels without input validation (no host sync in the timed region)."""
    args = _args(inp, contiguous)
    if kernel == "teaching":
        from paged_course.kernel_lab import launch_teaching_decode

        return lambda: launch_teaching_decode(*args, None, num_splits or 1)
    from paged.kernels import launch_decode

    return lambda: launch_decode(*args, None, num_splits, config)


def _sdpa_fn(inp: dict, context: int):
    """SDPA over the contiguous pool viewed as [B, KVH, L, D] (GQA via enable_gqa)."""
    import torch.nn.functional as F

    q = inp["query"][:, :, None, :]  # [B, H, 1, D]
    batch, kv_heads, head_dim = (
        inp["query"].shape[0],
        inp["key_cache"].shape[2],
        inp["query"].shape[2],
    )
    k = (
        inp["contig_key"]
        .view(batch, -1, kv_heads, head_dim)[:, :context]
        .transpose(1, 2)
        .contiguous()
    )
    v = (
        inp["contig_value"]
        .view(batch, -1, kv_heads, head_dim)[:, :context]
        .transpose(1, 2)
        .contiguous()
    )
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)[:, :, 0]


def _flash_attn_fn(inp: dict, context: int):
    from flash_attn import flash_attn_with_kvcache  # optional peer

    batch, kv_heads, head_dim = (
        inp["query"].shape[0],
        inp["key_cache"].shape[2],
        inp["query"].shape[2],
    )
    k = inp["contig_key"].view(batch, -1, kv_heads, head_dim)
    v = inp["contig_value"].view(batch, -1, kv_heads, head_dim)
    q = inp["query"][:, None]  # [B, 1, H, D]
    return lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=inp["context_lens"])[:, 0]


def _flashinfer_fn(inp: dict, context: int):
    import flashinfer  # optional peer

    query, key_cache, tables = inp["query"], inp["key_cache"], inp["block_tables"]
    batch, heads, head_dim = query.shape
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    width = tables.shape[1]
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=query.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=query.device) * width
    last = torch.full(
        (batch,), context - (width - 1) * block_size, dtype=torch.int32, device=query.device
    )
    wrapper.plan(
        indptr, tables.flatten(), last, heads, kv_heads, head_dim, block_size, data_type=query.dtype
    )
    return lambda: wrapper.run(query, (key_cache, inp["value_cache"]))


PEERS = {"sdpa": _sdpa_fn, "flash_attn": _flash_attn_fn, "flashinfer": _flashinfer_fn}


def cuda_timer(reps: int = 20, warmup: int = 3):
    """``best_ms(fn)``: ``warmup`` untimed calls, then the minimum of ``reps`` CUDA-event timings, each after
    zeroing a buffer of max(2 x L2, 256 MB) so that no call starts with K/V in L2."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2, 256 << 20), dtype=torch.uint8, device="cuda")

    def best_ms(fn) -> float:
        for _ in range(warmup):
            fn()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        for start, end in events:
            flush.zero_()  # the GPU is busy with this while the host queues fn: fn's launch is not timed
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return min(start.elapsed_time(end) for start, end in events)

    return best_ms


def _rate(ms: float, moved: int, peak: float | None) -> dict:
    gbps = moved / (ms * 1e-3) / 1e9
    return {"us": ms * 1e3, "gbps": gbps, "pct_peak": None if peak is None else 100 * gbps / peak}


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.float() - ref.float()).abs().max().item()


def _gpu(
    quick: bool,
    out: Path,
    sweep: dict | None = None,
    best_ms=None,
    device: str = "cuda",
    shape: dict | None = None,
) -> dict:
    """The GPU benchmark. ``sweep``, ``best_ms``, ``device`` and ``shape`` (heads, kv_heads, head_dim,
    dtype) are injectable so that a test can dry-run the whole path on CPU through the interpreter."""
    sweep = sweep or (QUICK_SWEEP if quick else SWEEP)
    shape = shape or {
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "dtype": torch.float16,
    }
    heads, kv_heads, head_dim, dtype = (
        shape["heads"],
        shape["kv_heads"],
        shape["head_dim"],
        shape["dtype"],
    )
    elem = torch.empty(0, dtype=dtype).element_size()
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)"
    peak = peak_bandwidth_gbps(device_name)
    best_ms = best_ms or cuda_timer(reps=sweep["reps"])
    print(BYTE_FORMULA + f", e = {elem}; block-table reads not counted")
    print(
        f"peak HBM bandwidth of {device_name}: "
        + (
            f"{peak:.0f} GB/s (spec sheet)"
            if peak
            else "unknown (not in PEAK_HBM_GBPS): GB/s only, no % of peak"
        )
    )
    make = lambda b, c, bs, kvh=kv_heads: make_inputs(b, c, bs, heads, kvh, head_dim, dtype, device)  # noqa: E731
    skipped: dict[str, str] = {}
    shapes = [(b, c, 16) for b in sweep["batch"] for c in sweep["context"]]
    targets = sweep.get(
        "targets", TARGET_SHAPES
    )  # (batch, context) of the steps and the block-size study
    shapes += [
        (b, c, bs)
        for b, c in targets
        if b in sweep["batch"] and c in sweep["context"]
        for bs in (8, 32)
    ]
    rows = []
    for batch, context, block_size in shapes:
        inp = make(batch, context, block_size)
        moved = bytes_moved(batch, context, heads, kv_heads, head_dim, elem)
        tuned, contiguous = kernel_fn(inp), kernel_fn(inp, contiguous=True)
        result, reference = (
            tuned(),
            _sdpa_fn(inp, context)(),
        )  # SDPA as the reference: no fp32 copy of the pool
        times = {
            "tuned": best_ms(tuned),
            "contiguous": best_ms(contiguous),
            "teaching": best_ms(kernel_fn(inp, "teaching")),
        }
        if block_size == 16:
            for name, peer in PEERS.items():
                if name in skipped:
                    continue
                try:
                    times[name] = best_ms(peer(inp, context))
                except Exception as exc:  # noqa: BLE001 - optional peers: record why they were skipped
                    skipped[name] = f"{type(exc).__name__}: {exc}"[:200]
        row = {
            "batch": batch,
            "context": context,
            "block_size": block_size,
            "bytes": moved,
            "paged_ms": times["tuned"],
            "contiguous_ms": times["contiguous"],
            "paged_over_contiguous": times["tuned"] / times["contiguous"],
            "paged_gbps": _rate(times["tuned"], moved, peak)["gbps"],
            "pct_peak": _rate(times["tuned"], moved, peak)["pct_peak"],
            "ms": times,
            "rates": {k: _rate(v, moved, peak) for k, v in times.items()},
            "tuned_over_sdpa": times["tuned"] / times["sdpa"] if "sdpa" in times else None,
            "max_err_vs_sdpa": _err(result, reference),
            "paged_equals_contiguous": bool(torch.equal(result, contiguous())),
        }
        rows.append(row)
        print(
            f"B={batch:3d} ctx={context:5d} bs={block_size:2d}: "
            + "  ".join(
                f"{k} {v * 1e3:7.1f} us" + (f" {row['rates'][k]['pct_peak']:4.1f}%" if peak else "")
                for k, v in times.items()
            )
            + f"  paged/contiguous {row['paged_over_contiguous']:.3f}  err vs SDPA {row['max_err_vs_sdpa']:.1e}"
        )
        del inp, tuned, contiguous, result, reference
    steps = _steps(make, best_ms, peak, targets, heads, kv_heads, head_dim, elem)
    split_rows = _split_sweep(make, best_ms, sweep, device)
    group_rows = _group_sweep(make, best_ms, peak, sweep, heads, head_dim, elem)
    verdicts = _targets(rows, peak)
    for name, verdict in verdicts.items():
        print(f"target {name}: {verdict}")
    from paged_course.viz.kernels import plot_kernel_bench

    config = f"{str(dtype).replace('torch.', '')}, {heads} query / {kv_heads} KV heads, head dim {head_dim}"
    fig = plot_kernel_bench(rows, steps, split_rows, group_rows, peak, device_name, config)
    fig.savefig(out / "kernel.png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return {
        "mode": "gpu",
        "device": device_name,
        "peak_hbm_gbps": peak,
        "byte_formula": BYTE_FORMULA,
        "config": {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": str(dtype)},
        "timing": f"best of {sweep['reps']} calls after 3 untimed, L2 flushed before each (CUDA events)",
        "sweep": rows,
        "steps": steps,
        "split_k": split_rows,
        "groups": group_rows,
        "peers_skipped": skipped,
        "targets": verdicts,
        "plot": str(out / "kernel.png"),
    }


def _steps(make, best_ms, peak, shapes, heads, kv_heads, head_dim, elem) -> list[dict]:
    """Chapter 04's performance lab: each step's time and bandwidth at the target shapes (block size 16)."""
    rows = []
    for batch, context in shapes:
        inp = make(batch, context, 16)
        moved = bytes_moved(batch, context, heads, kv_heads, head_dim, elem)
        for step, label, kernel, config, splits in STEPS:
            ms = best_ms(kernel_fn(inp, kernel, splits, config))
            rows.append(
                {
                    "step": step,
                    "label": label,
                    "batch": batch,
                    "context": context,
                    "block_size": 16,
                    "config": config,
                    "num_splits": splits,
                    **_rate(ms, moved, peak),
                }
            )
            r = rows[-1]
            print(
                f"step {step:9s} B={batch:2d} ctx={context:5d}: {r['us']:8.1f} us {r['gbps']:7.0f} GB/s"
                + (f" ({r['pct_peak']:.1f}% of peak)" if peak else "")
                + f"  {label}"
            )
        del inp
    return rows


def _split_sweep(make, best_ms, sweep, device) -> list[dict]:
    """Forced split counts against the heuristic's pick (tuned kernel, block size 16)."""
    from paged.kernels.launch_config import (
        choose_num_splits,
        decode_config,
        decode_slots,
        device_spec,
    )

    rows = []
    for batch in sweep["split_batch"]:
        for context in sweep["split_context"]:
            inp = make(batch, context, 16)
            spec = device_spec(inp["query"].device)
            cfg = decode_config(inp["query"].shape[2], inp["query"].dtype, spec)
            slots = decode_slots(spec)
            pick = choose_num_splits(
                batch * inp["key_cache"].shape[2], -(-context // cfg["BLOCK_N"]), slots
            )
            times = {s: best_ms(kernel_fn(inp, num_splits=s)) for s in sweep["splits"]}
            times.setdefault(pick, best_ms(kernel_fn(inp, num_splits=pick)))
            best = min(times, key=times.get)
            rows.append(
                {
                    "batch": batch,
                    "context": context,
                    "ms_by_splits": times,
                    "best_splits": best,
                    "heuristic_splits": pick,
                    "heuristic_over_best": times[pick] / times[best],
                    "speedup_best_vs_single": times[1] / times[best] if 1 in times else None,
                }
            )
            print(
                f"split-K B={batch} ctx={context}: "
                + "  ".join(f"{s}:{t * 1e3:.0f}us" for s, t in sorted(times.items()))
                + f"  best {best}, heuristic {pick} ({times[pick] / times[best]:.2f}x the best)"
            )
            del inp
    return rows


def _group_sweep(make, best_ms, peak, sweep, heads, head_dim, elem) -> list[dict]:
    """GQA groups at batch 32, context 4096 for the roofline: arithmetic intensity grows with the group."""
    rows = []
    batch, context = min(32, max(sweep["batch"])), min(4096, max(sweep["context"]))
    for kv_heads in sweep["kv_heads"]:
        if heads % kv_heads:
            continue
        inp = make(batch, context, 16, kv_heads)
        moved = bytes_moved(batch, context, heads, kv_heads, head_dim, elem)
        intensity = flops(batch, context, heads, head_dim) / moved
        for name, fn in (
            ("tuned", kernel_fn(inp)),
            ("teaching", kernel_fn(inp, "teaching")),
            ("sdpa", _sdpa_fn(inp, context)),
        ):
            rows.append(
                {
                    "impl": name,
                    "kv_heads": kv_heads,
                    "group": heads // kv_heads,
                    "batch": batch,
                    "context": context,
                    "intensity": intensity,
                    **_rate(best_ms(fn), moved, peak),
                }
            )
        del inp
    return rows


def _targets(rows: list[dict], peak: float | None) -> dict:
    """The kernel's GPU targets, each with the measured number (met or not: reported, never asserted)."""
    out = {}
    at = {(r["batch"], r["context"], r["block_size"]): r for r in rows}
    for (batch, context), goal in (((64, 4096), 80), ((1, 8192), 40)):
        r = at.get((batch, context, 16))
        name = f"B={batch} ctx={context} >= {goal}% of peak HBM"
        if r is None:
            continue
        if r["pct_peak"] is None:
            out[name] = f"{r['paged_gbps']:.0f} GB/s (unknown GPU: no % of peak)"
        else:
            out[name] = f"{r['pct_peak']:.1f}% ({'met' if r['pct_peak'] >= goal else 'not met'})"
    vs_sdpa = [
        r["tuned_over_sdpa"] for r in rows if r["batch"] >= 8 and r["tuned_over_sdpa"] is not None
    ]
    if vs_sdpa:
        worst = max(vs_sdpa)
        out["B>=8 never slower than SDPA"] = (
            f"worst tuned/SDPA time {worst:.2f} ({'met' if worst <= 1 else 'not met'})"
        )
    bound = [r["paged_over_contiguous"] for r in rows if (r["batch"], r["context"]) == (64, 4096)]
    if bound:
        worst = max(bound)
        out["paging overhead at B=64 ctx=4096 <= 5%"] = (
            f"worst paged/contiguous {worst:.3f} over block sizes "
            f"({'met' if worst <= 1.05 else 'not met'})"
        )
    return out


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
    print(f"== {impl}/ex04_fast_decode.py (ungraded): self-check against paged_course.reference")
    checks = module.self_check(verbose=True)
    result = {
        "mode": "exercise",
        "impl": impl,
        "self_check": checks,
        "correct": all(r["ok"] for r in checks),
    }
    if not torch.cuda.is_available():
        print(
            "ungraded on CPU: correctness only (the interpreter's times say nothing about a GPU); run this on "
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
