"""Kernel benchmark: ``python -m paged bench kernel [--quick] [--out DIR]``.

On a CUDA GPU (``triton.testing.do_bench``, median of many runs, L2 flushed between runs), for fp16
decode with 32 query heads over 8 KV heads of dim 128 (a Llama-3-8B layer):

* **bandwidth**: bytes the decode must read (K and V of every context token, plus q, out and tables)
  divided by the kernel time, in GB/s and as a % of the device's peak HBM bandwidth (table below;
  unknown devices report GB/s only);
* **paging overhead** (seed claim E2): the same kernel on a *contiguous* pool holding the same values
  (sequence ``s``'s logical block ``j`` stored at block ``s * width + j``: an identity block table), so
  the only difference is where the blocks sit; ratio = paged time / contiguous time;
* **peers**: ``torch`` ``scaled_dot_product_attention`` on contiguous ``[B, KVH, L, D]`` K/V, and
  flash-attn's ``flash_attn_with_kvcache`` (contiguous cache) and FlashInfer's paged decode when they
  are installed (skipped with the reason otherwise);
* sweeps batch x context x block size, and split-K (``num_splits``) vs single pass for batch <= 4 at
  context >= 8192.

On CPU the kernels run in Triton's interpreter: the benchmark then reports correctness (max error vs
``paged_course.reference``) and interpreter seconds on tiny shapes only, clearly labelled; no bandwidth.
Writes ``kernel.png`` into ``out``; the caller writes ``kernel.json``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from paged_course.reference import paged_attention_gather

# Peak HBM bandwidth in GB/s from the vendors' spec sheets; first substring match of the device name wins.
PEAK_HBM_GBPS = [
    ("GH200", 4000), ("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350), ("H800", 3350),
    ("B200", 8000), ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555), ("A800", 2039),
    ("L40S", 864), ("L40", 864), ("L4", 300), ("A10G", 600), ("A10", 600), ("T4", 320), ("V100", 900),
    ("RTX 4090", 1008), ("RTX 3090", 936), ("RTX A6000", 768),
]
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def peak_bandwidth_gbps(device_name: str) -> float | None:
    """Spec-sheet HBM bandwidth of a device (GB/s), or None when it is not in :data:`PEAK_HBM_GBPS`."""
    for key, gbps in PEAK_HBM_GBPS:
        if key.lower() in device_name.lower():
            return float(gbps)
    return None


def make_inputs(batch: int, context: int, block_size: int, heads: int = HEADS, kv_heads: int = KV_HEADS,
                head_dim: int = HEAD_DIM, dtype=torch.float16, device="cuda", seed: int = 0) -> dict:
    """Paged inputs with shuffled block tables, plus the same values in a contiguous pool (identity table)."""
    width = -(-context // block_size)
    num_blocks = batch * width
    tables = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    tables = tables.view(batch, width).to(torch.int32).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)  # big tensors drawn on the device itself
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device, dtype=dtype)
    query = torch.randn(batch, heads, head_dim, generator=gen, device=device, dtype=dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    flat = tables.long().flatten()  # logical order: row s, then block j
    identity = torch.arange(num_blocks, dtype=torch.int32, device=device).view(batch, width)
    return {"query": query, "key_cache": key_cache, "value_cache": value_cache, "block_tables": tables,
            "context_lens": lens, "contig_key": key_cache[flat].contiguous(),
            "contig_value": value_cache[flat].contiguous(), "identity": identity}


def bytes_moved(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, elem: int, width: int) -> int:
    """Bytes a decode step must touch: K and V of every context token, q in, out, tables and lengths."""
    return (2 * batch * context * kv_heads * head_dim * elem + 2 * batch * heads * head_dim * elem
            + batch * width * 4 + batch * 4)


def _sdpa_fn(inp: dict, context: int):
    """SDPA over the contiguous pool viewed as [B, KVH, L, D] (GQA via enable_gqa)."""
    import torch.nn.functional as F

    q = inp["query"][:, :, None, :]  # [B, H, 1, D]
    batch, kv_heads, head_dim = inp["query"].shape[0], inp["key_cache"].shape[2], inp["query"].shape[2]
    k = inp["contig_key"].view(batch, -1, kv_heads, head_dim)[:, :context].transpose(1, 2).contiguous()
    v = inp["contig_value"].view(batch, -1, kv_heads, head_dim)[:, :context].transpose(1, 2).contiguous()
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)[:, :, 0]


def _flash_attn_fn(inp: dict, context: int):
    from flash_attn import flash_attn_with_kvcache  # optional peer

    batch, kv_heads, head_dim = inp["query"].shape[0], inp["key_cache"].shape[2], inp["query"].shape[2]
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
    last = torch.full((batch,), context - (width - 1) * block_size, dtype=torch.int32, device=query.device)
    wrapper.plan(indptr, tables.flatten(), last, heads, kv_heads, head_dim, block_size, data_type=query.dtype)
    return lambda: wrapper.run(query, (key_cache, inp["value_cache"]))


def _kernel_fn(inp: dict, num_splits: int, contiguous: bool = False):
    """Our kernel without input validation (no host syncs inside the timed region)."""
    from paged.kernels.paged_attention import launch_decode

    key, value, table = ((inp["contig_key"], inp["contig_value"], inp["identity"]) if contiguous else
                         (inp["key_cache"], inp["value_cache"], inp["block_tables"]))
    return lambda: launch_decode(inp["query"], key, value, table, inp["context_lens"], None, num_splits)


SWEEP = {"batch": [1, 8, 32, 64], "context": [1024, 4096, 8192], "block_size": [8, 16, 32],
         "split_batch": [1, 2, 4], "split_context": [8192, 16384, 32768], "splits": [1, 2, 4, 8, 16]}
QUICK_SWEEP = {"batch": [1, 64], "context": [1024, 4096], "block_size": [16],
               "split_batch": [1, 4], "split_context": [8192], "splits": [1, 2, 4, 8, 16]}


def _gpu(quick: bool, out: Path, sweep: dict | None = None, bench_ms=None, device: str = "cuda") -> dict:
    """The GPU benchmark; ``sweep``, ``bench_ms`` and ``device`` are injectable for a dry run on CPU."""
    sweep = sweep or (QUICK_SWEEP if quick else SWEEP)
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)"
    peak = peak_bandwidth_gbps(device_name)
    if bench_ms is None:
        from triton.testing import do_bench

        def bench_ms(fn) -> float:
            return float(do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100, return_mode="median"))

    batches, contexts, block_sizes = sweep["batch"], sweep["context"], sweep["block_size"]
    peers = {"sdpa": _sdpa_fn, "flash_attn": _flash_attn_fn, "flashinfer": _flashinfer_fn}
    skipped: dict[str, str] = {}
    rows = []
    for batch in batches:
        for context in contexts:
            peer_ms: dict[str, float] = {}
            for block_size in block_sizes:
                inp = make_inputs(batch, context, block_size, device=device)
                paged, contiguous = _kernel_fn(inp, 1), _kernel_fn(inp, 1, contiguous=True)
                result = paged()
                reference = _sdpa_fn(inp, context)()
                err = (result.float() - reference.float()).abs().max().item()
                same = torch.equal(result, contiguous())
                paged_ms, contig_ms = bench_ms(paged), bench_ms(contiguous)
                if not peer_ms:  # peers read contiguous K/V: time them once per (batch, context)
                    for name, make in peers.items():
                        if name in skipped:
                            continue
                        try:
                            peer_ms[name] = bench_ms(make(inp, context))
                        except Exception as exc:  # noqa: BLE001 - optional peers: record why they were skipped
                            skipped[name] = f"{type(exc).__name__}: {exc}"[:200]
                moved = bytes_moved(batch, context, HEADS, KV_HEADS, HEAD_DIM, 2, inp["block_tables"].shape[1])
                gbps = moved / (paged_ms * 1e-3) / 1e9
                rows.append({"batch": batch, "context": context, "block_size": block_size, "paged_ms": paged_ms,
                             "contiguous_ms": contig_ms, "paged_over_contiguous": paged_ms / contig_ms,
                             "paged_gbps": gbps, "contiguous_gbps": moved / (contig_ms * 1e-3) / 1e9,
                             "pct_peak": None if peak is None else 100 * gbps / peak,
                             "peers_ms": dict(peer_ms), "max_err_vs_sdpa": err, "paged_equals_contiguous": same})
                r = rows[-1]
                print(f"B={batch:3d} ctx={context:5d} bs={block_size:2d}: paged {paged_ms * 1e3:8.1f} us "
                      f"{gbps:7.0f} GB/s" + (f" ({r['pct_peak']:.0f}% of peak)" if peak else "")
                      + f"  contiguous {contig_ms * 1e3:8.1f} us  ratio {r['paged_over_contiguous']:.3f}  "
                      + "  ".join(f"{k} {v * 1e3:.1f} us" for k, v in peer_ms.items()) + f"  err {err:.1e}")
                del inp
    split_rows = []
    for batch in sweep["split_batch"]:
        for context in sweep["split_context"]:
            inp = make_inputs(batch, context, 16, device=device)
            times = {s: bench_ms(_kernel_fn(inp, s)) for s in sweep["splits"]}
            best = min(times, key=times.get)
            split_rows.append({"batch": batch, "context": context, "ms_by_splits": times, "best_splits": best,
                               "speedup_best_vs_single": times[1] / times[best]})
            print(f"split-K B={batch} ctx={context}: " + "  ".join(f"{s}:{t * 1e3:.0f}us" for s, t in times.items())
                  + f"  best {best} ({times[1] / times[best]:.2f}x vs single pass)")
            del inp
    targets = _targets(rows, split_rows)
    for name, verdict in targets.items():
        print(f"target {name}: {verdict}")
    _plot_gpu(rows, split_rows, peak, device_name, out / "kernel.png")
    return {"mode": "gpu", "device": device_name, "peak_hbm_gbps": peak,
            "config": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "float16"},
            "sweep": rows, "split_k": split_rows, "peers_skipped": skipped, "targets": targets,
            "plot": str(out / "kernel.png")}


def _targets(rows: list[dict], split_rows: list[dict]) -> dict:
    """The issue's GPU targets, each with the measured number (met or not: reported, never asserted)."""
    out = {}
    main = [r for r in rows if r["batch"] == 64 and r["context"] == 4096 and r["block_size"] == 16]
    if main and main[0]["pct_peak"] is not None:
        pct = main[0]["pct_peak"]
        out["B=64 ctx=4096 >= 80% of peak HBM"] = f"{pct:.1f}% ({'met' if pct >= 80 else 'not met'})"
    if rows:
        worst = max(r["paged_over_contiguous"] for r in rows)
        out["paged <= 1.05 x contiguous"] = f"worst ratio {worst:.3f} ({'met' if worst <= 1.05 else 'not met'})"
    if split_rows:
        wins = sum(r["best_splits"] > 1 for r in split_rows)
        out["split-K beats single pass (B<=4, ctx>=8192)"] = f"{wins}/{len(split_rows)} configs"
    return out


