"""Pictures for chapter 04: which pool blocks each kernel program reads, and the online softmax at work.

- ``plot_program_reads``: one row per program of the decode grid (sequence, split), one column per
  slot of the KV pool; a cell is coloured when that program reads the slot, light where the program
  loads the slot's block but masks the slot out (past the context). Every KV head runs the same
  pattern on its own head slice, so heads are not drawn.
- ``plot_online_softmax``: for one row of scores fed block by block, the running max ``m`` and the
  running denominator ``l`` (drawn as ``l * exp(m - m_final)`` so it is comparable across steps),
  against their final values.
- ``plot_split_weights``: the merge weights ``exp(lse_i - max lse)`` of split-K, an empty split at 0.
- ``program_reads_explorer``: ipywidgets sliders (number of splits, sequence lengths) redrawing
  ``plot_program_reads``; returns the static figure when ipywidgets is missing.
- ``plot_tile_gather``: the tuned kernel's KV tiles of ``BLOCK_N`` tokens, each position gathering its
  own physical block: which pool slots each tile reads.
- ``plot_lab_steps``: chapter 04's performance lab, % of peak HBM bandwidth per step and shape from a
  committed GPU run, "not measured" where the run has no number.
- ``plot_kernel_bench``: the four panels of ``bench kernel`` on a GPU (bandwidth per shape and side, the
  lab's steps, split-K, a roofline: arithmetic intensity against achieved bandwidth);
  ``plot_cpu_check``: its CPU (interpreter) run.

Every function returns the matplotlib figure (or the widget).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle


def _split_ranges(num_logical: int, width: int, num_splits: int) -> list[tuple[int, int]]:
    """Logical block ranges ``[first, last)`` of each split, as the kernel computes them."""
    per_split = -(-width // num_splits)
    return [(i * per_split, min((i + 1) * per_split, num_logical)) for i in range(num_splits)]


def plot_program_reads(
    block_tables: list[list[int]],
    context_lens: list[int],
    block_size: int,
    num_blocks: int,
    num_splits: int = 1,
    ax=None,
):
    """Pool slots read by each program (sequence ``s``, split ``i``) of ``paged_attention_decode``.

    ``block_tables[s]`` lists physical blocks in logical order (its length is the table width, the
    same for every sequence); a program reads logical blocks ``[i * ceil(width / num_splits), ...)``
    up to the context's last block. Returns the figure.
    """
    width = max(len(row) for row in block_tables)
    programs = [(s, i) for s in range(len(block_tables)) for i in range(num_splits)]
    if ax is None:
        _, ax = plt.subplots(
            figsize=(max(7.0, 0.22 * num_blocks * block_size + 2.5), 0.5 * len(programs) + 1.6)
        )
    cmap = plt.get_cmap("tab10")
    for row, (s, split) in enumerate(programs):
        n = context_lens[s]
        num_logical = -(-n // block_size)
        first, last = _split_ranges(num_logical, width, num_splits)[split]
        color = cmap(s % 10)
        for b in range(first, last):
            physical = block_tables[s][b]
            for t in range(block_size):
                real = b * block_size + t < n
                ax.add_patch(
                    Rectangle(
                        (physical * block_size + t, row),
                        1,
                        0.8,
                        facecolor=color,
                        alpha=1.0 if real else 0.18,
                        edgecolor="white",
                        linewidth=0.4,
                    )
                )
            ax.text(
                physical * block_size + block_size / 2,
                row + 0.4,
                f"L{b}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if b * block_size < n else "black",
            )
        if first >= last:
            ax.text(
                0.5,
                row + 0.4,
                "no token: lse = -inf, merges as a no-op",
                fontsize=7,
                va="center",
                color="gray",
            )
    for b in range(num_blocks + 1):
        ax.axvline(b * block_size, color="#999999", linewidth=0.6)
    labels = [
        f"seq {s}" + (f", split {i}" if num_splits > 1 else "") + f" (ctx {context_lens[s]})"
        for s, i in programs
    ]
    ax.set_yticks(np.arange(len(programs)) + 0.4, labels)
    ax.set_xticks(
        np.arange(num_blocks) * block_size + block_size / 2,
        [f"blk {b}" for b in range(num_blocks)],
        fontsize=7,
    )
    ax.set_xlim(0, num_blocks * block_size)
    ax.set_ylim(len(programs), -0.2)
    ax.set_xlabel(
        f"KV pool slots ({num_blocks} physical blocks x {block_size}); 'L<b>' = logical block b; "
        "dark = read and used, light = loaded but masked (past the context)",
        fontsize=8,
    )
    ax.set_title(
        f"one program per (sequence, KV head{', split' if num_splits > 1 else ''}): the slots it reads",
        fontsize=10,
        loc="left",
    )
    ax.figure.tight_layout()
    return ax.figure


def online_softmax_trace(scores, block: int) -> dict:
    """Running ``m`` and ``l`` after each block of a 1-D score row (plain Python floats)."""
    scores = [float(x) for x in scores]
    m, l, steps = float("-inf"), 0.0, []  # noqa: E741
    for start in range(0, len(scores), block):
        chunk = scores[start : start + block]
        m_new = max(m, max(chunk))
        l = l * math.exp(m - m_new) + sum(math.exp(x - m_new) for x in chunk)  # noqa: E741
        m = m_new
        steps.append((start + len(chunk), m, l))
    return {"seen": [s[0] for s in steps], "m": [s[1] for s in steps], "l": [s[2] for s in steps]}


def plot_online_softmax(scores, block: int, ax=None):
    """Running max and denominator of the online softmax, block by block, against the final values."""
    trace = online_softmax_trace(scores, block)
    m_final, l_final = trace["m"][-1], trace["l"][-1]
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(9.5, 3.0))
    seen = trace["seen"]
    ax[0].step(seen, trace["m"], where="post", marker="o", label="running max m")
    ax[0].axhline(m_final, color="gray", linestyle="--", label="max of the whole row")
    ax[0].plot(
        np.arange(1, len(scores) + 1), scores, ".", color="#bbbbbb", label="scores", zorder=0
    )
    ax[0].set_xlabel("scores seen")
    ax[0].legend(fontsize=7)
    rescaled = [den * math.exp(m - m_final) for m, den in zip(trace["m"], trace["l"])]
    ax[1].step(
        seen,
        trace["l"],
        where="post",
        marker="s",
        color="C3",
        label="l as stored (relative to current m)",
    )
    ax[1].step(seen, rescaled, where="post", marker="o", color="C1", label="l * exp(m - m_final)")
    ax[1].axhline(l_final, color="gray", linestyle="--", label="sum exp(x - max) of the whole row")
    ax[1].set_xlabel("scores seen")
    ax[1].legend(fontsize=7)
    ax[0].set_title(f"blocks of {block}: the max only grows", fontsize=10)
    ax[1].set_title("the denominator, rescaled at each new max", fontsize=10)
    ax[0].figure.tight_layout()
    return ax[0].figure


def plot_split_weights(lse, ax=None):
    """Bar chart of split-K merge weights ``exp(lse_i - max lse)``; ``-inf`` (an empty split) gives 0."""
    lse = np.asarray(lse, dtype=np.float64)
    top = lse[np.isfinite(lse)].max() if np.isfinite(lse).any() else 0.0
    weights = np.exp(lse - top)
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 2.6))
    ax.bar(
        np.arange(len(lse)), weights, color=["C2" if np.isfinite(x) else "lightgray" for x in lse]
    )
    for i, x in enumerate(lse):
        ax.text(
            i,
            weights[i] + 0.02,
            "empty" if not np.isfinite(x) else f"{weights[i]:.2f}",
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(np.arange(len(lse)), [f"split {i}" for i in range(len(lse))])
    ax.set_ylabel("merge weight")
    ax.set_ylim(0, 1.15)
    ax.figure.tight_layout()
    return ax.figure


def program_reads_explorer(block_tables, context_lens, block_size: int, num_blocks: int):
    """Slider over ``num_splits`` redrawing :func:`plot_program_reads` (static figure without ipywidgets)."""
    try:
        import ipywidgets as widgets
    except ImportError:
        return plot_program_reads(block_tables, context_lens, block_size, num_blocks)

    def draw(num_splits: int = 1):
        fig = plot_program_reads(
            block_tables, context_lens, block_size, num_blocks, num_splits=num_splits
        )
        plt.show()
        return fig

    width = max(len(row) for row in block_tables)
    return widgets.interactive(
        draw, num_splits=widgets.IntSlider(value=1, min=1, max=max(1, width), step=1)
    )


def plot_tile_gather(
    block_table: list[int],
    context_len: int,
    block_size: int,
    block_n: int,
    num_blocks: int,
    ax=None,
):
    """Pool slots read by each KV tile of ``block_n`` tokens for one sequence (tuned kernel).

    Tile ``j`` covers positions ``j * block_n ... j * block_n + block_n - 1``; position ``t`` reads slot
    ``block_table[t // block_size] * block_size + t % block_size``. Returns the figure.
    """
    num_tiles = -(-context_len // block_n)
    if ax is None:
        _, ax = plt.subplots(
            figsize=(max(7.0, 0.22 * num_blocks * block_size + 2.5), 0.5 * num_tiles + 1.6)
        )
    cmap = plt.get_cmap("tab10")
    for tile in range(num_tiles):
        for n in range(block_n):
            t = tile * block_n + n
            if t >= context_len:  # masked: no block is looked up, nothing is read
                continue
            slot = block_table[t // block_size] * block_size + t % block_size
            ax.add_patch(
                Rectangle(
                    (slot, tile),
                    1,
                    0.8,
                    facecolor=cmap(tile % 10),
                    edgecolor="white",
                    linewidth=0.4,
                )
            )
        blocks = sorted(
            {
                block_table[t // block_size]
                for t in range(tile * block_n, min((tile + 1) * block_n, context_len))
            }
        )
        ax.text(
            num_blocks * block_size + 0.5,
            tile + 0.4,
            f"tile {tile}: blocks {blocks}",
            fontsize=7,
            va="center",
        )
    for b in range(num_blocks + 1):
        ax.axvline(b * block_size, color="#999999", linewidth=0.6)
    ax.set_yticks(
        np.arange(num_tiles) + 0.4,
        [f"tile {j} (tokens {j * block_n}-{(j + 1) * block_n - 1})" for j in range(num_tiles)],
    )
    ax.set_xticks(
        np.arange(num_blocks) * block_size + block_size / 2,
        [f"blk {b}" for b in range(num_blocks)],
        fontsize=7,
    )
    ax.set_xlim(0, num_blocks * block_size + 0.3 * num_blocks * block_size)
    ax.set_ylim(num_tiles, -0.2)
    ax.set_xlabel(
        f"KV pool slots ({num_blocks} blocks x {block_size}); block table {block_table}, context "
        f"{context_len}",
        fontsize=8,
    )
    ax.set_title(
        f"tiles of {block_n} tokens: each position gathers its own block", fontsize=10, loc="left"
    )
    ax.figure.tight_layout()
    return ax.figure


def plot_lab_steps(
    run: dict | None, steps: list[tuple[str, str]], shapes: list[tuple[int, int]], ax=None
):
    """% of peak HBM bandwidth for each lab step (bars) at each (batch, context), from
    ``paged_course.bench.kernel.committed_kernel_runs``; a step without a number is drawn as a grey
    "not measured" placeholder, never guessed. ``steps`` is ``[(id, label), ...]``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 3.2))
    width = 0.8 / max(1, len(shapes))
    measured = (run or {}).get("steps", {})
    for i, (batch, context) in enumerate(shapes):
        for j, (step, _) in enumerate(steps):
            row = measured.get((step, batch, context))
            x = j + (i - (len(shapes) - 1) / 2) * width
            if row is None or row.get("pct_peak") is None:
                ax.bar(x, 2, width, color="#eeeeee", edgecolor="#bbbbbb", hatch="//")
                if i == len(shapes) // 2:  # one label per step
                    ax.text(j, 4, "not measured yet", ha="center", fontsize=7, color="gray")
            else:
                ax.bar(
                    x,
                    row["pct_peak"],
                    width,
                    color=f"C{i}",
                    label=f"batch {batch}, context {context}"
                    if j == 0 or not any(measured.get((s, batch, context)) for s, _ in steps[:j])
                    else None,
                )
                ax.text(x, row["pct_peak"] + 1, f"{row['pct_peak']:.1f}%", ha="center", fontsize=7)
    ax.set_xticks(range(len(steps)), [label for _, label in steps], fontsize=7, rotation=12)
    ax.set_ylabel("% of peak HBM bandwidth")
    ax.set_ylim(0, 105)
    source = f"{run['device']}, {run['path']}" if run else "no committed GPU run"
    ax.set_title(f"the performance lab, step by step ({source})", fontsize=9, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=7, loc="upper left")
    ax.figure.tight_layout()
    return ax.figure


