"""The CPU swap space: where a sequence preempted by swap keeps its KV blocks (vLLM v0's feature,
removed with v0 in 0.11.0).

``SwapSpace`` is the small component ``BlockSpaceManager`` delegates swapping to: the CPU pool's
allocator, one CPU block table per swapped-out sequence, and ``SwapMaps``. Its two moves answer
allocate-or-``None``: ``swap_out`` returns the block pairs to copy, or ``None`` when the CPU pool has no
room (nothing changes); ``swap_in`` likewise for the GPU side (the block manager checks the watermark).

Forked sequences share blocks. When the first of them is swapped out, a shared GPU block is copied to
a new CPU block once; a sibling swapped out later reuses that CPU copy (one more reference) instead of
copying again, and likewise on the way back in. ``SwapMaps`` remembers these copies as
``out: gpu -> cpu`` and ``in_: cpu -> gpu``. A remembered copy is only valid while both blocks hold the
same data, so it is forgotten as soon as either block is freed to zero or the GPU block is written in
place (``forget_gpu`` / ``forget_cpu``, O(1) each: both maps are one-to-one and kept with their inverse).

Source: vLLM v0 ``vllm/core/block_manager.py``, 0.10.2 (``swap_out`` / ``swap_in`` move the blocks of
every sequence of a group through ``CpuGpuBlockAllocator.swap``, ``vllm/core/block/cpu_gpu_block_allocator.py``);
paper §4.5 (swapping).
"""

from __future__ import annotations

from collections.abc import Callable

from paged.core.allocator import BlockAllocator
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

    def blocks_to_copy(self, table: BlockTable, out: bool) -> int:
        """New blocks of the other pool a swap of ``table`` needs: out (GPU ids) or in (CPU ids); blocks
        with a remembered copy are reused."""
        mapping = self.out if out else self.in_
        return sum(1 for b in table if b not in mapping)

    def move(
        self,
        table: BlockTable,
        dst_allocator: BlockAllocator,
        allocate: Callable[[], int],
        out: bool,
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Map every block of ``table`` to a block of the other pool: reuse a remembered copy (incref)
        or allocate one with ``allocate`` and record the pair to copy.

        Returns ``(pairs, dst_ids)``: the ``(src, dst)`` copies to make and the new table's ids. The
        caller has checked that the other pool has the blocks (``blocks_to_copy``).
        """
        mapping, inverse = (self.out, self._out_by_cpu) if out else (self.in_, self._in_by_gpu)
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
        _forget(block_id, (self.out, self._out_by_cpu), (self._in_by_gpu, self.in_))

    def forget_cpu(self, block_id: int) -> None:
        """CPU block freed to zero: no remembered copy involving it is valid."""
        _forget(block_id, (self.in_, self._in_by_gpu), (self._out_by_cpu, self.out))

    def release(self, allocator, table: BlockTable, forget: Callable[[int], None]) -> None:
        """Drop one reference to each block of ``table`` (a block of ``allocator``'s pool), tail first, and
        ``forget`` (``forget_gpu`` / ``forget_cpu``) the copies of the blocks freed to zero."""
        allocator.free_many(reversed(table.block_ids))
        if self:
            for b in table:
                if allocator.ref_count(b) == 0:
                    forget(b)


def _forget(block_id: int, *maps: tuple[dict[int, int], dict[int, int]]) -> None:
    """Drop ``block_id`` from each ``(map keyed by its side, map keyed by the other side)`` pair."""
    for by_block, by_partner in maps:
        partner = by_block.pop(block_id, None)
        if partner is not None:
            del by_partner[partner]


class SwapSpace:
    """The CPU pool of ``num_cpu_blocks`` blocks and the tables of the sequences swapped out to it.

    Args:
        block_size: tokens per block (the GPU pool's; the config has checked it).
        num_cpu_blocks: blocks of CPU swap space (>= 0; 0: nothing can be swapped out).
        allocator_cls: the allocator part (``paged.engine.parts``).
    """

    def __init__(self, block_size: int, num_cpu_blocks: int, allocator_cls=BlockAllocator):
        self.block_size = block_size
        self.allocator = allocator_cls(num_cpu_blocks)
        self.tables: dict[int, BlockTable] = {}  # seq_id -> CPU blocks of a swapped-out sequence
        self.maps = SwapMaps()

    def swap_out(self, seq_id: int, table: BlockTable) -> list[tuple[int, int]] | None:
        """Copy ``table`` (GPU ids) into the CPU pool; returns ``(gpu_block, cpu_block)`` pairs (blocks shared
        with an already swapped-out sibling are copied once), or ``None`` when the CPU pool has no room.
        The caller releases the GPU blocks."""
        if self.maps.blocks_to_copy(table, out=True) > self.allocator.num_free_blocks:
            return None
        pairs, cpu_ids = self.maps.move(table, self.allocator, self.allocator.allocate, out=True)
        self.tables[seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
        return pairs

    def swap_in(
        self, seq_id: int, gpu_allocator, allocate_gpu: Callable[[], int]
    ) -> tuple[list[tuple[int, int]], BlockTable]:
        """Move ``seq_id``'s CPU table back: returns the ``(cpu_block, gpu_block)`` pairs to copy and the new
        GPU table. The caller has checked the GPU blocks (``SwapMaps.blocks_to_copy``)."""
        cpu_table = self.tables.pop(seq_id)
        pairs, gpu_ids = self.maps.move(cpu_table, gpu_allocator, allocate_gpu, out=False)
        self.maps.release(self.allocator, cpu_table, self.maps.forget_cpu)
        return pairs, BlockTable(self.block_size, gpu_ids, cpu_table.num_tokens)

    def free(self, seq_id: int) -> None:
        """Release a swapped-out sequence's CPU blocks (a no-op when it has none)."""
        table = self.tables.pop(seq_id, None)
        if table is not None:
            self.maps.release(self.allocator, table, self.maps.forget_cpu)
