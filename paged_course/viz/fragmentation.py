"""Pictures of KV-cache waste (chapter 01): utilization over time, the pool at one step, a widget.

``plot_held_slots`` draws the held slots of a few single requests, split by ``slot_kinds``;
``plot_utilization`` stacks the per-step shares of the pool (real tokens, reserved, internal waste,
external fragmentation, free) for each manager; ``pool_snapshot`` / ``plot_pool_strip`` draw the pool
slot by slot at one step, each request in its own color, waste in grey; ``fragmentation_widget``
re-runs a small simulation when a slider moves (block size, max length, load) and redraws.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from paged_course.sim.fragmentation import KINDS, MANAGERS, FragmentationResult, compare, slot_kinds
from paged_course.sim.workload import Trace, chat_trace

COLORS = {
    "real": "#2a9d8f",
    "reserved": "#e9c46a",
    "internal": "#8d99ae",
    "external": "#d62828",
    "free": "#f4f4f4",
}
LABELS = {
    "real": "real tokens",
    "reserved": "reserved (future tokens)",
    "internal": "internal waste",
    "external": "external fragmentation",
    "free": "free",
}


def _binned(values: np.ndarray, bins: int) -> np.ndarray:
    """Mean over ``bins`` equal chunks of steps (plots of 100,000 steps stay light)."""
    if len(values) <= bins:
        return values.astype(float)
    edges = np.linspace(0, len(values), bins + 1).astype(int)
    return np.add.reduceat(values.astype(float), edges[:-1]) / np.diff(edges)


def plot_utilization(results: dict[str, FragmentationResult], bins: int = 400, axes=None):
    """Stacked areas of each kind's share of the pool over time, one panel per manager."""
    if axes is None:
        _, axes = plt.subplots(
            len(results), 1, figsize=(9, 2.2 * len(results)), sharex=True, squeeze=False
        )
        axes = axes[:, 0]
    longest = max(r.num_steps for r in results.values())
    for ax, (name, res) in zip(axes, results.items()):
        shares = [getattr(res, k) / res.pool_slots for k in KINDS]
        shares.append(1 - res.allocated / res.pool_slots - res.external / res.pool_slots)
        x = _binned(np.arange(res.num_steps), bins)
        ax.stackplot(
            x,
            *[_binned(s, bins) for s in shares],
            colors=[COLORS[k] for k in (*KINDS, "free")],
            labels=[LABELS[k] for k in (*KINDS, "free")],
        )
        util = res.summary()["utilization"]
        ax.set_title(
            f"{name}: {util:.1%} of allocated slots hold tokens, {res.num_steps} steps", fontsize=10
        )
        ax.set_ylim(0, 1)
        ax.set_xlim(0, longest)
        ax.set_ylabel("share of pool")
    axes[-1].set_xlabel("decode step")
    axes[0].legend(loc="lower right", fontsize=7, ncol=5, bbox_to_anchor=(1, 1.15))
    return axes


def pool_snapshot(res: FragmentationResult, step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, kind)`` arrays of length ``pool_slots`` at ``step``: request id (-1 none) and index into
    ``("real", "reserved", "internal", "external", "free")``. Paged block ids come from replaying the
    allocations up to ``step`` with a LIFO free list (as vLLM v0's naive allocator)."""
    seg = res.segments
    owner = np.full(res.pool_slots, -1)
    kind = np.full(res.pool_slots, 4)
    live = (seg["start"] <= step) & (step < seg["end"])
    length = seg["init"] + step - seg["start"]
    if res.manager != "paged":
        for i in np.flatnonzero(live):
            off, tokens, final, reserve = (
                seg["offset"][i],
                length[i],
                seg["final"][i],
                seg["reserve"][i],
            )
            owner[off : off + reserve] = seg["req"][i]
            (
                kind[off : off + tokens],
                kind[off + tokens : off + final],
                kind[off + final : off + reserve],
            ) = 0, 1, 2
    else:
        bs = res.block_size
        events = []  # (step, 0 = free / 1 = allocate, segment, blocks)
        for i in np.flatnonzero(seg["start"] <= step):
            last = min(step, seg["end"][i] - 1)
            blocks_then = -(
                -(seg["init"][i] + np.arange(seg["start"][i], last + 1) - seg["start"][i]) // bs
            )
            grow = np.flatnonzero(np.diff(blocks_then)) + 1
            events.append((seg["start"][i], 1, i, blocks_then[0]))
            events += [(seg["start"][i] + g, 1, i, 1) for g in grow]
            if seg["end"][i] <= step:
                events.append((seg["end"][i], 0, i, 0))
        free = list(range(res.pool_slots // bs - 1, -1, -1))
        table: dict[int, list[int]] = {}
        for _, alloc, i, count in sorted(events):
            if alloc:
                table.setdefault(i, []).extend(free.pop() for _ in range(count))
            else:
                free.extend(reversed(table.pop(i)))
        for i, blocks in table.items():
            slots = (np.array(blocks)[:, None] * bs + np.arange(bs)).ravel()
            owner[slots] = seg["req"][i]
            final_slot = min(seg["final"][i], len(slots))
            (
                kind[slots[: length[i]]],
                kind[slots[length[i] : final_slot]],
                kind[slots[final_slot:]],
            ) = 0, 1, 2
    if res.external[min(step, res.num_steps - 1)] > 0:
        kind[kind == 4] = 3
    return owner, kind


def plot_pool_strip(
    results: dict[str, FragmentationResult], step: int, width: int | None = None, ax=None
):
    """The pool at ``step``, one row per manager: each request's tokens in its own color, its reserved
    slots in a pale version of it, internal waste grey, external fragmentation red, free white."""
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.6 + 0.5 * len(results)))
    palette = [
        c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (6, 7, 14, 15)
    ]  # no red/grey
    rows = []
    for res in results.values():
        owner, kind = pool_snapshot(res, step)
        rgb = np.array([to_rgb(COLORS[k]) for k in (*KINDS, "free")])[kind]
        mine = owner >= 0
        base = np.array(palette)[owner[mine] % len(palette)]
        rgb[mine & (kind == 0)] = base[kind[mine] == 0]
        rgb[mine & (kind == 1)] = 0.4 * base[kind[mine] == 1] + 0.6
        rows.append(rgb[:width] if width else rgb)
    ax.imshow(np.stack(rows), aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(results)), list(results))
    ax.set_xlabel("slot in the KV pool")
    ax.set_title(
        f"the pool at step {step} (colors: requests; pale: reserved; grey: internal waste; "
        "red: external fragmentation)",
        fontsize=9,
    )
    ax.legend(
        handles=[Patch(color=COLORS[k], label=LABELS[k]) for k in ("internal", "external", "free")],
        fontsize=7,
        loc="upper right",
        bbox_to_anchor=(1, -0.35),
        ncol=3,
    )
    return ax


