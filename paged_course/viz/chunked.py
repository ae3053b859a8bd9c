"""Chunked prefill for chapter 06: step orders side by side, and chunk budget against latency.

- ``plot_step_orders``: one panel per scheduler, one row per request, one column per step, each cell
  what the request did (``paged_course.sim.step_order.run_trace``): a prefill chunk (with its tokens), a
  decode, waiting, stalled, preempted.
- ``engine_budget_sweep``: the real engine (``LLM``) on one workload for several token budgets; per budget
  the p50 / p99 of time to first token and inter-token latency from ``LLM.stats()`` (the median of a few
  repeats: wall-clock time on a shared CPU is noisy), ``prefill_chunks``, and the most tokens in a step that
  ran decodes, read from the engine's step history (not timed, so exact).
- ``plot_latency_vs_budget``: p50 and p99 of TTFT and ITL against the budget, Sarathi-Serve's view
  (Agrawal et al., OSDI 2024), for rows of ``engine_budget_sweep`` or
  ``paged_course.sim.scheduling.chunk_budget_sweep`` (a v0-default row is drawn as dashed lines).

Every plotting function returns the matplotlib figure.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

CELL_COLORS = {
    "P": "#fdae6b",
    "D": "#74c476",
    "wait": "#f0f0f0",
    "stall": "#fb6a4a",
    "pre": "#9e9ac8",
}
CELL_LABELS = {
    "P": "prefill chunk (tokens)",
    "D": "decode",
    "wait": "waiting",
    "stall": "running, not scheduled",
    "pre": "preempted",
}


def _kind(cell: str) -> str:
    return "pre" if cell.startswith("pre") else ("P" if cell.startswith("P") else cell)


def plot_step_orders(
    traces: dict[str, list[dict[str, str]]], names: list[str] | None = None, axes=None
):
    """Grids of ``run_trace`` results, one panel per scheduler (``{title: steps}``), rows = ``names``."""
    names = names or sorted({n for steps in traces.values() for row in steps for n in row})
    width = max(len(steps) for steps in traces.values())
    if axes is None:
        height = (0.42 * len(names) + 1.6) * len(traces)
        _, axes = plt.subplots(len(traces), 1, figsize=(0.42 * width + 2.2, height), squeeze=False)
        axes = axes[:, 0]
    for ax, (title, steps) in zip(axes, traces.items()):
        for x, row in enumerate(steps):
            for y, name in enumerate(names):
                cell = row.get(name)
                if cell is None:
                    continue
                ax.add_patch(
                    Rectangle((x, y), 0.95, 0.9, color=CELL_COLORS[_kind(cell)], linewidth=0)
                )
                text = cell[1:] if _kind(cell) == "P" else ("x" if cell.startswith("pre") else "")
                if cell.startswith("pre+"):
                    text = "x " + cell[5:]
                ax.text(x + 0.47, y + 0.45, text, ha="center", va="center", fontsize=7)
        ax.set_xlim(0, width)
        ax.set_ylim(len(names), 0)
        ax.set_yticks([i + 0.45 for i in range(len(names))], names)
        ax.set_xticks(
            [i + 0.47 for i in range(width)], [str(i + 1) for i in range(width)], fontsize=7
        )
        ax.tick_params(length=0)
        for side in ("top", "right", "left", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_title(title, fontsize=9, loc="left")
    axes[-1].set_xlabel("step")
    axes[0].legend(
        [Patch(color=c) for c in CELL_COLORS.values()],
        list(CELL_LABELS.values()),
        fontsize=7,
        ncol=5,
        loc="lower left",
        bbox_to_anchor=(0, 1.12),
        frameon=False,
    )
    fig = axes[0].figure
    fig.tight_layout()
    return fig


def trace_text(steps: list[dict[str, str]], names: list[str]) -> str:
    """The same grid as text: one line per request, one column per step."""
    lines = ["step " + " ".join(f"{i + 1:>6}" for i in range(len(steps)))]
    for name in names:
        lines.append(f"{name:<4} " + " ".join(f"{row.get(name, ''):>6}" for row in steps))
    return "\n".join(lines)


def engine_budget_sweep(
    model,
    prompts: list[list[int]],
    sampling_params,
    budgets: list[int],
    repeats: int = 3,
    **llm_kwargs,
) -> list[dict]:
    """Run ``prompts`` through ``LLM(model, max_num_batched_tokens=budget, **llm_kwargs)`` for each budget.

    Returns one row per budget: ``budget``; ``ttft_p50``, ``ttft_p99``, ``itl_p50``, ``itl_p99`` (seconds,
    the median over ``repeats`` runs of ``LLM.stats()``); ``prefill_chunks`` and ``steps`` (the same every
    run); ``max_decode_step_tokens``: the most tokens computed in one step that also ran decodes, from the
    engine's step history (exact: the step whose length every decoding request then waits through).
    """
    from paged.engine.llm import LLM

    rows = []
    for budget in budgets:
        runs = []
        for _ in range(repeats):
            llm = LLM(
                model, max_num_batched_tokens=budget, verbose=False, profile=True, **llm_kwargs
            )
            llm.generate(prompts, sampling_params, use_tqdm=False)
            stats, history = llm.stats(), llm.engine.metrics.history
            runs.append(
                (
                    stats,
                    max(
                        h["prefill_tokens"] + h["decode_seqs"] for h in history if h["decode_seqs"]
                    ),
                )
            )
        keys = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
        rows.append(
            {
                "name": f"budget {budget}",
                "budget": budget,
                **{k: statistics.median(r[0][k] for r in runs) for k in keys},
                "prefill_chunks": runs[0][0]["prefill_chunks"],
                "steps": runs[0][0]["steps"],
                "max_decode_step_tokens": runs[0][1],
            }
        )
    return rows


def plot_latency_vs_budget(rows: list[dict], title: str, unit: str = "ms", axes=None):
    """p50 and p99 of TTFT (left) and ITL (right) against the token budget (log scale). Rows whose name
    starts with ``v0`` are drawn as dashed horizontal lines (a reference point, not a budget)."""
    scale = {"ms": 1e3, "s": 1.0}[unit]
    chunked = [r for r in rows if not r["name"].startswith("v0")]
    other = [r for r in rows if r["name"].startswith("v0")]
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    budgets = [r["budget"] for r in chunked]
    for ax, metric, label in (
        (axes[0], "ttft", "time to first token"),
        (axes[1], "itl", "inter-token latency"),
    ):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            (line,) = ax.plot(
                budgets, [scale * r[f"{metric}_{q}"] for r in chunked], style, label=f"{q}, chunked"
            )
            for r in other:
                ax.axhline(
                    scale * r[f"{metric}_{q}"],
                    color=line.get_color(),
                    linestyle=":",
                    linewidth=1.2,
                    label=f"{q}, {r['name']}",
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token budget per step (max_num_batched_tokens)")
        ax.set_ylabel(f"{label} ({unit})")
        ax.legend(fontsize=7, frameon=False)
    axes[0].figure.suptitle(title, fontsize=10)
    axes[0].figure.tight_layout()
    return axes[0].figure
