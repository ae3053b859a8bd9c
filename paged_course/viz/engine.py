"""Plots for chapter 07 (the engine): static vs continuous batching, one step's block tables, a run's timeline.

``batching_schedules`` computes, for a list of output lengths and a number of batch slots, which
request occupies which slot at each decode iteration under *static* batching (a batch ends when its
longest request ends; finished requests keep their slot idle) and *continuous* batching (a finished
request's slot is refilled at the next iteration, Orca / vLLM style). ``plot_batching`` draws both.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle


def batching_schedules(output_lens: list[int], slots: int) -> dict:
    """Slot timelines for static and continuous batching of requests with these output lengths (tokens).

    Returns ``{"static": spans, "continuous": spans, "static_steps", "continuous_steps",
    "static_busy", "continuous_busy"}`` where ``spans`` lists ``(request, slot, start, end)`` in
    iterations and ``*_busy`` is the share of slot-iterations that produce a token.

    Raises:
        ValueError: ``slots < 1`` or a length < 1.
    """
    if slots < 1 or any(n < 1 for n in output_lens):
        raise ValueError(
            f"need slots >= 1 and lengths >= 1, got slots={slots}, lengths={output_lens}"
        )
    static, t = [], 0
    for first in range(0, len(output_lens), slots):
        batch = output_lens[first : first + slots]
        static += [(first + i, i, t, t + n) for i, n in enumerate(batch)]
        t += max(batch)
    static_steps = t
    free_at = [0] * slots
    continuous = []
    for r, n in enumerate(output_lens):  # FCFS: the next request takes the slot that frees first
        slot = int(np.argmin(free_at))
        continuous.append((r, slot, free_at[slot], free_at[slot] + n))
        free_at[slot] += n
    continuous_steps = max(free_at)
    work = sum(output_lens)
    return {
        "static": static,
        "continuous": continuous,
        "static_steps": static_steps,
        "continuous_steps": continuous_steps,
        "static_busy": work / (slots * static_steps),
        "continuous_busy": work / (slots * continuous_steps),
    }


def plot_batching(output_lens: list[int], slots: int = 4):
    """Two Gantt charts, one row per batch slot: static batching (idle slots hatched) vs continuous."""
    sched = batching_schedules(output_lens, slots)
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(output_lens), 2)))
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.2), sharex=True)
    for ax, kind in zip(axes, ("static", "continuous")):
        steps = sched[f"{kind}_steps"]
        for r, slot, start, end in sched[kind]:
            ax.add_patch(Rectangle((start, slot), end - start, 0.85, color=colors[r], ec="white"))
            ax.text((start + end) / 2, slot + 0.42, str(r), ha="center", va="center", fontsize=7)
        if kind == "static":
            t = 0
            for first in range(0, len(output_lens), slots):
                batch = output_lens[first : first + slots]
                for i, n in enumerate(batch):
                    ax.add_patch(
                        Rectangle(
                            (t + n, i),
                            max(batch) - n,
                            0.85,
                            fill=False,
                            hatch="///",
                            ec="#999999",
                            lw=0,
                        )
                    )
                t += max(batch)
                ax.axvline(t, color="black", lw=0.8, ls=":")
        ax.set(
            xlim=(0, max(sched["static_steps"], sched["continuous_steps"])),
            ylim=(-0.1, slots),
            yticks=[i + 0.42 for i in range(slots)],
            yticklabels=[f"slot {i}" for i in range(slots)],
        )
        ax.set_title(
            f"{kind} batching: {steps} iterations, {sched[f'{kind}_busy']:.0%} of slot-iterations "
            "produce a token",
            fontsize=9,
        )
    axes[-1].set_xlabel("decode iteration")
    fig.tight_layout()
    return fig


def plot_block_tables(
    tables: dict[str, list[int]],
    num_blocks: int,
    block_size: int,
    lengths: dict[str, int] | None = None,
):
    """The KV pool as a row of ``num_blocks`` blocks, colored by the sequence(s) whose block table holds each.

    ``tables`` maps a sequence label to its block table; ``lengths`` (tokens) is printed in the legend.
    A block in several tables (prefix sharing, fork) is split between their colors, with a count.
    """
    fig, ax = plt.subplots(figsize=(min(12, 0.45 * num_blocks + 2), 1.6 + 0.3 * len(tables)))
    colors = plt.cm.tab10(np.arange(len(tables)) % 10)
    owners: dict[int, list[int]] = {}
    for i, table in enumerate(tables.values()):
        for b in table:
            owners.setdefault(b, []).append(i)
    for b in range(num_blocks):
        ax.add_patch(Rectangle((b, 0), 0.92, 1, fill=False, ec="#bbbbbb"))
        for k, i in enumerate(owners.get(b, [])):
            n = len(owners[b])
            ax.add_patch(Rectangle((b, k / n), 0.92, 1 / n, color=colors[i], alpha=0.85))
        if len(owners.get(b, [])) > 1:
            ax.text(
                b + 0.46,
                0.5,
                f"x{len(owners[b])}",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
        ax.text(b + 0.46, -0.25, str(b), ha="center", va="center", fontsize=7)
    for i, (label, table) in enumerate(tables.items()):
        fill = f", {lengths[label]} tokens" if lengths and label in lengths else ""
        ax.text(
            num_blocks + 0.3,
            1 - (i + 0.5) / len(tables),
            f"{label}: {table}{fill}",
            fontsize=8,
            color=colors[i],
            va="center",
        )
    ax.set(xlim=(0, num_blocks + 0.1), ylim=(-0.5, 1.05), xticks=[], yticks=[])
    ax.set_title(
        f"KV pool: {num_blocks} blocks x {block_size} slots; color = sequence whose block table "
        "points there",
        fontsize=9,
    )
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return fig


def plot_timeline(history: list[dict], num_blocks: int):
    """A run step by step (``LLMEngine.history``): tokens computed (prefill / decode) and KV blocks in use."""
    steps = np.arange(len(history))
    prefill = np.array([h["prefill_tokens"] for h in history])
    decode = np.array([h["decode_seqs"] for h in history])
    used = np.array([h["used_blocks"] for h in history])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 4), sharex=True)
    ax1.bar(steps, prefill, color="#e76f51", label="prefill tokens")
    ax1.bar(
        steps,
        decode,
        bottom=prefill,
        color="#2a9d8f",
        label="decode tokens (one per running sequence)",
    )
    ax1.set(ylabel="tokens / step")
    ax1.legend(fontsize=8)
    ax2.plot(steps, used, color="#264653")
    ax2.axhline(num_blocks, color="#999999", ls="--", lw=1)
    ax2.set(xlabel="engine step", ylabel="KV blocks in use", ylim=(0, num_blocks * 1.08))
    for i, h in enumerate(history):
        if h["preempted"]:
            ax2.axvline(i, color="#e63946", lw=1, alpha=0.6)
    ax2.set_title("blocks in use (dashed: pool size; red: a preemption)", fontsize=9)
    fig.tight_layout()
    return fig
