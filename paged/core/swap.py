"""Swap bookkeeping for ``BlockSpaceManager``: which blocks to copy when a sequence moves GPU <-> CPU.

Forked sequences share blocks. When the first of them is swapped out, a shared GPU block is copied to
a new CPU block once; a sibling swapped out later reuses that CPU copy (one more reference) instead of
copying again, and likewise on the way back in. ``SwapMaps`` remembers these copies as
``out: gpu -> cpu`` and ``in_: cpu -> gpu``. A remembered copy is only valid while both blocks hold the
same data, so it is forgotten as soon as either block is freed to zero or the GPU block is written in
place (``forget_gpu`` / ``forget_cpu``, O(1) each: both maps are one-to-one and kept with their inverse).

Source: vLLM v0 ``vllm/core/block_manager.py`` (``swap_out`` / ``swap_in`` map every block of a
sequence group once, through ``vllm/core/block/cpu_gpu_block_allocator.py``); paper §4.5 (swapping).
"""

from __future__ import annotations

from collections.abc import Callable

from paged.core.allocator import BlockAllocator, NoFreeBlocksError
from paged.core.block_table import BlockTable


class SwapMaps:
    """Copies made by swaps that a sibling sharing the block can reuse."""

    def __init__(self) -> None:
        self.out: dict[int, int] = {}  # GPU block -> its CPU copy
        self.in_: dict[int, int] = {}  # CPU block -> its GPU copy
        self._out_by_cpu: dict[int, int] = {}  # inverse of ``out``
        self._in_by_gpu: dict[int, int] = {}  # inverse of ``in_``

    def __bool__(self) -> bool:
        """Whether any copy is remembered (the block manager skips the bookkeeping when none is)."""
        return bool(self.out or self.in_)

    def blocks_to_copy_out(self, table: BlockTable) -> int:
        """New CPU blocks a swap-out of ``table`` (GPU ids) needs."""
        return sum(1 for b in table if b not in self.out)

    def blocks_to_copy_in(self, cpu_table: BlockTable) -> int:
        """New GPU blocks a swap-in of ``cpu_table`` (CPU ids) needs."""
        return sum(1 for c in cpu_table if c not in self.in_)

    def move(
        self,
        table: BlockTable,
        dst_allocator: BlockAllocator,
        allocate: Callable[[], int],
        out: bool,
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Map every block of ``table`` to a block of the other pool: reuse a remembered copy (incref)
        or allocate one with ``allocate`` and record the pair to copy.

        Returns ``(pairs, dst_ids)``: the ``(src, dst)`` copies to make and the new table's ids.
        Raises ``NoFreeBlocksError`` before changing anything when the other pool is too small.
        """
        mapping, inverse = (self.out, self._out_by_cpu) if out else (self.in_, self._in_by_gpu)
        needed = self.blocks_to_copy_out(table) if out else self.blocks_to_copy_in(table)
        if needed > dst_allocator.num_free_blocks:
            raise NoFreeBlocksError(
                needed, dst_allocator.num_free_blocks, "CPU swap space" if out else "GPU KV cache"
            )
        pairs, dst_ids = [], []
        for src in table:
            dst = mapping.get(src)
            if dst is None:
                dst = allocate()
                mapping[src] = dst
                inverse[dst] = src
                pairs.append((src, dst))
            else:
                dst_allocator.incref(dst)
            dst_ids.append(dst)
        return pairs, dst_ids

    def forget_gpu(self, block_id: int) -> None:
        """GPU block freed to zero or written in place: no remembered copy involving it is valid."""
        cpu = self.out.pop(block_id, None)
        if cpu is not None:
            del self._out_by_cpu[cpu]
        cpu = self._in_by_gpu.pop(block_id, None)
        if cpu is not None:
            del self.in_[cpu]

    def forget_cpu(self, block_id: int) -> None:
        """CPU block freed to zero: no remembered copy involving it is valid."""
        gpu = self.in_.pop(block_id, None)
        if gpu is not None:
            del self._in_by_gpu[gpu]
        gpu = self._out_by_cpu.pop(block_id, None)
        if gpu is not None:
            del self.out[gpu]
