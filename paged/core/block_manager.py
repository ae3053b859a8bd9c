"""The block space manager: the scheduler's only view of KV memory.

It owns an allocator for the GPU pool and one for the CPU swap space, one ``BlockTable`` per sequence,
and (optionally) the ``PrefixCache``. The scheduler asks it questions (``can_allocate``,
``can_append_slots``, ``can_swap_in/out``) and gives it orders (``allocate``, ``append_slots``, ``fork``,
``free``, ``swap_in/out``); the orders that move data return ``(src, dst)`` block pairs that the engine
hands to ``KVCache.copy_blocks`` / ``swap_in`` / ``swap_out``.

Rules (vLLM v0 ``vllm/core/block_manager.py``, v1 ``vllm/v1/core/kv_cache_manager.py``, paper §4.3-4.5):

- **Slots chunk by chunk.** ``allocate(seq, n)`` admits a sequence: it shares the longest cached prefix
  and gives slots to the next ``n`` tokens; ``append_slots(seq, n)`` gives slots to ``n`` more (the next
  prefill chunk, or the one token a decode computes). A long prompt never reserves its whole length.
- **Watermark:** admitting a sequence must leave ``watermark_blocks = int(watermark * num_gpu_blocks)``
  blocks free, so new work does not force an immediate preemption of running sequences (seed error E9:
  an admission rule, not a preemption trigger). ``NEVER`` if the whole sequence needs more than
  ``num_gpu_blocks - watermark_blocks`` blocks.
- **Copy-on-write:** forked sequences share every block (reference counts). A sequence about to write
  into a shared, partially filled last block first gets a private copy: ``append_slots`` returns the
  ``(src, dst)`` pair and the engine copies the block before the step writes the new token.
- **Prefix caching:** ``allocate`` reuses the longest cached prefix of full blocks, never the whole
  prompt (at least the last token is computed); a block is cached when the step its slots were given
  for fills it. Freed cached blocks stay hit-able until the free queue hands them out again.
- Every order is all-or-nothing: it checks first and raises before changing any count or table.
"""

from __future__ import annotations

import enum

from paged.core.allocator import BlockAllocator, NoFreeBlocksError
from paged.core.block_table import BlockTable, blocks_needed
from paged.core.prefix_cache import HashFn, PrefixCache
from paged.core.sequence import Sequence
from paged.core.swap import SwapMaps


def copy_on_write(table: BlockTable, allocator, allocate) -> list[tuple[int, int]]:
    """Before new tokens are written after ``table.num_tokens``: if the last block is partially filled and
    shared (ref count > 1, after a fork), give the table a private block from ``allocate()``, drop one
    reference to the shared one, and return ``[(shared, private)]`` for the engine to copy; else ``[]``.
    The caller has checked that a free block exists. Paper §4.4; vLLM v0 ``vllm/core/block/cpu_gpu_block_allocator.py``
    (``cow_block_if_not_appendable``)."""
    last = table.block_ids[-1] if table.block_ids else None
    if last is None or table.num_tokens % table.block_size == 0 or allocator.ref_count(last) == 1:
        return []
    table.block_ids[-1] = allocate()
    allocator.free(last)  # one holder fewer; the other holders keep it
    return [(last, table.block_ids[-1])]


class AllocStatus(enum.Enum):
    """Answer of ``can_allocate`` / ``can_swap_in``: admit now, wait for memory, or never fits."""

    OK = "ok"
    LATER = "later"
    NEVER = "never"

    def __bool__(
        self,
    ) -> bool:  # truthy only when OK, so `if manager.can_swap_in(seq):` reads right
        return self is AllocStatus.OK