def plot_held_slots(rows: list[tuple[str, int, int, int]], block_size: int | None = None, ax=None):
    """One bar per ``(label, tokens now, final tokens, held slots)``: its slots split into real, reserved and
    internal by ``slot_kinds``; dotted lines mark block boundaries on the rows whose label says ``paged``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 0.8))
    for y, (label, tokens, final, held) in enumerate(rows[::-1]):
        left = 0
        for kind, width in zip(KINDS, (int(a[0]) for a in slot_kinds([tokens], [final], [held]))):
            ax.barh(
                y,
                width,
                left=left,
                color=COLORS[kind],
                edgecolor="white",
                linewidth=0.5,
                label=LABELS[kind] if y == 0 else None,
            )
            left += width
        if block_size and "paged" in label:
            for edge in range(block_size, held, block_size):
                ax.plot([edge, edge], [y - 0.4, y + 0.4], ":", color="black", linewidth=0.8)
        ax.text(held + 1, y, f"{held} slots", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows[::-1]], fontsize=8)
    ax.set_xlabel("token slots held by one request")
    ax.legend(fontsize=7, ncol=3, loc="lower right", bbox_to_anchor=(1, 1))
    return ax


def plot_shares(results: dict[str, FragmentationResult], ax=None):
    """One horizontal stacked bar per manager: time-averaged share of the pool by kind."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.4))
    left = np.zeros(len(results))
    for k in (*KINDS, "free"):
        widths = np.array([r.summary()[f"{k}_share"] for r in results.values()])
        ax.barh(list(results), widths, left=left, color=COLORS[k], label=LABELS[k])
        left += widths
    ax.set_xlim(0, 1)
    ax.set_xlabel("time-averaged share of the pool")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return ax


def small_comparison(
    block_size: int = 16,
    max_seq_len: int = 2048,
    load: float = 1.0,
    num_requests: int = 400,
    pool_slots: int = 16384,
    seed: int = 0,
) -> tuple[Trace, dict[str, FragmentationResult]]:
    """A quick run for the widget: ``load`` = arrival rate / what the paged pool can serve (about)."""
    trace = chat_trace(num_requests, seed=seed, max_seq_len=max_seq_len)
    capacity = pool_slots / trace.final_len.mean() / trace.output_len.mean()  # requests per step
    trace = chat_trace(
        num_requests, seed=seed, max_seq_len=max_seq_len, arrival_rate=load * capacity
    )
    return trace, compare(trace, pool_slots, block_size)


def fragmentation_widget(num_requests: int = 400, pool_slots: int = 16384):
    """Sliders for block size, max length and load; each change re-runs ``small_comparison`` and redraws.
    Returns the widget (display it), or None with a static figure when ipywidgets is missing."""

    def draw(block_size=16, max_seq_len=2048, load=1.0):
        _, results = small_comparison(block_size, max_seq_len, load, num_requests, pool_slots)
        fig, ax = plt.subplots(figsize=(8, 2.4))
        plot_shares(results, ax)
        ax.set_title(
            f"block_size {block_size}, max_seq_len {max_seq_len}, load {load:.2f}: paged uses "
            f"{results['paged'].summary()['utilization']:.1%} of its slots",
            fontsize=9,
        )
        plt.show()

    try:
        import ipywidgets as widgets
    except ImportError:
        draw()
        return None
    fit = {
        "style": {"description_width": "initial"},
        "layout": widgets.Layout(width="420px"),
    }  # full labels
    return widgets.interactive(
        draw,
        block_size=widgets.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=16, description="block_size", **fit
        ),
        max_seq_len=widgets.SelectionSlider(
            options=[512, 1024, 2048, 4096, 8192], value=2048, description="max_seq_len", **fit
        ),
        load=widgets.FloatSlider(
            value=1.0, min=0.25, max=2.0, step=0.25, description="load", **fit
        ),
    )


__all__ = [
    "plot_utilization",
    "pool_snapshot",
    "plot_pool_strip",
    "plot_shares",
    "small_comparison",
    "fragmentation_widget",
    "MANAGERS",
]
