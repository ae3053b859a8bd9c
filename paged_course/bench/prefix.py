"""``python -m paged bench prefix``: what prefix caching costs and what it saves (block manager only).

1. Cost: ``allocate_slots`` of a 2,000-token prompt (block size 16) whose first 1,500 tokens are cached,
   against the same allocation with caching off: the ratio is the price of a hit. Each repeat uses a
   fresh random suffix, so exactly the 93 full blocks of the shared 1,500-token prefix hit (1,488
   tokens). What is timed: ``allocate_slots`` alone, the request's block keys already computed (the scheduler
   hashes a prompt's full blocks once, kept on the sequence, as vLLM v1 does: ``seq.block_hashes``); so the
   timed work is 93 dict lookups with token checks, taking the 93 hit blocks and 32 new ones and
   registering those 32 (2,000 tokens fill all 125 blocks). Also printed: the same allocation of a
   prompt never hashed before (hashing its 125 full blocks inside ``allocate_slots``).
2. Savings (seed claim C5, error E4): 100 requests hold the same system prompt plus a 50-token question
   of their own, all at once. Blocks in use with caching vs without, for several system-prompt
   lengths; and the prefill tokens computed, whose ratio bounds the prompt-phase speed-up.

Writes ``prefix.png`` into ``out``: blocks with and without caching by system-prompt length, and the
allocation times with their ratio.
"""

from __future__ import annotations

import gc
import random
import time
from pathlib import Path

from matplotlib.figure import Figure

from paged.core.block_manager import BlockSpaceManager
from paged.core.sequence import Sequence
from paged_course.sim.prefix_savings import (
    shared_prompt_savings,
)  # re-exported: chapter 05 imports it here

__all__ = ["allocation_cost", "plot_results", "run", "shared_prompt_savings"]


