"""Pictures of the KV pool for chapter 03: slot mapping, pool occupancy, and the NHD memory order.

- ``plot_slot_mapping``: one sequence's tokens, grouped in logical blocks, with arrows to the physical
  blocks of the pool that its block table names; optionally one token's path to its slot.
- ``plot_pool``: the pool as ``num_blocks`` rows of ``block_size`` slots, each slot coloured by the
  sequence that owns it (free blocks grey, reserved-but-empty slots hatched).
- ``plot_memory_order``: the order in which one block's elements sit in memory in the NHD layout
  (``[block_size, num_kv_heads, head_dim]``, vLLM v1 / FlashAttention) and in the HND layout
  (``[num_kv_heads, block_size, head_dim]``).
- ``slot_explorer``: an ipywidgets slider over token positions that redraws ``plot_slot_mapping``.

Every function returns the matplotlib figure (or the widget) and draws nothing when it is not shown.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

_FREE = "#e6e6e6"


def _colors(n: int) -> list:
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def plot_slot_mapping(
    block_table: list[int],
    num_tokens: int,
    block_size: int,
    num_blocks: int,
    highlight: int | None = None,
    ax=None,
):
    """Logical blocks of one sequence (top) mapped to physical blocks of the pool (bottom).

    Token ``p`` is drawn in logical block ``p // block_size``; the arrow goes to physical block
    ``block_table[p // block_size]``. With ``highlight=p`` the token, its block and its slot
    ``block_table[p // bs] * bs + p % bs`` are marked and the formula is written in the title.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.45 * num_blocks * block_size / 2 + 2), 3.2))
    fig = ax.figure
    color = _colors(1)[0]
    n_logical = len(block_table)
    # top row: logical blocks, tokens numbered
    for i in range(n_logical):
        for o in range(block_size):
            p = i * block_size + o
            x = i * (block_size + 1) + o
            face = color if p < num_tokens else "white"
            ax.add_patch(
                Rectangle(
                    (x, 2),
                    1,
                    1,
                    facecolor=face,
                    edgecolor="black",
                    alpha=0.35 if p < num_tokens else 1,
                    hatch=None if p < num_tokens else "//",
                )
            )
            if p < num_tokens:
                ax.text(x + 0.5, 2.5, str(p), ha="center", va="center", fontsize=7)
        ax.text(
            i * (block_size + 1) + block_size / 2, 3.25, f"logical {i}", ha="center", fontsize=8
        )
    # bottom: the pool, blocks side by side
    per_row = block_size + 0.5
    scale = max(1.0, (num_blocks * per_row) / max(1, n_logical * (block_size + 1)))
    for b in range(num_blocks):
        x0 = b * per_row / scale
        owned = b in block_table
        ax.add_patch(
            Rectangle(
                (x0, 0),
                block_size / scale,
                0.8,
                facecolor=color if owned else _FREE,
                alpha=0.35 if owned else 1,
                edgecolor="black",
            )
        )
        ax.text(x0 + block_size / scale / 2, -0.35, str(b), ha="center", fontsize=7)
    ax.text(-0.5, 0.4, "pool", ha="right", va="center", fontsize=8)
    for i, b in enumerate(block_table):
        start = (i * (block_size + 1) + block_size / 2, 2)
        end = (b * per_row / scale + block_size / scale / 2, 0.8)
        ax.add_patch(
            FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10, color="dimgray")
        )
    title = f"block table {block_table}, block_size {block_size}"
    if highlight is not None:
        i, o = divmod(highlight, block_size)
        ax.add_patch(
            Rectangle((i * (block_size + 1) + o, 2), 1, 1, fill=False, edgecolor="red", linewidth=2)
        )
        b = block_table[i]
        ax.add_patch(
            Rectangle(
                (b * per_row / scale + o / scale, 0),
                1 / scale,
                0.8,
                fill=False,
                edgecolor="red",
                linewidth=2,
            )
        )
        title = (
            f"token {highlight}: block_table[{highlight} // {block_size}] * {block_size} + {highlight} % "
            f"{block_size} = {b} * {block_size} + {o} = slot {b * block_size + o}"
        )
    ax.set_title(title, fontsize=9)
    width = max(n_logical * (block_size + 1), num_blocks * per_row / scale)
    ax.set_xlim(-1.5, width + 0.5)
    ax.set_ylim(-0.8, 3.6)
    ax.axis("off")
    return fig


def plot_pool(tables: dict[str, tuple[list[int], int]], num_blocks: int, block_size: int, ax=None):
    """The pool as a grid: row = physical block, column = offset; slot number in each cell.

    ``tables`` maps a sequence name to ``(block_table, num_tokens)``. Cells holding a token are coloured
    by owner; slots reserved in an owned block but not yet written are hatched; free blocks are grey.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * block_size + 2.5, 0.32 * num_blocks + 1))
    fig = ax.figure
    owner = {}
    for (name, (table, n)), color in zip(tables.items(), _colors(len(tables))):
        for i, b in enumerate(table):
            for o in range(block_size):
                owner[(b, o)] = (name, color, i * block_size + o < n)
    for b in range(num_blocks):
        for o in range(block_size):
            name, color, used = owner.get((b, o), (None, _FREE, False))
            ax.add_patch(
                Rectangle(
                    (o, num_blocks - 1 - b),
                    1,
                    1,
                    facecolor=color if used else (color if name is None else "white"),
                    edgecolor="black",
                    linewidth=0.5,
                    alpha=0.55 if used else 1,
                    hatch="//" if (name is not None and not used) else None,
                )
            )
            ax.text(
                o + 0.5,
                num_blocks - 0.5 - b,
                str(b * block_size + o),
                ha="center",
                va="center",
                fontsize=6,
            )
        ax.text(-0.3, num_blocks - 0.5 - b, f"block {b}", ha="right", va="center", fontsize=7)
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, alpha=0.55) for c in _colors(len(tables))]
    ax.legend(
        handles, list(tables), loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False
    )
    ax.set_xlim(-3, block_size)
    ax.set_ylim(0, num_blocks)
    ax.set_title(f"KV pool: {num_blocks} blocks x {block_size} slots (number = slot)", fontsize=9)
    ax.axis("off")
    return fig


def plot_memory_order(block_size: int = 4, num_kv_heads: int = 2, head_dim: int = 4, ax=None):
    """One block of one layer as it lies in memory, NHD (vLLM v1, FlashAttention) above HND.

    Each cell is one element; colour = token (slot in the block), shade = KV head. In NHD the
    ``num_kv_heads * head_dim`` elements of one token are one contiguous run (one write per token);
    in HND each head's ``block_size * head_dim`` elements are contiguous instead.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 1.9))
    fig = ax.figure
    colors = _colors(block_size)
    n = block_size * num_kv_heads * head_dim
    orders = {
        "NHD [block_size, kv_heads, head_dim]": [
            (t, h) for t in range(block_size) for h in range(num_kv_heads) for _ in range(head_dim)
        ],
        "HND [kv_heads, block_size, head_dim]": [
            (t, h) for h in range(num_kv_heads) for t in range(block_size) for _ in range(head_dim)
        ],
    }
    for row, (label, order) in enumerate(orders.items()):
        y = 1.6 * (1 - row)
        for x, (t, h) in enumerate(order):
            ax.add_patch(
                Rectangle(
                    (x, y),
                    1,
                    1,
                    facecolor=colors[t],
                    alpha=1.0 - 0.55 * h / max(1, num_kv_heads - 1),
                    edgecolor="white",
                    linewidth=0.5,
                )
            )
        ax.text(-1, y + 0.5, label, ha="right", va="center", fontsize=8)
    ax.text(
        n / 2,
        -0.55,
        "memory address ->   (colour: token in the block; shade: KV head)",
        ha="center",
        fontsize=8,
    )
    ax.set_xlim(-24, n + 1)
    ax.set_ylim(-0.9, 2.8)
    ax.axis("off")
    return fig


def slot_explorer(block_table: list[int], num_tokens: int, block_size: int, num_blocks: int):
    """A slider over token positions that redraws ``plot_slot_mapping`` with that token highlighted.

    Returns an ipywidgets ``VBox`` (or, without ipywidgets, the static figure for the last token).
    """
    try:
        import ipywidgets as widgets
    except ImportError:  # static fallback
        return plot_slot_mapping(
            block_table, num_tokens, block_size, num_blocks, highlight=num_tokens - 1
        )
    out = widgets.Output()
    slider = widgets.IntSlider(value=num_tokens - 1, min=0, max=num_tokens - 1, description="token")

    def draw(change=None):
        from IPython.display import display

        with out:
            out.clear_output(wait=True)
            fig = plot_slot_mapping(
                block_table, num_tokens, block_size, num_blocks, highlight=slider.value
            )
            display(fig)
            plt.close(fig)

    slider.observe(draw, names="value")
    draw()
    return widgets.VBox([slider, out])
