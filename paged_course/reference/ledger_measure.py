"""The seed claims ledger's measurements: the numbers behind its rows, computed from this package.

Each ``measure_*`` function runs in a second or less on a laptop CPU and returns plain data (dicts,
ints); :func:`measure_all` runs every one that needs neither the engine nor a GPU. It reads the
simulators (``sim``), the memory model and the real block manager; it never imports ``bench`` (a GPU
run's numbers reach the ledger as bench JSON, read by ``ledger.main``) and writes no text: the rows and
the table are ``ledger``'s.
"""

from __future__ import annotations

import numpy as np
import torch

from paged.core.block_manager import BlockSpaceManager
from paged.core.prefix_cache import hash_blocks
from paged.core.sequence import Sequence
from paged_course.reference.memory import KNOWN_MODELS, KVSpec
from paged_course.sim.fragmentation import compare, simulate
from paged_course.sim.prefix_savings import shared_prompt_savings
from paged_course.sim.workload import Trace


def measure_fragmentation(trace: Trace, pool_slots: int = 32768, block_size: int = 16) -> dict:
    """C1, C2, C3: ``FragmentationResult.summary()`` per manager plus the largest empty tail of a paged request."""
    results = compare(trace, pool_slots, block_size)
    out = {name: res.summary() for name, res in results.items()}
    out["paged_max_tail"] = int((-trace.final_len % block_size).max())
    return out


def measure_memory() -> dict:
    """C4, E7, E8: KV bytes per 2048-token sequence (fp16) and bytes per 16-token block of Llama-2-7B."""
    seq = {
        name: KNOWN_MODELS[name].bytes_per_sequence(2048)
        for name in ("llama-2-7b", "llama-2-13b", "llama-2-70b")
    }
    seq["70b-without-gqa"] = KVSpec(80, 64, 128).bytes_per_sequence(2048)
    block = KNOWN_MODELS["llama-2-7b"].bytes_per_block(16)
    return {
        "per_sequence": seq,
        "block_bytes": block,
        "seed_block_bytes": 16 * 2 * 4096 * 32 * 128 * 2,
    }


def measure_chained_keys(block_size: int = 16) -> dict:
    """E3: two prompts with the same first 40 tokens and different tails.

    Per-block chained keys (``hash_blocks``) share the two full blocks of the common part; one
    hash over each whole prompt shares nothing. Equal *tokens* after different prefixes get different
    keys: ``same_block_other_prefix`` must be False.
    """
    common = list(range(100, 140))
    a, b = common + [1, 2, 3], common + [7, 8, 9]
    ka, kb = hash_blocks(a, block_size, []), hash_blocks(b, block_size, [])
    shared_blocks = sum(1 for x, y in zip(ka, kb) if x == y)
    whole_prompt_equal = hash(tuple(a)) == hash(tuple(b))
    block = list(range(16))
    k1 = hash_blocks([5] * 16 + block, block_size, [])[1]
    k2 = hash_blocks([6] * 16 + block, block_size, [])[1]
    return {
        "shared_blocks": shared_blocks,
        "shared_tokens": shared_blocks * block_size,
        "whole_prompt_hash_shares": int(whole_prompt_equal),
        "same_block_other_prefix": k1 == k2,
    }


