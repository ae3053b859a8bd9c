"""Views of the engine's objects that only the course reads (the engine itself never needs them).

``prefills`` / ``decodes``: a step's prompt chunks and decodes (``SchedulerOutputs.scheduled`` split by
``is_prefill``); ``slot``: the pool row of one token position of a ``BlockTable``; ``reset_prefix_cache``:
forget a block manager's cached blocks (as vLLM's ``LLM.reset_prefix_cache``; the tests' way to start cold).
"""

from __future__ import annotations


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
    if not 0 <= position < table.capacity:
        raise ValueError(
            f"position {position} is outside the {len(table.block_ids)} blocks of this "
            f"table (capacity {table.capacity} tokens)"
        )
    return table.block_ids[position // table.block_size] * table.block_size + (
        position % table.block_size
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
