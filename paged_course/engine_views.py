"""Views of the engine's objects that only the course reads (the engine itself never needs them).

``prefills`` / ``decodes``: a step's prompt chunks and decodes (``SchedulerOutputs.scheduled`` split by
``is_prefill``); ``slot`` / ``slots``: the pool rows of token positions of a ``BlockTable``; ``reset_prefix_cache``:
forget a block manager's cached blocks (as vLLM's ``LLM.reset_prefix_cache``; the tests' way to start cold);
``describe``: one line about a ``KVCache`` (its sizes and bytes) for a chapter to print.
"""

from __future__ import annotations

from paged.core.block_table import slot_mapping


def prefills(out) -> list:
    """The step's prompt chunks (entries of ``out.scheduled`` with ``is_prefill``), in schedule order."""
    return [s for s in out.scheduled if s.is_prefill]


def decodes(out) -> list:
    """The step's decodes (entries of ``out.scheduled`` computing one token), in schedule order."""
    return [s for s in out.scheduled if not s.is_prefill]


def slot(table, position: int) -> int:
    """Row of token ``position`` of a ``BlockTable`` in the flattened pool: ``table[p // bs] * bs + p % bs``.

    Raises:
        ValueError: ``position`` outside the table's capacity.
    """
    capacity = len(table.block_ids) * table.block_size
    if not 0 <= position < capacity:
        raise ValueError(
            f"position {position} is outside the {len(table.block_ids)} blocks of this "
            f"table (capacity {capacity} tokens)"
        )
    return table.block_ids[position // table.block_size] * table.block_size + (
        position % table.block_size
    )


def slots(table, start: int, end: int) -> list[int]:
    """Rows of token positions ``start .. end - 1`` of a ``BlockTable`` (the tokens one step computes):
    the engine's ``slot_mapping`` for this one table.

    Raises:
        ValueError: positions outside the table's capacity.
    """
    capacity = len(table.block_ids) * table.block_size
    if not 0 <= start <= end <= capacity:
        raise ValueError(f"positions {start}..{end - 1} are outside capacity {capacity}")
    return slot_mapping([table.block_ids], [start], [end - start], table.block_size)


def describe(kv) -> str:
    """One line about a ``KVCache``: layers, blocks and their size, KV heads, head dim, dtype, device,
    MiB of the device pool and the CPU swap blocks."""
    return (
        f"KVCache(layers={kv.num_layers}, blocks={kv.num_blocks} x {kv.block_size} tokens, "
        f"kv_heads={kv.num_kv_heads}, head_dim={kv.head_dim}, {kv.dtype}, {kv.device}, "
        f"{kv.bytes / 2**20:.1f} MiB; cpu_blocks={kv.num_cpu_blocks})"
    )


def reset_prefix_cache(manager) -> bool:
    """Forget every cached block of a ``BlockSpaceManager``. Returns False (and changes nothing) while any
    GPU block is in use."""
    if manager.prefix_cache is None:
        return True
    if manager.gpu_allocator.num_free_blocks < manager.num_gpu_blocks:
        return False
    manager.prefix_cache.clear()
    return True