def measure_cow(prompt_len: int, block_size: int = 16) -> int:
    """E5: copy-on-write pairs when a forked child appends one token after a ``prompt_len``-token parent.

    1 when the shared last block is partially filled (``prompt_len % block_size != 0``), else 0.
    """
    bm = BlockSpaceManager(block_size, 64, watermark=0.0)
    parent = Sequence(0, list(range(2, 2 + prompt_len)), block_size)
    bm.allocate_slots(parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    child.append_token_id(1)
    return len(bm.allocate_slots(child).copies)


def measure_watermark(trace: Trace, pool_slots: int = 32768, watermarks=(0.0, 0.01, 0.05)) -> dict:
    """E9: admission answers at the watermark, and preemptions in the simulator per watermark.

    A pool of 100 blocks with watermark 0.05 (5 blocks) and 12 free: a 10-block prompt waits (``LATER``:
    it would leave 2 < 5 free), a 7-block prompt is admitted, a 96-block prompt is ``NEVER``.
    """
    bm = BlockSpaceManager(16, 100, watermark=0.05)
    bm.allocate_slots(Sequence(0, [3] * (88 * 16), 16))

    def admission(num_blocks: int) -> str:
        seq = Sequence(num_blocks, [4] * (num_blocks * 16), 16)
        if not bm.can_ever_fit(len(seq)):
            return "never"
        if bm.allocate_slots(seq) is None:
            return "later"
        bm.free(seq)
        return "ok"

    answers = {n: admission(n) for n in (10, 7, 96)}
    pre = {
        wm: simulate(trace, pool_slots, "paged", 16, watermark=wm).preemptions for wm in watermarks
    }
    return {
        "free_blocks": bm.get_num_free_gpu_blocks(),
        "admission": answers,
        "preemptions": pre,
    }


def seed_online_softmax(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The fragmentation article's blockwise attention sketch (§3.4) for one head, ``q [D]``, ``k, v [L, D]``.

    Kept as the seed wrote it except ``prev_max``, which it never defines (here: the previous running
    max). Its last line divides by ``output.sum()`` over the head dimension instead of by the running
    denominator: that is error E1. Returns ``[D]``.
    """
    out, max_score = torch.zeros_like(q), torch.tensor(float("-inf"))
    for start in range(0, k.shape[0], block_size):
        scores = k[start : start + block_size] @ q / q.shape[0] ** 0.5
        prev_max, max_score = max_score, torch.maximum(max_score, scores.max())
        out = (
            out * torch.exp(prev_max - max_score)
            + torch.exp(scores - max_score) @ v[start : start + block_size]
        )
    return out / out.sum(dim=-1, keepdim=True)


def measure_online_softmax(
    context: int = 200, head_dim: int = 64, block_size: int = 16, seed: int = 0
) -> dict:
    """E1: relative error ``|out - exact| / |exact|`` (L2 over head_dim) of the corrected blockwise version
    (``paged_course.reference.paged_attention_blockwise``, fp32 inside) and of the seed's sketch, against exact
    softmax attention in float64."""
    from paged_course.reference import paged_attention_blockwise

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(context, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(context, head_dim, generator=gen, dtype=torch.float64)
    exact = torch.softmax(k @ q / head_dim**0.5, dim=0) @ v
    nb = -(-context // block_size)
    pad = nb * block_size - context
    kc = torch.cat([k, k.new_zeros(pad, head_dim)]).view(nb, block_size, 1, head_dim)
    vc = torch.cat([v, v.new_zeros(pad, head_dim)]).view(nb, block_size, 1, head_dim)
    ours = paged_attention_blockwise(
        q.view(1, 1, head_dim),
        kc,
        vc,
        torch.arange(nb, dtype=torch.int32)[None],
        torch.tensor([context], dtype=torch.int32),
    )[0, 0]
    seed_out = seed_online_softmax(q, k, v, block_size)

    def rel(x: torch.Tensor) -> float:
        return float((x - exact).norm() / exact.norm())

    return {"blockwise_err": rel(ours), "seed_err": rel(seed_out)}


def measure_block_tables(num_seqs: int = 3, num_layers: int = 4, block_size: int = 16) -> dict:
    """E6: block tables a manager keeps for ``num_seqs`` sequences of a ``num_layers``-layer model
    (one per sequence: the KV pool has one tensor per layer, indexed by the same block ids)."""
    bm = BlockSpaceManager(block_size, 32, watermark=0.0)
    for i in range(num_seqs):
        bm.allocate_slots(Sequence(i, list(range(2, 2 + 20 + i)), block_size))
    return {"sequences": num_seqs, "layers": num_layers, "block_tables": len(bm.block_tables)}


def block_size_study(
    trace: Trace, pool_slots: int, block_sizes=(1, 8, 16, 32, 64, 128, 256)
) -> list[dict]:
    """C7 / E10: the paged simulator per block size on one trace and pool.

    Per row: ``utilization`` (real / allocated slots), ``mean_running``, ``steps`` to finish the trace,
    ``tokens_per_step`` (generated tokens / steps: throughput when a step's cost does not depend on the
    block size, i.e. ignoring the kernel) and ``preemptions``.
    """
    generated = int(trace.output_len.sum())
    rows = []
    for bs in block_sizes:
        s = simulate(trace, pool_slots, "paged", bs).summary()
        rows.append(
            {
                "block_size": bs,
                "utilization": s["utilization"],
                "mean_running": s["mean_running"],
                "steps": s["steps"],
                "tokens_per_step": generated / s["steps"],
                "preemptions": s["preemptions"],
            }
        )
    return rows


def capacity_at_scale(
    trace: Trace,
    spec: KVSpec,
    budget_bytes: float,
    block_size: int = 16,
    static_len: int | None = None,
) -> dict:
    """How many requests of ``trace`` fit in a KV budget at once: static slots vs paged blocks (vectorized).

    Static pre-allocation gives every request ``static_len`` (default ``trace.max_seq_len``) token slots:
    ``budget // (static_len x bytes per token)`` requests, whatever their lengths. Paged gives a request
    ``ceil(final_len / block_size)`` blocks; for every start ``i`` we count how many consecutive requests
    ``i, i+1, ...`` fit in the budget at their final length (cumulative sums + ``searchsorted``, no loop),
    and report the mean, 5th and 95th percentile. Also: the real-token share of memory tied up by each.

    Raises:
        ValueError: the whole trace fits in the budget at once (no window to measure).
    """
    static_len = static_len or trace.max_seq_len
    static = int(budget_bytes // spec.bytes_per_sequence(static_len))
    blocks = -(-trace.final_len // block_size)
    budget_blocks = int(budget_bytes // spec.bytes_per_block(block_size))
    cum = np.concatenate([[0], np.cumsum(blocks)])
    fit = np.searchsorted(cum, cum[:-1] + budget_blocks, side="right") - 1 - np.arange(trace.n)
    full = fit[
        cum[:-1] + budget_blocks <= cum[-1]
    ]  # windows that did not run off the end of the trace
    if len(full) == 0:
        raise ValueError(
            f"trace too short: all {trace.n} requests ({int(cum[-1])} blocks) fit in the budget of "
            f"{budget_blocks} blocks at once; use a longer trace"
        )
    tokens = float(trace.final_len.sum())
    return {
        "requests": trace.n,
        "budget_bytes": float(budget_bytes),
        "budget_blocks": budget_blocks,
        "static": static,
        "paged_mean": float(full.mean()),
        "paged_p5": float(np.percentile(full, 5)),
        "paged_p95": float(np.percentile(full, 95)),
        "mean_final_len": float(trace.final_len.mean()),
        "static_token_share": tokens / (trace.n * static_len),
        "paged_token_share": tokens / float(blocks.sum() * block_size),
    }


PREFIX_LENS = (9, 100, 500, 1000, 2000)


def measure_all(quick: bool = True) -> dict:
    """Every measurement that needs neither the engine nor a GPU (about a second on a laptop CPU)."""
    from paged_course.sim.workload import chat_trace

    chat = chat_trace(2000, seed=0, max_seq_len=2048)
    short = chat_trace(2000, seed=0, max_seq_len=2048, mean_prompt=19.3, mean_output=58.5)
    return {
        "fragmentation": measure_fragmentation(chat),
        "memory": measure_memory(),
        "prefix": [shared_prompt_savings(n) for n in PREFIX_LENS],
        "chained": measure_chained_keys(),
        "cow": {20: measure_cow(20), 32: measure_cow(32)},
        "watermark": measure_watermark(chat),
        "softmax": measure_online_softmax(),
        "block_tables": measure_block_tables(),
        "block_size": {
            "chat": block_size_study(chat, 32768),
            "short": block_size_study(short, 32768),
        },
    }
