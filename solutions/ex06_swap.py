"""Exercise 06, second part: the CPU swap space, where a sequence preempted by swap keeps its KV blocks
(chapter 06).

You build ``SwapSpace``, the small component the block manager delegates swapping to
(``paged/core/swap.py``; ``BlockSpaceManager.swap_out`` / ``swap_in`` call it, check the GPU side and
release the GPU blocks). It owns the CPU pool's allocator ``self.allocator`` (chapter 02: ``allocate``,
``incref``, ``free_many``, ``ref_count``, ``num_free_blocks``), one CPU ``BlockTable`` per swapped-out
sequence in ``self.tables`` (``seq_id -> table``) and ``self.maps``, the copies a sibling can reuse.

Forked sequences share GPU blocks (chapter 05). When the first of them is swapped out, a shared block is
copied to a new CPU block once; a sibling swapped out later reuses that CPU copy (one more reference)
instead of copying again, and likewise on the way back in. ``self.maps`` remembers these copies:
``maps.out[gpu] = cpu`` and ``maps.in_[cpu] = gpu``; ``maps.remember(src, dst, out)`` records one (with
the inverse that lets ``maps.forget_cpu`` / ``forget_gpu`` find it in O(1)). A remembered copy is valid
only while both blocks hold the same data: the manager forgets GPU blocks freed to zero or written in
place; the swap space forgets CPU blocks it frees to zero (``maps.forget_cpu``).

6. ``swap_out`` (ch06.ex6): a GPU table into the CPU pool, or ``None`` when the CPU pool is short.
7. ``swap_in`` (ch06.ex7): a CPU table back to the GPU, its CPU blocks released.

``free`` is given (the reference's; it calls ``SwapMaps.release``). ``SwapMaps.move`` in
``paged/core/swap.py`` is the reference's answer to both steps: write them without it.

Source: vLLM v0 ``vllm/core/block_manager.py`` (``SelfAttnBlockSpaceManager.swap_out`` / ``swap_in``)
and ``vllm/core/block/cpu_gpu_block_allocator.py`` (``CpuGpuBlockAllocator.swap``), 0.10.2, the last
release with v0 (removed in 0.11.0); PagedAttention paper §4.5. Check each step with
``check("ch06.exK")``.
"""

from __future__ import annotations

from collections.abc import Callable

from paged.core.allocator import BlockAllocator
from paged.core.block_table import BlockTable
from paged.core.swap import SwapMaps as ReferenceSwapMaps
from paged.core.swap import SwapSpace as ReferenceSwapSpace


class SwapMaps(ReferenceSwapMaps):
    """The reference maps with one helper to record a copy (given)."""

    def remember(self, src: int, dst: int, out: bool) -> None:
        """Record that block ``dst`` of the other pool is a copy of ``src``: ``out[src] = dst`` (GPU ->
        CPU) when ``out``, else ``in_[src] = dst`` (CPU -> GPU), with the inverse ``forget_*`` reads."""
        if out:
            self.out[src], self._out_by_cpu[dst] = dst, src
        else:
            self.in_[src], self._in_by_gpu[dst] = dst, src


