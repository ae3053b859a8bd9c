"""Pictures of chunked prefill's latency trade-off (Sarathi-Serve, Agrawal et al., OSDI 2024).

- ``plot_budget_sweep``: p50 / p99 inter-token latency, p50 / p99 time to first token and throughput
  against the token budget, from ``paged_course.bench.latency.simulate_budgets`` rows (chunking off drawn
  as a dashed line at its own level).
- ``plot_engine_latency``: the engine's p50 / p99 TTFT and ITL, chunking off against on, as bars, from
  ``paged_course.bench.latency.compare_engine``.
- ``plot_step_times``: how long each engine step took, chunking off against on: whole prompts show as
  tall spikes that every decoding request waits through.
- ``plot_latency``: the three side by side (what ``python -m paged bench engine --out DIR`` saves).

Every function draws into new axes (or the ``ax`` / ``axes`` given) and returns them (``plot_latency``
returns the figure). Times are plotted in milliseconds.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

COLORS = {"off": "#8d99ae", "on": "#2a9d8f"}


def _plain_log_y(ax) -> None:
    """A log y axis labelled 10, 20, 50, 100 ... instead of powers of ten."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_budget_sweep(rows: list[dict], axes=None, unit: str = "cost model"):
    """Three panels against the budget (log scale): ITL p50 / p99, TTFT p50 / p99, throughput vs off.

    ``rows``: dicts with ``budget`` (``None`` = chunking off), ``ttft_p50``, ``ttft_p99``, ``itl_p50``,
    ``itl_p99`` (seconds) and ``tok_s``; at least one chunked row and one off row.

    Raises:
        ValueError: no row with ``budget=None`` or no chunked row.
    """
    off = next((r for r in rows if r["budget"] is None), None)
    chunked = sorted((r for r in rows if r["budget"] is not None), key=lambda r: r["budget"])
    if off is None or not chunked:
        raise ValueError(
            "plot_budget_sweep needs a row with budget=None (chunking off) and at least one budget"
        )
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    budgets = [r["budget"] for r in chunked]
    for ax, name, title in (
        (axes[0], "itl", "inter-token latency"),
        (axes[1], "ttft", "time to first token"),
    ):
        for tag, marker, style in (("p99", "o", "-"), ("p50", "s", "--")):
            (line,) = ax.plot(
                budgets,
                [1e3 * r[f"{name}_{tag}"] for r in chunked],
                marker=marker,
                linestyle=style,
                label=f"{tag} chunked",
            )
            ax.axhline(
                1e3 * off[f"{name}_{tag}"],
                color=line.get_color(),
                linestyle=":",
                linewidth=1.2,
                label=f"{tag} whole prompts",
            )
        ax.set(ylabel=f"ms ({unit})", title=title)
        _plain_log_y(ax)
    axes[2].plot(
        budgets,
        [r["tok_s"] / off["tok_s"] for r in chunked],
        marker="o",
        color=COLORS["on"],
        label="chunked",
    )
    axes[2].axhline(1.0, color=COLORS["off"], linestyle=":", linewidth=1.2, label="whole prompts")
    axes[2].set(ylabel="throughput / whole prompts", title="throughput")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("token budget per step")
        ax.legend(fontsize=7)
    return axes


def plot_engine_latency(result: dict, ax=None, device: str = "cpu"):
    """Bars of TTFT and ITL p50 / p99 (ms), whole prompts against chunked, from ``compare_engine``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    keys = ["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]
    width = 0.38
    for i, (name, label) in enumerate(
        (("off", "whole prompts"), ("on", f"chunked, budget {result['budget']}"))
    ):
        r = result[name]
        xs = [k + (i - 0.5) * width for k in range(len(keys))]
        ax.bar(
            xs,
            [1e3 * r[k] for k in keys],
            width,
            color=COLORS[name],
            label=f"{label}: {r['tok_s']:.0f} tokens/s",
        )
    ax.set_xticks(range(len(keys)), [k.replace("_", " ").upper().replace(" P", " p") for k in keys])
    ax.set(
        ylabel=f"ms ({device})",
        title=f"engine: p99 ITL {result['itl_p99_ratio']:.1f}x lower, "
        f"throughput {result['throughput_change']:+.1%}",
    )
    _plain_log_y(ax)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, frameon=False)
    return ax


def plot_step_times(result: dict, ax=None, device: str = "cpu"):
    """Seconds of each engine step (ms) in step order, whole prompts against chunked (``compare_engine``'s
    ``off`` / ``on`` runs with their ``step_seconds``)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    for name, label in (("off", "whole prompts"), ("on", f"chunked, budget {result['budget']}")):
        steps = result[name]["step_seconds"]
        ax.plot(
            range(1, len(steps) + 1),
            [1e3 * s for s in steps],
            color=COLORS[name],
            linewidth=1,
            label=label,
        )
    ax.set(
        xlabel="engine step",
        ylabel=f"step time (ms, {device})",
        title="a whole long prompt stalls the step; chunks bound it",
    )
    _plain_log_y(ax)
    ax.legend(fontsize=7)
    return ax


def plot_latency(engine: dict, sim_rows: list[dict], device: str = "cpu"):
    """The engine's bars and step times (top) and the simulator's budget sweep (bottom); returns the figure."""
    fig = plt.figure(figsize=(13, 7.6))
    grid = fig.add_gridspec(2, 3, height_ratios=[1, 1], hspace=0.75, wspace=0.3)
    plot_engine_latency(engine, fig.add_subplot(grid[0, 0]), device)
    plot_step_times(engine, fig.add_subplot(grid[0, 1:]), device)
    axes = [fig.add_subplot(grid[1, i]) for i in range(3)]
    plot_budget_sweep(sim_rows, axes)
    axes[0].annotate(
        "the same requests in the scheduling simulator (cost model), across budgets",
        (0, 1.18),
        xycoords="axes fraction",
        fontsize=10,
        weight="bold",
    )
    return fig
