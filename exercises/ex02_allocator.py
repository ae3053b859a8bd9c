# Generated from solutions/ex02_allocator.py by `python -m paged course sync`. Edit only the marked regions;
# grade with `python -m paged grade`.

"""Exercise 02: a block allocator with a free list and reference counts (chapter 02).

The KV cache pool holds ``num_blocks`` blocks, numbered ``0 .. num_blocks - 1``. The allocator keeps

- ``free_list``: a ``deque`` of the free block ids, handed out from the front; a freed block goes to
  the back (first in, first out);
- ``ref_counts``: for every block, how many block tables hold it (0 = free).

Implement ``allocate``, ``free`` and ``incref`` so that

- ``allocate()`` takes the front of the free list, sets its count to 1 and returns its id; on an empty
  free list it raises ``NoFreeBlocksError(1, 0)`` (requested 1, available 0);
- ``free(b)`` drops one reference; when the count reaches 0 the block goes to the back of the free list;
- ``incref(b)`` adds one reference to a block in use (a fork shares it);
- ``free`` and ``incref`` raise ``ValueError`` for an id outside ``0 .. num_blocks - 1`` (or not an int)
  and for a block that is free (count 0), and change nothing when they raise.

This is vLLM v0's ``vllm/core/block/naive_block.py`` idea in a few lines. Check with
``python -m paged grade ch02``.
"""

from __future__ import annotations

from collections import deque

from paged.core.allocator import NoFreeBlocksError


class BlockAllocator:
    """Free list + reference counts over blocks ``0 .. num_blocks - 1``."""

    def __init__(self, num_blocks: int):
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_list: deque[int] = deque(range(num_blocks))
        self.ref_counts: list[int] = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list)

    def ref_count(self, block_id: int) -> int:
        return self.ref_counts[block_id]

    def allocate(self) -> int:
        """Front of the free list, count set to 1; ``NoFreeBlocksError(1, 0)`` when none is free."""
        raise NotImplementedError("ch02.ex1: popleft from free_list (empty: NoFreeBlocksError(1, 0)); count = 1")

    def _check_in_use(self, block_id: int, op: str) -> None:
        """Raise ValueError unless ``block_id`` is a valid id of a block in use."""
        raise NotImplementedError("ch02.ex2: ValueError unless an int in 0..num_blocks-1 with count > 0")

    def free(self, block_id: int) -> None:
        """Drop one reference; at zero, append the block to the back of the free list."""
        self._check_in_use(block_id, "free")
        raise NotImplementedError("ch02.ex3: decrement the count; at 0 append the block to the back of free_list")

    def incref(self, block_id: int) -> None:
        """One more holder for a block in use."""
        self._check_in_use(block_id, "incref")
        raise NotImplementedError("ch02.ex4: one more reference")
