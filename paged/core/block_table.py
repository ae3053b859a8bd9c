"""Block tables: where each token of a sequence lives in the KV cache pool.

A sequence sees its KV cache as consecutive *logical* blocks (tokens ``0..bs-1`` in logical block 0,
``bs..2bs-1`` in logical block 1, ...). Its block table maps logical block ``i`` to the *physical*
block ``table[i]`` handed out by the allocator, which can be anywhere in the pool: this is the page
table of an operating system, with blocks as pages and tokens as bytes (PagedAttention paper §4.1-4.2).

The *slot* of token position ``p`` is its row in the pool flattened to ``[num_blocks * block_size]``:

    slot(p) = table[p // block_size] * block_size + p % block_size

One table per sequence serves every layer (each layer has its own pool tensor with the same layout).
The *slot mapping* of a step lists the slot of every token computed in that step (``slot_mapping``).

Sources: vLLM v0 ``vllm/core/block/block_table.py`` (``BlockTable``), ``vllm/attention/backends/utils.py``
(``compute_slot_mapping``); v1 ``vllm/v1/worker/block_table.py``; all 0.10.2.
"""

from __future__ import annotations


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)`` (0 tokens -> 0 blocks).
    Callers pass checked sizes (``num_tokens >= 0``; ``block_size > 0``, checked by ``CacheConfig``)."""
    return -(-num_tokens // block_size)


def slot_mapping(
    block_tables: list[list[int]],
    start_positions: list[int],
    num_tokens: list[int],
    block_size: int,
) -> list[int]:
    """Slots of the tokens one step computes, for a packed batch: sequence ``s`` computes positions
    ``start_positions[s] .. start_positions[s] + num_tokens[s] - 1`` (a prefill chunk, or one decode token).

    Returns the slots of every sequence's tokens, concatenated in batch order (``[sum(num_tokens)]`` ints).
    Example: tables ``[[10, 11, 12]]``, start ``[7]``, 2 tokens, block size 4 -> ``[47, 48]``.
    The engine's part for this step (``paged.parts.Parts.slot_mapping``); inputs are built by the engine.
    """
    return [
        table[p // block_size] * block_size + p % block_size
        for table, start, n in zip(block_tables, start_positions, num_tokens)
        for p in range(start, start + n)
    ]


class BlockTable:
    """The physical block ids of one sequence, in logical order, and the token count they hold.

    Args:
        block_size: tokens per block (> 0).
        block_ids: physical block ids, logical block 0 first (default: empty).
        num_tokens: tokens that have slots so far (default: full capacity of ``block_ids``).

    Raises:
        ValueError: ``num_tokens`` outside the capacity of the blocks given.

    The course's views of a table (``slot``, ``slots``) live in ``paged_course.engine_views``.
    """

    def __init__(
        self, block_size: int, block_ids: list[int] | None = None, num_tokens: int | None = None
    ):
        self.block_size = block_size
        self.block_ids: list[int] = list(block_ids or [])
        capacity = len(self.block_ids) * block_size
        self.num_tokens = capacity if num_tokens is None else num_tokens
        if not capacity - block_size < self.num_tokens <= capacity:
            raise ValueError(
                f"{self.num_tokens} tokens do not fit {len(self.block_ids)} blocks of "
                f"{block_size} (each block but the last must be full)"
            )

    def __len__(self) -> int:
        return len(self.block_ids)

    def __getitem__(self, logical_block: int) -> int:
        return self.block_ids[logical_block]

    def __iter__(self):
        return iter(self.block_ids)

    def copy(self) -> BlockTable:
        return BlockTable(self.block_size, self.block_ids, self.num_tokens)


__all__ = ["BlockTable", "blocks_needed", "slot_mapping"]
