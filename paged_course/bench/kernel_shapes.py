"""What the kernel benchmark measures, shared by its CPU and GPU runs: the shapes, the inputs, the sides.

The decode shape (32 query heads over 8 KV heads of dim 128: a Llama-3-8B layer), chapter 04's lab steps,
the sweeps, the byte and flop model (:data:`BYTE_FORMULA`; peak HBM bandwidth from spec sheets in
:data:`PEAK_HBM_GBPS`), random inputs on a shuffled paged pool with a contiguous twin, the kernel sides as
closures (:func:`kernel_fn`) and the CUDA-event timer. It runs nothing by itself and draws nothing.
"""

from __future__ import annotations

from pathlib import Path

import torch

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