def plot_kernel_bench(rows, steps, split_rows, group_rows, peak, device_name, config: str = ""):
    """The GPU benchmark's figure: bandwidth per shape and side, lab steps, split-K, roofline."""
    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    ax = axes[0, 0]
    main = [r for r in rows if r["block_size"] == 16]
    labels = [f"B{r['batch']}/{r['context']}" for r in main]
    for k, side in enumerate(
        ["tuned", "contiguous", "teaching", "sdpa", "flash_attn", "flashinfer"]
    ):
        ys = [r["rates"][side]["gbps"] if side in r["rates"] else np.nan for r in main]
        if not np.all(np.isnan(ys)):
            ax.plot(range(len(main)), ys, marker="o", color=f"C{k}", label=side)
    if peak:
        ax.axhline(peak, color="gray", linestyle="--", label=f"peak {peak:.0f} GB/s")
    ax.set_xticks(range(len(main)), labels, rotation=60, fontsize=7)
    ax.set(ylabel="achieved GB/s (bytes / time)", title="decode bandwidth, block size 16")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    shapes = sorted({(r["batch"], r["context"]) for r in steps}, reverse=True)
    ids = list(dict.fromkeys(r["step"] for r in steps))
    width = 0.8 / max(1, len(shapes))
    for i, shape in enumerate(shapes):
        sel = {r["step"]: r for r in steps if (r["batch"], r["context"]) == shape}
        ax.bar(
            [j + (i - (len(shapes) - 1) / 2) * width for j in range(len(ids))],
            [sel[s]["gbps"] if s in sel else 0 for s in ids],
            width,
            label=f"B{shape[0]} ctx {shape[1]}",
        )
    if peak:
        ax.axhline(peak, color="gray", linestyle="--")
    ax.set_xticks(range(len(ids)), ids, fontsize=8)
    ax.set(ylabel="GB/s", title="chapter 04's performance lab, step by step")
    ax.legend(fontsize=7)
    ax = axes[1, 0]
    for r in split_rows:
        splits = sorted(r["ms_by_splits"], key=int)
        ax.plot(
            [int(s) for s in splits],
            [r["ms_by_splits"][s] * 1e3 for s in splits],
            marker="o",
            label=f"B{r['batch']} ctx {r['context']} (heuristic: {r['heuristic_splits']})",
        )
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="num_splits",
        ylabel="us",
        yscale="log",
        title="split-K: forced counts vs the heuristic's pick",
    )
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    for k, impl in enumerate(dict.fromkeys(r["impl"] for r in group_rows)):
        sel = [r for r in group_rows if r["impl"] == impl]
        ax.plot(
            [r["intensity"] for r in sel],
            [r["gbps"] for r in sel],
            marker="o",
            color=f"C{k}",
            label=impl,
        )
        for r in sel:
            ax.annotate(f"G{r['group']}", (r["intensity"], r["gbps"]), fontsize=6)
    if peak:
        ax.axhline(peak, color="gray", linestyle="--", label="memory roof (peak HBM)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (flops / byte)",
        ylabel="achieved GB/s",
        title="roofline: every decode is far left of the compute roof",
    )
    ax.legend(fontsize=7)
    fig.suptitle(f"bench kernel on {device_name} ({config})")
    fig.tight_layout()
    return fig


def plot_cpu_check(rows):
    """The CPU benchmark's figure: interpreter seconds per call of both kernels (not kernel speed)."""
    fig, ax = plt.subplots(figsize=(7, 3))
    labels = [
        f"B{r['batch']}/ctx{r['context']}/bs{r['block_size']}/s{r['num_splits']}/{r['dtype']}"
        for r in rows
    ]
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["tuned_interpreter_s"] for r in rows], 0.4, label="tuned")
    ax.barh(y + 0.2, [r["teaching_interpreter_s"] for r in rows], 0.4, label="teaching")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("seconds per call in Triton's interpreter on CPU (says nothing about a GPU)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