class SwapSpace(ReferenceSwapSpace):
    """The CPU pool and the tables of the swapped-out sequences (module docstring). Constructed like the
    reference: ``SwapSpace(block_size, num_cpu_blocks, allocator_cls=BlockAllocator)``.

    Invariants after every call: each CPU block's reference count equals the number of CPU tables that
    hold it; a remembered copy joins two held blocks with the same data; a CPU table covers exactly the
    tokens of the GPU table it was copied from.
    """

    def __init__(self, block_size: int, num_cpu_blocks: int, allocator_cls=BlockAllocator):
        super().__init__(block_size, num_cpu_blocks, allocator_cls)
        self.maps = SwapMaps()

    def swap_out(self, seq_id: int, table: BlockTable) -> list[tuple[int, int]] | None:
        """Copy ``table`` (GPU ids, left unchanged) into the CPU pool as ``seq_id``'s CPU table.

        Returns the ``(gpu_block, cpu_block)`` pairs the engine must copy, in table order: one per block
        without a remembered CPU copy, which gets a fresh CPU block (and is remembered); a block with a
        remembered copy reuses it (one more reference) and is not copied again. Returns ``None``, changing
        nothing (tables, counts, free queue, maps), when the CPU pool has fewer free blocks than the fresh
        copies need. ``self.tables[seq_id]`` holds as many tokens as ``table``. The caller releases the
        GPU blocks.
        """
        maps, cpu = self.maps, self.allocator
        # BEGIN SOLUTION ch06.ex6 -- one fresh CPU copy per block not copied before, or None and no change
        # HINT: Which blocks of the table cost a CPU block? A sibling swapped out before may have left a
        # HINT+ copy of a shared block. Decide whether they all fit before you allocate anything.
        # HINT: Count the blocks not in maps.out and compare with cpu.num_free_blocks. Then per block:
        # HINT+ reuse maps.out[b] with cpu.incref, or cpu.allocate() a copy, maps.remember it and list the
        # HINT+ pair. Record the CPU table with table.num_tokens.
        if sum(b not in maps.out for b in table) > cpu.num_free_blocks:
            return None
        pairs, cpu_ids = [], []
        for gpu_block in table:
            cpu_block = maps.out.get(gpu_block)
            if cpu_block is None:
                cpu_block = cpu.allocate()
                maps.remember(gpu_block, cpu_block, out=True)
                pairs.append((gpu_block, cpu_block))
            else:
                cpu.incref(cpu_block)
            cpu_ids.append(cpu_block)
        self.tables[seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
        return pairs
        # END SOLUTION

    def swap_in(
        self, seq_id: int, gpu_allocator, allocate_gpu: Callable[[], int]
    ) -> tuple[list[tuple[int, int]], BlockTable]:
        """Bring ``seq_id``'s CPU table back to the GPU pool (the caller has checked there is room).

        Returns ``(pairs, gpu_table)``: the ``(cpu_block, gpu_block)`` pairs to copy, in table order, one
        per CPU block without a remembered GPU copy, which gets a block from ``allocate_gpu()`` (and is
        remembered); a block whose copy a sibling brought back already shares it (``gpu_allocator.incref``)
        and is not copied again. The GPU table holds as many tokens as the CPU table.

        Afterwards ``seq_id`` has no CPU table, each of its CPU blocks has one holder fewer (the table's
        tail reaches the free queue first), and a CPU block freed to zero is forgotten by the maps
        (``maps.forget_cpu``): its next owner's data is not this copy.

        Raises:
            KeyError: ``seq_id`` is not swapped out.
        """
        maps, cpu = self.maps, self.allocator
        # BEGIN SOLUTION ch06.ex7 -- reuse or copy each block back, then one holder fewer per CPU block
        # HINT: Mirror swap_out, in the other direction: which map holds the GPU copy a sibling already
        # HINT+ brought back, and which allocator counts its new holder? Only then give the CPU blocks back.
        # HINT: Pop the CPU table; per block reuse maps.in_[c] (gpu_allocator.incref) or allocate_gpu() and
        # HINT+ remember it with its pair. Then cpu.free_many(reversed(ids)) and forget_cpu every block whose
        # HINT+ count reached 0.
        cpu_table = self.tables.pop(seq_id)
        pairs, gpu_ids = [], []
        for cpu_block in cpu_table:
            gpu_block = maps.in_.get(cpu_block)
            if gpu_block is None:
                gpu_block = allocate_gpu()
                maps.remember(cpu_block, gpu_block, out=False)
                pairs.append((cpu_block, gpu_block))
            else:
                gpu_allocator.incref(gpu_block)
            gpu_ids.append(gpu_block)
        cpu.free_many(reversed(cpu_table.block_ids))
        for cpu_block in cpu_table:
            if cpu.ref_count(cpu_block) == 0:
                maps.forget_cpu(cpu_block)
        return pairs, BlockTable(self.block_size, gpu_ids, cpu_table.num_tokens)
        # END SOLUTION
