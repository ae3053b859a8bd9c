"""Pictures for chapter 08 (measuring it): block-size study, throughput against concurrency, capacity.

Each function draws into new axes (or the ``ax`` given) and returns the axes; the data come from
``paged_course.reference.ledger`` (``block_size_study``, ``capacity_at_scale``) and ``paged_course.bench.engine``
(``concurrency_sweep`` rows: ``concurrency``, ``paged_tok_s``, ``hf_tok_s``). ``block_size_widget`` re-runs
the chapter-01 simulator (``paged_course.sim.fragmentation`` through ``ledger.block_size_study``) per trace and pool.
"""

from __future__ import annotations

from functools import lru_cache

import matplotlib.pyplot as plt
import numpy as np

from paged_course.reference import ledger
from paged_course.sim.workload import chat_trace


def plot_block_size_study(studies: dict[str, list[dict]], reference: int = 16, axes=None):
    """Two panels per trace name: slot utilization, and simulated throughput relative to ``reference``.

    ``studies`` maps a trace name to ``reference.ledger.block_size_study`` rows.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for name, rows in studies.items():
        sizes = [r["block_size"] for r in rows]
        ref = next(r["tokens_per_step"] for r in rows if r["block_size"] == reference)
        axes[0].plot(sizes, [100 * r["utilization"] for r in rows], marker="o", label=name)
        axes[1].plot(sizes, [r["tokens_per_step"] / ref for r in rows], marker="o", label=name)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.axvline(reference, color="gray", linestyle=":", linewidth=1)
        ax.set_xlabel("block size (tokens)")
        ax.legend(fontsize=8)
    axes[0].set(
        ylabel="% of allocated slots holding tokens",
        title="memory: internal waste grows with the block",
    )
    axes[1].axhline(1.0, color="gray", linewidth=0.8)
    axes[1].set(
        ylabel=f"tokens per step / block {reference}",
        title="simulated throughput (kernel cost not modelled)",
    )
    return axes


def plot_kernel_block_sizes(rows: list[dict], ax=None):
    """GPU kernel time per block size from ``bench kernel`` JSON rows (``results["sweep"]``)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    for batch, context in sorted({(r["batch"], r["context"]) for r in rows}):
        sel = sorted(
            (r for r in rows if (r["batch"], r["context"]) == (batch, context)),
            key=lambda r: r["block_size"],
        )
        ax.plot(
            [r["block_size"] for r in sel],
            [r["paged_ms"] * 1e3 for r in sel],
            marker="o",
            label=f"batch {batch}, context {context}",
        )
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="block size (tokens)",
        ylabel="kernel time (us)",
        yscale="log",
        title="paged decode kernel (GPU)",
    )
    ax.legend(fontsize=7)
    return ax


def plot_concurrency(rows: list[dict], ax=None, device: str = "cpu"):
    """Useful tokens per second against concurrency: this engine vs transformers ``generate``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    levels = [r["concurrency"] for r in rows]
    ax.plot(
        levels, [r["paged_tok_s"] for r in rows], marker="o", label="paged engine (LLM.generate)"
    )
    ax.plot(
        levels,
        [r["hf_tok_s"] for r in rows],
        marker="s",
        label="transformers generate (static batch)",
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set(
        xlabel="requests at once",
        ylabel="generated tokens / s",
        title=f"throughput against concurrency ({device})",
    )
    ax.legend(fontsize=8)
    return ax


def plot_capacity(cap: dict, label: str = "", ax=None):
    """Requests that fit at once in one KV budget: static pre-allocation vs paged (5th-95th percentile bar)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    values = [cap["static"], cap["paged_mean"]]
    err = np.array(
        [[0, cap["paged_mean"] - cap["paged_p5"]], [0, cap["paged_p95"] - cap["paged_mean"]]]
    )
    ax.bar(
        ["static\n(max_seq_len slots each)", "paged\n(blocks for the real length)"],
        values,
        yerr=err,
        capsize=6,
        color=["#8d99ae", "#2a9d8f"],
    )
    for i, v in enumerate(values):
        ax.text(i + 0.3, v, f"{v:.0f}", ha="center", va="bottom")
    ax.set(ylabel="requests at once", title=label or "maximum concurrency in one KV budget")
    return ax


