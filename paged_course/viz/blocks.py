"""Pictures of the memory manager (chapters 02 and 05): the pool's blocks with their reference counts,
block tables as arrows from logical to physical blocks, the prefix cache's eviction order, and an
allocator stepper (an ipywidgets slider, with a text table and a figure as the static fallback).

Colours: white = free and never used, light green = free but still cached (the number is its place in
the eviction order, 1 = reused next), blue = in use (darker with more holders; the number is the
reference count), orange outline = cached (holds a full block's key).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence as Seq

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from paged.core.allocator import BlockAllocator

_BLUES = ["#ffffff", "#9ecae1", "#4292c6", "#08519c", "#08306b"]


def _pool_state(manager_or_allocator) -> tuple[BlockAllocator, set[int]]:
    alloc = getattr(manager_or_allocator, "gpu_allocator", manager_or_allocator)
    cache = getattr(manager_or_allocator, "prefix_cache", None)
    cached = {b for b in range(alloc.num_blocks) if cache is not None and b in cache}
    return alloc, cached


def draw_pool(
    manager_or_allocator,
    rows: dict[str, tuple[list[int], list[list]]] | None = None,
    ax=None,
    title: str | None = None,
    block_size: int | None = None,
):
    """Draw the physical pool (bottom row) and, above it, one row of logical blocks per sequence with an
    arrow from each logical block to the physical block its table names.

    Args:
        manager_or_allocator: a ``BlockSpaceManager`` (shows the prefix cache too) or a ``BlockAllocator``.
        rows: ``{label: (block_ids, tokens_per_block)}``; ``tokens_per_block[i]`` is printed in logical block i.
        block_size: slots drawn per logical block (default: the manager's).
    Returns the matplotlib ``Axes``.
    """
    alloc, cached = _pool_state(manager_or_allocator)
    bs = block_size or getattr(manager_or_allocator, "block_size", 4)
    rows = rows or {}
    n = alloc.num_blocks
    free_order = alloc.free_queue()
    evict_rank = {b: i + 1 for i, b in enumerate(b for b in free_order if b in cached)}
    height = 1.6 + 1.3 * len(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.75 * n + 1.5), 1.0 + 0.8 * height))
    for b in range(n):
        ref = alloc.ref_count(b)
        face = (
            _BLUES[min(ref, len(_BLUES) - 1)] if ref else ("#c7e9c0" if b in cached else "#ffffff")
        )
        ax.add_patch(
            Rectangle(
                (b, 0),
                0.9,
                0.8,
                facecolor=face,
                edgecolor="#e6550d" if b in cached else "black",
                linewidth=2.2 if b in cached else 1.0,
            )
        )
        ax.text(b + 0.45, -0.25, str(b), ha="center", va="center", fontsize=8)
        label = str(ref) if ref else (f"#{evict_rank[b]}" if b in evict_rank else "")
        ax.text(
            b + 0.45,
            0.4,
            label,
            ha="center",
            va="center",
            fontsize=9,
            color="white" if ref >= 2 else "black",
        )
    ax.text(-0.3, 0.4, "physical\nblocks", ha="right", va="center", fontsize=8)
    for r, (label, (block_ids, tokens)) in enumerate(rows.items()):
        y = 1.6 + 1.3 * r
        ax.text(-0.3, y + 0.4, label, ha="right", va="center", fontsize=9)
        for i, b in enumerate(block_ids):
            x = i * 1.15
            ax.add_patch(Rectangle((x, y), 1.0, 0.8, facecolor="#f0f0f0", edgecolor="black"))
            toks = list(tokens[i]) if i < len(tokens) else []
            if bs <= 8:  # one cell per slot, token id inside ("" = empty slot)
                for j in range(bs):
                    ax.add_patch(
                        Rectangle(
                            (x + j / bs, y),
                            1.0 / bs,
                            0.8,
                            fill=False,
                            edgecolor="#bdbdbd",
                            linewidth=0.5,
                        )
                    )
                    if j < len(toks):
                        ax.text(
                            x + (j + 0.5) / bs,
                            y + 0.4,
                            str(toks[j]),
                            ha="center",
                            va="center",
                            fontsize=6 if bs <= 4 else 5,
                            rotation=90 if len(str(toks[j])) > 2 else 0,
                        )
            else:
                ax.text(x + 0.5, y + 0.4, f"{len(toks)}/{bs}", ha="center", va="center", fontsize=7)
            ax.add_patch(
                FancyArrowPatch(
                    (x + 0.5, y),
                    (b + 0.45, 0.8),
                    arrowstyle="->",
                    mutation_scale=8,
                    color="#636363",
                    linewidth=0.8,
                )
            )
    width = max(n, 1.15 * max((len(v[0]) for v in rows.values()), default=0))
    ax.set_xlim(-1.6, width + 0.2)
    ax.set_ylim(-0.6, height)
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def rows_for(manager, seqs: Seq, labels: Seq[str] | None = None) -> dict:
    """``draw_pool`` rows for sequences held by a ``BlockSpaceManager`` (tokens taken from each sequence)."""
    rows = {}
    for k, seq in enumerate(seqs):
        table = manager.block_tables.get(seq.seq_id)
        if table is None:
            continue
        bs = table.block_size
        tokens = [seq.token_ids[i * bs : (i + 1) * bs] for i in range(len(table))]
        rows[labels[k] if labels else f"seq {seq.seq_id}"] = (table.block_ids, tokens)
    return rows


def draw_block_table(
    block_table: list[int],
    num_tokens: int,
    block_size: int,
    num_blocks: int,
    ax=None,
    title: str | None = None,
):
    """One sequence's block table as arrows into a pool of ``num_blocks`` (its blocks in use, the rest free).

    Reusable by other chapters: it needs only the table, the token count and the sizes.
    """
    alloc = BlockAllocator(num_blocks)
    for b in block_table:  # held once by this table
        alloc.take(b)
    tokens = [
        [p for p in range(i * block_size, min(num_tokens, (i + 1) * block_size))]
        for i in range(len(block_table))
    ]
    return draw_pool(
        alloc, {"logical": (list(block_table), tokens)}, ax=ax, title=title, block_size=block_size
    )


# ---- the allocator stepper (chapter 02) -------------------------------------------------------------
def allocator_trace(num_blocks: int, ops: Seq[str], allocator_cls=BlockAllocator) -> list[dict]:
    """Run ``ops`` ("allocate", "free 3", "incref 1", "take 2") on a fresh allocator; one state per step.

    ``allocator_cls``: any class with the allocator interface of ``paged/engine/parts.py`` (chapter 02 passes
    the learner's). An operation that raises records the error message and leaves the state as it was.
    """
    alloc = allocator_cls(num_blocks)
    frames = [
        {
            "op": "start",
            "result": "",
            "refs": [0] * num_blocks,
            "free": alloc.free_queue(),
            "allocator": copy.deepcopy(alloc),
        }
    ]
    for op in ops:
        name, *arg = op.split()
        try:
            result = getattr(alloc, name)(*map(int, arg))
            result = "" if result is None else f"-> block {result}"
        except Exception as err:  # noqa: BLE001 - shown to the learner
            result = f"{type(err).__name__}: {err}"
        frames.append(
            {
                "op": op,
                "result": result,
                "refs": [alloc.ref_count(b) for b in range(num_blocks)],
                "free": alloc.free_queue(),
                "allocator": copy.deepcopy(alloc),
            }
        )
    return frames


def trace_table(frames: list[dict]) -> str:
    """The stepper's static fallback: one line per step."""
    lines = [
        f"{'step':>4}  {'operation':<10} {'result':<44} ref counts        free queue (front first)"
    ]
    for i, f in enumerate(frames):
        lines.append(f"{i:>4}  {f['op']:<10} {f['result'][:44]:<44} {f['refs']}  {f['free']}")
    return "\n".join(lines)


def _draw_frame(frame: dict, ax):
    draw_pool(frame["allocator"], ax=ax, title=f"{frame['op']} {frame['result']}"[:60])
    ax.text(-1.5, -0.55, "free queue: " + " ".join(map(str, frame["free"])), fontsize=8, va="top")


def allocator_stepper(num_blocks: int, ops: Seq[str], allocator_cls=BlockAllocator):
    """A slider over the steps of ``allocator_trace``. Returns an ipywidgets box, or without ipywidgets
    the figure of the last step; either way ``trace_table`` gives the same content as text."""
    frames = allocator_trace(num_blocks, ops, allocator_cls)
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        fig, ax = plt.subplots(figsize=(0.75 * num_blocks + 2, 1.6))
        _draw_frame(frames[-1], ax)
        return fig
    out = widgets.Output()
    slider = widgets.IntSlider(value=0, min=0, max=len(frames) - 1, description="step")

    def draw(change=None):
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(0.75 * num_blocks + 2, 1.6))
            _draw_frame(frames[slider.value], ax)
            display(fig)
            plt.close(fig)

    slider.observe(draw, names="value")
    draw()
    return widgets.VBox([slider, out])


def draw_trace(num_blocks: int, ops: Seq[str], every: int = 1, allocator_cls=BlockAllocator):
    """Small multiples of the allocator states (the stepper as one static figure)."""
    frames = allocator_trace(num_blocks, ops, allocator_cls)[::every]
    fig, axes = plt.subplots(len(frames), 1, figsize=(0.75 * num_blocks + 2, 1.25 * len(frames)))
    for frame, ax in zip(frames, [axes] if len(frames) == 1 else axes):
        _draw_frame(frame, ax)
    fig.tight_layout()
    return fig


# ---- the prefix-caching explorer (chapter 05) -------------------------------------------------------
def draw_prefix_savings(
    system_len: int = 9,
    block_size: int = 16,
    question_len: int = 50,
    num_requests: int = 100,
    axes=None,
) -> dict:
    """Bars of blocks in use and prompt tokens computed, prefix caching off vs on, for ``num_requests``
    concurrent requests = one shared ``system_len``-token prompt + a private ``question_len``-token
    question each (``paged_course.sim.prefix_savings.shared_prompt_savings``, the real ``BlockSpaceManager``).
    Returns that function's row (``block_saving``, ``speedup_bound``, ...)."""
    from paged_course.sim.prefix_savings import shared_prompt_savings  # lazy: only this picture

    r = shared_prompt_savings(system_len, num_requests, question_len, block_size)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 2.3))
    colors = ["#8d99ae", "#2a9d8f"]
    for ax, key, what in (
        (axes[0], "blocks", "KV blocks in use"),
        (axes[1], "prefill", "prompt tokens computed"),
    ):
        values = [r[f"{key}_without"], r[f"{key}_with"]]
        ax.barh(["caching off", "caching on"], values, color=colors)
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:,}", va="center", fontsize=8)
        ax.set_xlim(0, 1.25 * max(values))
        ax.invert_yaxis()
        ax.set_xlabel(what)
    axes[0].set_title(f"{r['block_saving']:.0%} of the blocks saved", fontsize=10)
    axes[1].set_title(f"prompt-phase speed-up at most {r['speedup_bound']:.1f}x", fontsize=10)
    axes[0].figure.suptitle(
        f"{num_requests} requests: a {system_len}-token system prompt "
        f"({system_len // block_size} full blocks of {block_size}) + a {question_len}-token "
        "question each",
        fontsize=10,
        y=1.1,
    )
    return r


def prefix_savings_widget(system_len: int = 1000, num_requests: int = 100):
    """Sliders for the shared system prompt's length and the question's, a dropdown for the block size;
    each change re-runs ``draw_prefix_savings`` (a few ms to ~0.1 s). Returns the widget (display it),
    or None after drawing the default figure when ipywidgets is missing."""

    def draw(system_len=system_len, block_size=16, question_len=50):
        draw_prefix_savings(system_len, block_size, question_len, num_requests)
        plt.show()

    try:
        import ipywidgets as widgets
    except ImportError:
        draw()
        return None
    fit = {"style": {"description_width": "initial"}, "continuous_update": False}
    return widgets.interactive(
        draw,
        system_len=widgets.IntSlider(
            value=system_len,
            min=0,
            max=2048,
            description="system prompt (tokens)",
            layout=widgets.Layout(width="520px"),
            **fit,
        ),
        block_size=widgets.Dropdown(
            options=[4, 8, 16, 32, 64, 128], value=16, description="block size", style=fit["style"]
        ),
        question_len=widgets.IntSlider(
            value=50,
            min=1,
            max=500,
            description="question (tokens)",
            layout=widgets.Layout(width="520px"),
            **fit,
        ),
    )