def _plot_gpu(rows, split_rows, peak, device_name, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for batch in sorted({r["batch"] for r in rows}):
        sel = [r for r in rows if r["batch"] == batch and r["block_size"] == 16] or \
              [r for r in rows if r["batch"] == batch]
        axes[0].plot([r["context"] for r in sel], [r["paged_gbps"] for r in sel], marker="o", label=f"batch {batch}")
    if peak:
        axes[0].axhline(peak, color="gray", linestyle="--", label=f"peak {peak:.0f} GB/s")
    axes[0].set(xscale="log", xlabel="context (tokens)", ylabel="GB/s", title="paged decode bandwidth (bs 16)")
    axes[0].legend(fontsize=7)
    for block_size in sorted({r["block_size"] for r in rows}):
        sel = [r for r in rows if r["block_size"] == block_size]
        axes[1].plot(range(len(sel)), [r["paged_over_contiguous"] for r in sel], marker="o", label=f"bs {block_size}")
    labels = [f"B{r['batch']}/{r['context']}" for r in rows if r["block_size"] == rows[0]["block_size"]]
    axes[1].set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
    axes[1].axhline(1.0, color="gray", linestyle="--")
    axes[1].set(ylabel="paged / contiguous time", title="paging overhead (same kernel, same values)")
    axes[1].legend(fontsize=7)
    for r in split_rows:
        splits = sorted(r["ms_by_splits"])
        axes[2].plot(splits, [r["ms_by_splits"][s] * 1e3 for s in splits], marker="o",
                     label=f"B{r['batch']} ctx {r['context']}")
    axes[2].set_xscale("log", base=2)
    axes[2].set(xlabel="num_splits", ylabel="us", title="split-K (flash-decoding)")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"paged.kernels.paged_attention_decode on {device_name} (fp16, 32 q / 8 kv heads, d 128)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_check(shapes=None, seed: int = 0) -> list[dict]:
    """Interpreter run on tiny shapes: max error vs ``paged_attention_gather`` and seconds per call.

    ``shapes``: tuples ``(batch, context, block_size, num_splits)`` with 4 query heads over 2 KV heads of
    dim 32, float32. Times are Triton-interpreter seconds on this CPU, not kernel performance.
    """
    from paged.kernels import paged_attention_decode

    shapes = shapes or [(1, 16, 8, 1), (4, 37, 8, 1), (4, 37, 16, 1), (2, 64, 16, 1), (2, 64, 16, 4)]
    rows = []
    for batch, context, block_size, splits in shapes:
        inp = make_inputs(batch, context, block_size, heads=4, kv_heads=2, head_dim=32, dtype=torch.float32,
                          device="cpu", seed=seed)
        args = (inp["query"], inp["key_cache"], inp["value_cache"], inp["block_tables"], inp["context_lens"])
        start = time.perf_counter()
        result = paged_attention_decode(*args, num_splits=splits)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        reference = paged_attention_gather(*args)
        torch_seconds = time.perf_counter() - start
        rows.append({"batch": batch, "context": context, "block_size": block_size, "num_splits": splits,
                     "max_err": (result - reference).abs().max().item(), "interpreter_s": seconds,
                     "torch_gather_s": torch_seconds})
    return rows


def _cpu(quick: bool, out: Path) -> dict:
    from paged.kernels import MODE

    rows = cpu_check()
    print(f"Triton mode: {MODE}. CPU run: correctness and interpreter time only (no bandwidth; run this on a "
          "GPU, e.g. scripts/gpu_check.sh, for kernel performance).")
    for r in rows:
        print(f"B={r['batch']} ctx={r['context']:3d} bs={r['block_size']:2d} splits={r['num_splits']}: "
              f"max err {r['max_err']:.1e}, interpreter {r['interpreter_s']:.2f} s, "
              f"torch gather {r['torch_gather_s'] * 1e3:.2f} ms")
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    labels = [f"B{r['batch']}/ctx{r['context']}/bs{r['block_size']}/s{r['num_splits']}" for r in rows]
    ax.barh(labels, [r["interpreter_s"] for r in rows])
    ax.set_xlabel("seconds per call (Triton interpreter on CPU: not kernel speed)")
    fig.tight_layout()
    fig.savefig(out / "kernel.png", dpi=100)
    plt.close(fig)
    worst = max(r["max_err"] for r in rows)
    return {"mode": "cpu-interpreter", "note": "correctness and Triton-interpreter time on tiny shapes; no GPU "
            "numbers (bandwidth, paged vs contiguous) were measured in this run", "triton_mode": MODE,
            "cpu_rows": rows, "max_err": worst, "correct": worst < 1e-4, "plot": str(out / "kernel.png")}


def run(quick: bool, out: Path) -> dict:
    """Benchmark entry point (see the module docstring); returns JSON-able results."""
    from paged.kernels import HAS_TRITON, REASON

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not HAS_TRITON:
        print(f"skipped: {REASON}")
        return {"mode": "skipped", "reason": REASON}
    if torch.cuda.is_available():
        return _gpu(quick, out)
    return _cpu(quick, out)


if __name__ == "__main__":  # pragma: no cover
    print(run(quick=True, out=Path("bench-results")))
