"""``python -m paged bench allocator``: what the block allocator and the block manager cost on this CPU.

1. ``BlockAllocator.allocate`` + ``free`` against a bare ``collections.deque`` ``popleft`` + ``append``
   (the least a free list can cost in Python), one block at a time and 64 blocks at a time
   (``allocate_many`` / ``free_many``). The ratio is what the bookkeeping (reference counts, checks)
   costs on top of the bare free list.
2. ``BlockSpaceManager.allocate_slots`` + ``free`` of 64 / 256 / 1024 sequences of 64 blocks each (block
   size 16, 1,024-token prompts, caching off): does the time stay linear in the number of blocks? Reported:
   microseconds per block, and Python function calls per block (cProfile: the amount of work, exact and
   free of timing noise; it stays constant while the time per block rises somewhat as the working
   set outgrows the CPU caches).

Writes ``allocator.png`` into ``out``: ns per block against the deque, and the manager's cost per block
by size. Times are the best of many short repeats, garbage collector off (short runs are rarely interrupted by
other processes on a shared machine, so the minimum is the undisturbed cost).

What to expect: in CPython (3.11) calling a Python method costs about as much as a bare ``popleft`` +
``append`` pair, so one block at a time a method per operation is already ~2.3x the deque with an
empty body (the benchmark measures this floor: ``floor_single``, a class whose ``allocate`` / ``free``
only call ``popleft`` / ``append``). Setting and checking a reference count adds about another 1x, and
checking the id the rest: one at a time the allocator stays above 3x (about 4.4x on the machine that
wrote this). The batch calls pay the call once per 64 blocks and are within 3x. The queue is a plain
``deque`` with lazy deletion for ``take`` (``allocator.py``); the ``OrderedDict`` it replaced cost
about 2x a deque by itself (7.4x / 4.3x before).
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import time
from collections import deque
from pathlib import Path

from matplotlib.figure import Figure

from paged.core.allocator import BlockAllocator
from paged.core.block_manager import BlockSpaceManager
from paged.core.sequence import Sequence


def _best(fn, repeats: int) -> float:
    """Fastest of ``repeats`` runs, garbage collector off (as ``timeit`` does)."""
    best = float("inf")
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    finally:
        gc.enable()
    return best


class _BareFreeList:
    """The least a Python allocator with one method per operation can cost: no ids checked, no counts."""

    def __init__(self, num_blocks: int):
        self.queue = deque(range(num_blocks))

    def allocate(self) -> int:
        return self.queue.popleft()

    def free(self, block_id: int) -> None:
        self.queue.append(block_id)


def allocator_vs_deque(num_ops: int = 2048, repeats: int = 200) -> dict:
    """Nanoseconds per allocate+free pair: BlockAllocator vs deque, single and in batches of 64.

    ``floor_single``: ``_BareFreeList`` one block at a time (the cost of the two method calls alone).
    Every variant is timed ``repeats`` times, interleaved, and its fastest run kept.
    """
    alloc, free_list, bare = BlockAllocator(1024), deque(range(1024)), _BareFreeList(1024)

    def ours_single():
        allocate, free = alloc.allocate, alloc.free
        for _ in range(num_ops):
            free(allocate())

    def deque_single():
        pop, push = free_list.popleft, free_list.append
        for _ in range(num_ops):
            push(pop())

    def floor_single():
        allocate, free = bare.allocate, bare.free
        for _ in range(num_ops):
            free(allocate())

    def ours_batch():
        for _ in range(num_ops // 64):
            alloc.free_many(alloc.allocate_many(64))

    def deque_batch():
        pop, push = free_list.popleft, free_list.append
        for _ in range(num_ops // 64):
            for b in [pop() for _ in range(64)]:
                push(b)

    fns = {
        "ours_single": ours_single,
        "deque_single": deque_single,
        "floor_single": floor_single,
        "ours_batch": ours_batch,
        "deque_batch": deque_batch,
    }
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(
        max(1, repeats // 10)
    ):  # interleaved rounds: a busy spell hits every variant alike
        for name, fn in fns.items():
            best[name] = min(best[name], _best(fn, 10))
    ns = {name: seconds / num_ops * 1e9 for name, seconds in best.items()}
    ns["ratio_single"] = ns["ours_single"] / ns["deque_single"]
    ns["ratio_batch"] = ns["ours_batch"] / ns["deque_batch"]
    ns["ratio_floor_single"] = ns["floor_single"] / ns["deque_single"]
    return ns


def manager_allocate_free(
    num_seqs: int, blocks_per_seq: int = 64, block_size: int = 16, repeats: int = 3
) -> dict:
    """Seconds to allocate then free ``num_seqs`` sequences of ``blocks_per_seq`` full blocks."""
    seqs = [
        Sequence(i, [1 + (i + j) % 500 for j in range(blocks_per_seq * block_size)], block_size)
        for i in range(num_seqs)
    ]
    manager = BlockSpaceManager(block_size, num_seqs * blocks_per_seq, watermark=0.0)

    def once():
        for s in seqs:
            manager.allocate_slots(s)
        for s in seqs:
            manager.free(s)

    seconds = _best(once, repeats)
    assert manager.get_num_free_gpu_blocks() == num_seqs * blocks_per_seq
    profile = cProfile.Profile()
    profile.runcall(once)
    blocks = num_seqs * blocks_per_seq
    return {
        "num_seqs": num_seqs,
        "blocks": blocks,
        "seconds": seconds,
        "us_per_block": seconds / blocks * 1e6,
        "calls_per_block": pstats.Stats(profile).total_calls / blocks,
    }


def run(quick: bool, out: Path) -> dict:
    repeats = 100 if quick else 500
    pair = allocator_vs_deque(2048, repeats)
    print("allocate + free, ns per block (best of", repeats, "runs, CPU)")
    print(
        f"  one at a time : BlockAllocator {pair['ours_single']:7.1f}   deque {pair['deque_single']:6.1f}"
        f"   ratio {pair['ratio_single']:.2f}x"
    )
    print(
        f"    floor: two empty Python methods around the deque {pair['floor_single']:6.1f}"
        f"   ratio {pair['ratio_floor_single']:.2f}x (the call overhead alone, one block at a time)"
    )
    print(
        f"  64 at a time  : BlockAllocator {pair['ours_batch']:7.1f}   deque {pair['deque_batch']:6.1f}"
        f"   ratio {pair['ratio_batch']:.2f}x"
    )
    rows = [manager_allocate_free(n) for n in (64, 256, 1024)]
    print("BlockSpaceManager allocate_slots + free, 64 blocks per sequence (block 16)")
    for r in rows:
        print(
            f"  {r['num_seqs']:5d} seqs  {r['blocks']:6d} blocks  {r['seconds'] * 1e3:8.2f} ms"
            f"  {r['us_per_block']:6.3f} us/block  {r['calls_per_block']:5.2f} Python calls/block"
        )
    spread = max(r["us_per_block"] for r in rows) / min(r["us_per_block"] for r in rows)
    calls = max(r["calls_per_block"] for r in rows) / min(r["calls_per_block"] for r in rows)
    print(
        f"  linear in blocks: calls/block vary {calls:.2f}x (1.00 = the same work per block at every size); "
        f"us/block {spread:.2f}x (CPU caches)"
    )
    plot = plot_results(pair, rows, Path(out) / "allocator.png")
    print(f"  plot: {plot}")
    return {
        "allocator_vs_deque": pair,
        "manager": rows,
        "us_per_block_spread": spread,
        "calls_per_block_spread": calls,
        "plot": str(plot),
    }


def plot_results(pair: dict, rows: list[dict], path: Path) -> Path:
    """Save the two panels as a PNG at ``path`` (a bare ``Figure``: pyplot and its backend are untouched)."""
    fig = Figure(figsize=(10, 3.4))
    ax1, ax2 = fig.subplots(1, 2)
    x = [0, 1]
    for shift, key, label, color in (
        (-0.27, "ours", "BlockAllocator", "#2a9d8f"),
        (0.0, "deque", "bare deque popleft + append", "#8d99ae"),
    ):
        values = [pair[f"{key}_single"], pair[f"{key}_batch"]]
        ax1.bar([i + shift for i in x], values, width=0.27, label=label, color=color)
    ax1.bar(
        [0.27],
        [pair["floor_single"]],
        width=0.27,
        color="#e9c46a",
        label="two empty methods around a deque",
    )
    for i, mode in enumerate(("single", "batch")):
        ax1.text(
            i - 0.27,
            pair[f"ours_{mode}"],
            f"{pair[f'ratio_{mode}']:.1f}x",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax1.set_xticks([0, 0.865], ["one block per call", "64 blocks per call"])
    ax1.set(
        ylabel="ns per block (allocate + free)", title="allocator vs deque (ratio over the deque)"
    )
    ax1.set_ylim(0, 1.5 * max(pair["ours_single"], pair["ours_batch"]))
    ax1.legend(fontsize=7, loc="upper right")
    blocks = [r["blocks"] for r in rows]
    ax2.plot(blocks, [r["us_per_block"] for r in rows], "o-", color="#2a9d8f", label="us per block")
    ax2.set(
        xscale="log",
        xlabel="blocks allocated and freed (64 per sequence)",
        ylabel="us per block",
        title="BlockSpaceManager cost per block (flat = linear)",
    )
    ax2.set_xticks(blocks, [f"{b:,}" for b in blocks])
    ax2.minorticks_off()
    ax2.set_xlim(blocks[0] / 2, blocks[-1] * 2)
    ax2.set_ylim(0, 1.3 * max(r["us_per_block"] for r in rows))
    for r in rows:
        ax2.annotate(
            f"{r['calls_per_block']:.2f} calls/block",
            (r["blocks"], r["us_per_block"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    ax2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