class BlockSpaceManager:
    """Block tables for every sequence over a GPU pool and a CPU swap space.

    Args:
        block_size: tokens per block (> 0).
        num_gpu_blocks: blocks in the GPU KV cache pool (> 0).
        num_cpu_blocks: blocks of CPU swap space (>= 0).
        watermark: fraction of GPU blocks that admission keeps free, in [0, 1).
        enable_prefix_caching: reuse cached full blocks across sequences.
        hash_fn: block hash for prefix caching (default ``prefix_cache.default_hash``; tests inject weak ones).
        allocator_cls, prefix_cache_cls, copy_on_write: the parts (``paged.engine.parts``) it uses.

    Raises:
        ValueError: bad sizes; a sequence allocated twice, unknown, or of another block size.
        NoFreeBlocksError: an order that needs more free blocks than there are (nothing changes).
    """

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int = 0,
        watermark: float = 0.01,
        enable_prefix_caching: bool = False,
        hash_fn: HashFn | None = None,
        allocator_cls=BlockAllocator,
        prefix_cache_cls=PrefixCache,
        copy_on_write=copy_on_write,
    ):
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        if num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be > 0, got {num_gpu_blocks}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.block_size, self.num_gpu_blocks, self.num_cpu_blocks = (
            block_size,
            num_gpu_blocks,
            num_cpu_blocks,
        )
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.gpu_allocator = allocator_cls(num_gpu_blocks)
        self.cpu_allocator = allocator_cls(num_cpu_blocks)
        self.prefix_cache = prefix_cache_cls(block_size, hash_fn) if enable_prefix_caching else None
        self.block_tables: dict[int, BlockTable] = {}  # seq_id -> GPU blocks
        self.cpu_block_tables: dict[
            int, BlockTable
        ] = {}  # seq_id -> CPU blocks of swapped-out sequences
        self.swaps = SwapMaps()
        self.copy_on_write = copy_on_write

    # ---- queries -------------------------------------------------------------------------------
    def get_num_free_gpu_blocks(self) -> int:
        """Free GPU blocks, counting freed cached blocks (they are reusable; reuse evicts them)."""
        return self.gpu_allocator.num_free_blocks

    def get_num_free_cpu_blocks(self) -> int:
        return self.cpu_allocator.num_free_blocks

    def get_block_table(self, seq: Sequence) -> list[int]:
        """Physical GPU block ids of ``seq``, logical order (a copy)."""
        return list(self._table(seq).block_ids)

    def has_blocks(self, seq: Sequence) -> bool:
        return seq.seq_id in self.block_tables or seq.seq_id in self.cpu_block_tables

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens looked up (0.0 when off)."""
        return self.prefix_cache.hit_rate if self.prefix_cache else 0.0

    def _table(self, seq: Sequence) -> BlockTable:
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            where = (
                "is swapped out to CPU" if seq.seq_id in self.cpu_block_tables else "has no blocks"
            )
            raise ValueError(f"sequence {seq.seq_id} {where} (never allocated, or already freed)")
        return table

    def _cpu_table(self, seq: Sequence) -> BlockTable:
        table = self.cpu_block_tables.get(seq.seq_id)
        if table is None:
            raise ValueError(f"sequence {seq.seq_id} is not swapped out")
        return table

    # ---- admission -----------------------------------------------------------------------------
    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks ``allocate`` would reuse: full blocks strictly before the last token."""
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.lookup(seq, (len(seq) - 1) // self.block_size)

    def num_cached_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` that ``allocate`` would take from the prefix cache now (0 when caching is off)."""
        return len(self._cached_prefix(seq)) * self.block_size

    def _admission_needs(self, seq: Sequence, num_tokens: int | None) -> tuple[list[int], int, int]:
        """``(hits, new blocks, free hits)`` for admitting ``seq`` with slots for ``num_tokens`` after the hits."""
        hits = self._cached_prefix(seq)
        upto = len(seq) if num_tokens is None else len(hits) * self.block_size + num_tokens
        free_hits = sum(
            self.gpu_allocator.ref_count(b) == 0 for b in hits
        )  # they leave the free queue
        return hits, blocks_needed(upto, self.block_size) - len(hits), free_hits

    def can_allocate(self, seq: Sequence, num_tokens: int | None = None) -> AllocStatus:
        """``NEVER`` if the whole sequence cannot fit beside the watermark even in an empty pool; ``OK`` if
        ``free - needed >= watermark_blocks`` for the cached prefix plus ``num_tokens`` more tokens (default:
        all); else ``LATER``. Hits on in-use cached blocks need no free block."""
        if self.num_gpu_blocks - blocks_needed(len(seq), self.block_size) < self.watermark_blocks:
            return AllocStatus.NEVER
        _, new, free_hits = self._admission_needs(seq, num_tokens)
        return self._status_now(new + free_hits)

    def _status_now(self, needed: int) -> AllocStatus:
        """``OK`` if taking ``needed`` free GPU blocks leaves ``watermark_blocks`` free, else ``LATER``."""
        ok = self.gpu_allocator.num_free_blocks - needed >= self.watermark_blocks
        return AllocStatus.OK if ok else AllocStatus.LATER

    def allocate(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Admit ``seq``: share its longest cached prefix, then give slots to the next ``num_tokens`` tokens
        (default: all). Sets ``num_cached_tokens`` and ``num_computed_tokens`` to the cached tokens."""
        if seq.block_size != self.block_size:
            raise ValueError(
                f"sequence {seq.seq_id} uses block_size {seq.block_size}, the manager {self.block_size}"
            )
        if self.has_blocks(seq):
            raise ValueError(
                f"sequence {seq.seq_id} already has blocks; free it before allocating again"
            )
        gpu, bs = self.gpu_allocator, self.block_size
        hits, num_new, free_hits = self._admission_needs(seq, num_tokens)
        if num_new + free_hits > gpu.num_free_blocks:
            raise NoFreeBlocksError(num_new + free_hits, gpu.num_free_blocks)
        for b in hits:  # take the hits before allocating, so that allocation cannot evict them
            (gpu.incref if gpu.ref_count(b) else gpu.take)(b)
        cached = len(hits) * bs
        table = BlockTable(
            bs,
            hits + self._new_gpu_blocks(num_new),
            len(seq) if num_tokens is None else cached + num_tokens,
        )
        self.block_tables[seq.seq_id] = table
        seq.num_cached_tokens = seq.num_computed_tokens = cached
        if self.prefix_cache is not None:
            self.prefix_cache.record_query(len(seq), cached)
            self.prefix_cache.insert(seq, table.block_ids, len(hits), table.num_tokens // bs)

    def _new_gpu_blocks(self, n: int) -> list[int]:
        """``n`` blocks from the front of the free queue; cached ones among them are evicted (forgotten)."""
        new = self.gpu_allocator.allocate_many(n)
        if self.prefix_cache is not None:
            for b in new:
                self.prefix_cache.evict(b)
        return new

    # ---- growth: the next chunk or decode token ------------------------------------------------
    def _append_needs(
        self, seq: Sequence, table: BlockTable, num_tokens: int | None
    ) -> tuple[int, int, bool]:
        """``(tokens with slots after, new blocks, copy-on-write?)`` to give slots to ``num_tokens`` more."""
        have, bs = table.num_tokens, self.block_size
        upto = len(seq) if num_tokens is None else have + num_tokens
        if not have <= upto <= len(seq):
            raise ValueError(
                f"sequence {seq.seq_id}: slots for {upto} tokens asked; it has {len(seq)} tokens "
                f"and {have} slots"
            )
        cow = (
            upto > have and have % bs != 0 and self.gpu_allocator.ref_count(table.block_ids[-1]) > 1
        )
        return upto, blocks_needed(upto, bs) - len(table) + cow, cow

    def can_append_slots(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        """Whether the free blocks cover ``num_tokens`` more tokens (default: all that have no slot yet),
        plus a copy-on-write block if needed."""
        return (
            self._append_needs(seq, self._table(seq), num_tokens)[1]
            <= self.gpu_allocator.num_free_blocks
        )

    def append_slots(self, seq: Sequence, num_tokens: int | None = None) -> list[tuple[int, int]]:
        """Give slots to ``num_tokens`` more tokens of ``seq`` (default: all that have none yet).

        Returns the copy-on-write pairs ``[(src, dst)]`` (at most one): ``seq`` writes into a shared,
        partially filled last block, so it now owns ``dst``, a copy of ``src`` that the engine must fill
        with ``KVCache.copy_blocks`` before the forward pass writes the new tokens.
        """
        table = self._table(seq)
        upto, needed, cow = self._append_needs(seq, table, num_tokens)
        if needed > self.gpu_allocator.num_free_blocks:
            raise NoFreeBlocksError(needed, self.gpu_allocator.num_free_blocks)
        have, bs = table.num_tokens, self.block_size
        new = self._new_gpu_blocks(needed)  # the copy-on-write block first, when one is needed
        copies = (
            self.copy_on_write(table, self.gpu_allocator, lambda: new.pop(0)) if upto > have else []
        )
        if len(copies) != cow:
            raise RuntimeError(
                f"copy_on_write returned {copies} for sequence {seq.seq_id}, whose last block is "
                f"{'' if cow else 'not '}shared and partly filled"
            )
        if upto > have and have % bs and not cow and self.swaps:
            self.swaps.forget_gpu(
                table.block_ids[-1]
            )  # written in place: older swap copies of it are stale
        table.block_ids += new
        table.num_tokens = upto
        if self.prefix_cache is not None:
            self.prefix_cache.insert(seq, table.block_ids, have // bs, upto // bs)
        return copies

    # ---- forks and frees -----------------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (one more reference each; no copy, no new block)."""
        if parent.seq_id not in self.block_tables:
            raise ValueError(f"fork: parent sequence {parent.seq_id} has no GPU blocks")
        if self.has_blocks(child):
            raise ValueError(f"fork: child sequence {child.seq_id} already has blocks")
        table = self.block_tables[parent.seq_id]
        for b in table:
            self.gpu_allocator.incref(b)
        self.block_tables[child.seq_id] = table.copy()

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks, tail first (a no-op for a sequence without blocks, as in vLLM)."""
        for tables, allocator, forget in (
            (self.block_tables, self.gpu_allocator, self.swaps.forget_gpu),
            (self.cpu_block_tables, self.cpu_allocator, self.swaps.forget_cpu),
        ):
            table = tables.pop(seq.seq_id, None)
            if table is not None:
                self._release(table, allocator, forget)

    def _release(self, table: BlockTable, allocator, forget) -> None:
        """Drop one reference to each block of ``table``, tail first; forget swap copies of freed blocks."""
        allocator.free_many(reversed(table.block_ids))
        if self.swaps:
            for b in table:
                if allocator.ref_count(b) == 0:
                    forget(b)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. Returns False (and changes nothing) while any GPU block is in use."""
        if self.prefix_cache is None:
            return True
        if self.gpu_allocator.num_free_blocks < self.num_gpu_blocks:
            return False
        self.prefix_cache.clear()
        return True

    # ---- swapping (preemption by swap) ----------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        """Whether the CPU swap space has room for ``seq``'s blocks (blocks shared with an already
        swapped-out sibling are copied once)."""
        return self.swaps.blocks_to_copy_out(self._table(seq)) <= self.cpu_allocator.num_free_blocks

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move ``seq`` to CPU; returns ``(gpu_block, cpu_block)`` pairs to copy (shared blocks once)."""
        table = self._table(seq)
        pairs, cpu_ids = self.swaps.move(
            table, self.cpu_allocator, self.cpu_allocator.allocate, out=True
        )
        self._release(table, self.gpu_allocator, self.swaps.forget_gpu)
        del self.block_tables[seq.seq_id]
        self.cpu_block_tables[seq.seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
        return pairs

    def can_swap_in(self, seq: Sequence, num_tokens: int = 0) -> AllocStatus:
        """Watermark rule for bringing ``seq`` back with room for ``num_tokens`` more: as ``can_allocate``."""
        cpu_table = self._cpu_table(seq)
        needed = self.swaps.blocks_to_copy_in(cpu_table)
        if self.num_gpu_blocks - needed < self.watermark_blocks:
            return AllocStatus.NEVER
        grow = blocks_needed(cpu_table.num_tokens + num_tokens, self.block_size) - len(cpu_table)
        return self._status_now(
            needed + grow + (num_tokens > 0 and cpu_table.num_tokens % self.block_size > 0)
        )

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring ``seq`` back to the GPU; returns ``(cpu_block, gpu_block)`` pairs to copy (shared once)."""
        cpu_table = self._cpu_table(seq)
        pairs, gpu_ids = self.swaps.move(
            cpu_table, self.gpu_allocator, lambda: self._new_gpu_blocks(1)[0], out=False
        )
        self._release(cpu_table, self.cpu_allocator, self.swaps.forget_cpu)
        del self.cpu_block_tables[seq.seq_id]
        self.block_tables[seq.seq_id] = BlockTable(self.block_size, gpu_ids, cpu_table.num_tokens)
        return pairs
