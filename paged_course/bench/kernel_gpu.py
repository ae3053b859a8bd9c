"""The kernel benchmark on a GPU: bandwidth of every side at every sweep shape, chapter 04's lab steps,
the split-K and GQA-group sweeps and the targets, each reported with its measured number.

The peers (PyTorch SDPA; FlashAttention and FlashInfer when installed, else skipped with the reason) are
here too. ``kernel.run`` calls :func:`_gpu` when CUDA is available; the figure is drawn by
``viz.kernels`` from the rows computed here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from paged_course.bench.kernel_shapes import (
    BYTE_FORMULA,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    QUICK_SWEEP,
    STEPS,
    SWEEP,
    TARGET_SHAPES,
    _err,
    _rate,
    bytes_moved,
    cuda_timer,
    flops,
    kernel_fn,
    make_inputs,
    peak_bandwidth_gbps,
)


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