def allocation_cost(
    prompt_len: int = 2000,
    cached_len: int = 1500,
    block_size: int = 16,
    repeats: int = 200,
    seed: int = 0,
) -> dict:
    """Microseconds for ``allocate_slots`` of a ``prompt_len`` prompt, caching on (prefix cached) vs off.

    ``us_on``: the request's block keys computed beforehand (when it is added); ``us_on_with_hashing``:
    a prompt never seen, hashed inside ``allocate_slots``. Best of ``repeats`` each, interleaved. Also
    ``blocks`` (the prompt's table), ``hit_blocks`` (taken from the cache) and ``registered_blocks``
    (its full blocks that were not hits, which allocation registers), caching on.
    """
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 32_000) for _ in range(cached_len)]
    prompts = [
        prefix + [rng.randrange(1, 32_000) for _ in range(prompt_len - cached_len)]
        for _ in range(repeats + 1)
    ]
    managers = {}
    for case, caching in (("us_off", False), ("us_on", True), ("us_on_with_hashing", True)):
        manager = BlockSpaceManager(
            block_size,
            4 * -(-prompt_len // block_size),
            watermark=0.0,
            enable_prefix_caching=caching,
        )
        warm = Sequence(0, prompts[0], block_size)
        manager.allocate_slots(warm)
        manager.free(warm)
        managers[case] = manager
    best = dict.fromkeys(managers, float("inf"))
    cached = {}
    gc.disable()
    try:
        for i, prompt in enumerate(prompts[1:], 1):
            for (
                case,
                manager,
            ) in managers.items():  # interleaved: a busy spell hits every case alike
                seq = Sequence(i, prompt, block_size)
                if case == "us_on":
                    manager.prefix_cache.update_hashes(seq)  # hashed once beforehand (not timed)
                t0 = time.perf_counter()
                manager.allocate_slots(seq)
                best[case] = min(best[case], time.perf_counter() - t0)
                cached[case] = seq.num_cached_tokens
                if case == "us_on":
                    blocks = len(manager.get_block_table(seq))
                manager.free(seq)
    finally:
        gc.enable()
    result = {case: seconds * 1e6 for case, seconds in best.items()}
    result["cached_tokens"] = cached["us_on"]
    result["blocks"] = blocks
    result["hit_blocks"] = cached["us_on"] // block_size
    result["registered_blocks"] = prompt_len // block_size - result["hit_blocks"]
    result["ratio"] = result["us_on"] / result["us_off"]
    result["ratio_with_hashing"] = result["us_on_with_hashing"] / result["us_off"]
    return result


def run(quick: bool, out: Path) -> dict:
    cost = allocation_cost(repeats=100 if quick else 500)
    print(
        f"allocate_slots for a 2,000-token prompt (block 16), best of {100 if quick else 500}, CPU:"
    )
    print(
        f"  caching off {cost['us_off']:7.1f} us | caching on, {cost['cached_tokens']} tokens cached, "
        f"keys hashed when the request was added {cost['us_on']:7.1f} us | ratio {cost['ratio']:.2f}x"
    )
    print(
        f"  caching on, prompt hashed inside allocate_slots (never seen before) {cost['us_on_with_hashing']:7.1f} us"
        f" | ratio {cost['ratio_with_hashing']:.2f}x"
    )
    lengths = [9, 16, 100, 500, 1000, 2000]
    rows = [shared_prompt_savings(n) for n in lengths]
    print("100 concurrent requests: shared system prompt + 50-token question each, block 16")
    print(
        f"  {'system':>6} {'blocks off':>10} {'blocks on':>9} {'on/off':>7} {'saved':>6} {'prefill off':>11} "
        f"{'prefill on':>10} {'bound':>6}"
    )
    for r in rows:
        print(
            f"  {r['system_len']:6d} {r['blocks_without']:10d} {r['blocks_with']:9d} {r['blocks_ratio']:7.1%} "
            f"{r['block_saving']:6.1%} {r['prefill_without']:11d} {r['prefill_with']:10d} {r['speedup_bound']:5.1f}x"
        )
    at_1000 = next(r for r in rows if r["system_len"] == 1000)
    print(
        f"  at 1,000 tokens: blocks with caching = {at_1000['blocks_ratio']:.1%} of blocks without"
    )
    plot = plot_results(cost, rows, Path(out) / "prefix.png")
    print(f"  plot: {plot}")
    return {"allocation_cost": cost, "savings": rows, "plot": str(plot)}


def plot_results(cost: dict, rows: list[dict], path: Path) -> Path:
    """Save the two panels as a PNG at ``path`` (a bare ``Figure``: pyplot and its backend are untouched)."""
    fig = Figure(figsize=(10, 3.4))
    ax1, ax2 = fig.subplots(1, 2)
    lengths = [r["system_len"] for r in rows]
    ax1.plot(
        lengths, [r["blocks_without"] for r in rows], "s-", color="#8d99ae", label="caching off"
    )
    ax1.plot(lengths, [r["blocks_with"] for r in rows], "o-", color="#2a9d8f", label="caching on")
    for r in rows:
        label = f"{r['block_saving']:.0%}" + (" saved" if r is rows[-1] else "")
        ax1.annotate(
            label,
            (r["system_len"], r["blocks_with"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(0, 7),
            ha="right" if r is rows[-1] else "center",
        )
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="shared system prompt (tokens)",
        ylabel="blocks in use",
        title=f"{rows[0]['num_requests']} requests, {rows[0]['question_len']}-token questions, "
        f"block {rows[0]['block_size']}",
    )
    ax1.set_xticks(lengths, [str(n) for n in lengths])
    ax1.minorticks_off()
    ax1.legend(fontsize=8)
    cases = [
        ("caching off", cost["us_off"], "#8d99ae"),
        (f"on, keys\nprecomputed\n({cost['ratio']:.1f}x)", cost["us_on"], "#2a9d8f"),
        (
            f"on, hashed in\nallocate_slots\n({cost['ratio_with_hashing']:.1f}x)",
            cost["us_on_with_hashing"],
            "#e9c46a",
        ),
    ]
    ax2.bar([c[0] for c in cases], [c[1] for c in cases], color=[c[2] for c in cases])
    ax2.set(
        ylabel="us per allocate_slots (best run, CPU)",
        title=f"allocate_slots for 2,000 tokens, {cost['cached_tokens']} cached (ratio vs off)",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