# ---- the block-size explorer (chapter 08) -----------------------------------------------------------
CHAT = "chat-like (ShareGPT means)"
TRACES = {CHAT: {}, "short requests (Alpaca means)": {"mean_prompt": 19.3, "mean_output": 58.5}}
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


@lru_cache(maxsize=16)
def _study(trace_name: str, pool_slots: int, num_requests: int) -> tuple:
    """``reference.ledger.block_size_study`` rows for one trace and pool (cached: a redraw after a block-size
    move costs only the plot; a new trace or pool runs 7 simulations, ~0.1-0.3 s for 2,000 requests)."""
    trace = chat_trace(num_requests, seed=0, max_seq_len=2048, **TRACES[trace_name])
    return tuple(ledger.block_size_study(trace, pool_slots, BLOCK_SIZES))


def draw_block_size_choice(
    block_size: int = 16,
    trace_name: str = CHAT,
    pool_slots: int = 32768,
    num_requests: int = 2000,
    axes=None,
) -> dict:
    """``plot_block_size_study`` for one trace with ``block_size`` ringed; returns its row plus
    ``vs_16`` (simulated throughput relative to block 16)."""
    rows = list(_study(trace_name, pool_slots, num_requests))
    axes = plot_block_size_study({trace_name: rows}, axes=axes)
    row = dict(next(r for r in rows if r["block_size"] == block_size))
    row["vs_16"] = row["tokens_per_step"] / next(
        r["tokens_per_step"] for r in rows if r["block_size"] == 16
    )
    for ax, y in ((axes[0], 100 * row["utilization"]), (axes[1], row["vs_16"])):
        ax.plot(
            [block_size],
            [y],
            "o",
            markersize=14,
            markerfacecolor="none",
            markeredgecolor="#d62828",
            markeredgewidth=2,
        )
    axes[0].set_ylim(0, 105)  # fixed scales: moving a control moves the curves, not the axes
    ref = row["tokens_per_step"] / row["vs_16"]
    axes[1].set_ylim(0, max(1.2, 1.1 * max(r["tokens_per_step"] for r in rows) / ref))
    axes[0].figure.suptitle(
        f"{trace_name}, pool of {pool_slots:,} slots, block {block_size}:\n"
        f"{row['utilization']:.1%} of allocated slots hold tokens, "
        f"{row['mean_running']:.0f} requests running on average, "
        f"{row['vs_16']:.2f}x the tokens/step of block 16",
        fontsize=10,
        y=1.08,
    )
    return row


def block_size_widget(num_requests: int = 2000):
    """A block-size slider, a trace dropdown and a pool-size slider over ``draw_block_size_choice``.
    Returns the widget (display it), or None after drawing the default figure without ipywidgets."""

    def draw(block_size=16, trace=CHAT, pool_slots=32768):
        draw_block_size_choice(block_size, trace, pool_slots, num_requests)
        plt.show()

    try:
        import ipywidgets as widgets
    except ImportError:
        draw()
        return None
    style = {"description_width": "initial"}
    return widgets.interactive(
        draw,
        block_size=widgets.SelectionSlider(
            options=list(BLOCK_SIZES),
            value=16,
            description="block size (tokens)",
            style=style,
            continuous_update=False,
            layout=widgets.Layout(width="420px"),
        ),
        trace=widgets.Dropdown(
            options=list(TRACES),
            description="trace",
            style=style,
            layout=widgets.Layout(width="420px"),
        ),
        pool_slots=widgets.SelectionSlider(
            options=[4096, 8192, 16384, 32768, 65536],
            value=32768,
            description="KV pool (token slots)",
            style=style,
            continuous_update=False,
            layout=widgets.Layout(width="420px"),
        ),
    )
