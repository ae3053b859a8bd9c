"""The block space manager: the scheduler's only view of KV memory.

It owns an allocator for the GPU pool, one ``BlockTable`` per sequence, (optionally) the ``PrefixCache``,
and the CPU ``SwapSpace`` (``paged/core/swap.py``). The scheduler talks to it in vLLM v1's three verbs
(``vllm/v1/core/kv_cache_manager.py``, ``KVCacheManager``, 0.8.5 and later):

- ``get_computed_blocks(seq)``: the cached prefix a waiting sequence can share (the one prefix lookup
  of an admission);
- ``allocate_slots(seq, num_new_tokens, computed)``: slots for the next ``num_new_tokens`` tokens,
  returned as ``NewBlocks``, or ``None`` when the pool cannot give them now (the scheduler then preempts
  or waits; nothing has changed);
- ``free(seq)``.

Swapping (vLLM v0's preemption by swap, which v1 dropped; 0.10.2) is ``swap_out`` / ``swap_in``, also
allocate-or-``None``. ``fork`` shares a parent's blocks with a child (v0's parallel sampling).

Rules (vLLM v0 ``vllm/core/block_manager.py``, v1 ``vllm/v1/core/kv_cache_manager.py``, both 0.10.2; paper
§4.3-4.5):

- **Slots chunk by chunk.** ``allocate_slots`` admits a sequence that has no table (sharing the computed
  blocks, then slots for the next ``n`` tokens) and grows one that has (the next prefill chunk, or the
  one token a decode computes). A long prompt never reserves its whole length.
- **Watermark:** admitting a sequence (``allocate_slots`` without a table, ``swap_in``) must leave
  ``watermark_blocks = int(watermark * num_gpu_blocks)`` blocks free, so new work does not force an
  immediate preemption of running sequences (seed error E9: an admission rule, not a preemption trigger).
  Growth only needs the blocks. ``can_ever_fit`` says whether a whole sequence fits beside the watermark
  in an empty pool; the scheduler asks it once, when a request arrives.
- **Copy-on-write:** forked sequences share every block (reference counts). A sequence about to write
  into a shared, partially filled last block first gets a private copy: ``NewBlocks.copies`` holds the
  ``(src, dst)`` pair and the engine copies the block before the step writes the new token.
- **Prefix caching:** admission reuses the longest cached prefix of full blocks, never the whole prompt
  (at least the last token is computed); a block is cached when the step its slots were given for
  fills it. Freed cached blocks stay hit-able until the free queue hands them out again.
- Every verb is all-or-nothing: it returns ``None`` (or raises on a caller's bug) before changing any
  count or table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from paged.config import CacheConfig
from paged.core.allocator import BlockAllocator
from paged.core.block_table import BlockTable, blocks_needed
from paged.core.prefix_cache import HashFn, PrefixCache
from paged.core.sequence import Sequence
from paged.core.swap import SwapSpace


def copy_on_write(table: BlockTable, allocator, allocate) -> list[tuple[int, int]]:
    """Before new tokens are written after ``table.num_tokens``: if the last block is partially filled and
    shared (ref count > 1, after a fork), give the table a private block from ``allocate()``, drop one
    reference to the shared one, and return ``[(shared, private)]`` for the engine to copy; else ``[]``.
    The caller has checked that a free block exists. Paper §4.4; vLLM v0
    ``NaiveBlockAllocator.cow_block_if_not_appendable``, ``vllm/core/block/naive_block.py``, 0.10.2."""
    last = table.block_ids[-1] if table.block_ids else None
    if last is None or table.num_tokens % table.block_size == 0 or allocator.ref_count(last) == 1:
        return []
    table.block_ids[-1] = allocate()
    allocator.free(last)  # one holder fewer; the other holders keep it
    return [(last, table.block_ids[-1])]


class AllocStatus(enum.Enum):
    """vLLM v0's three-way admission answer (``vllm/core/interfaces.py``, 0.8.5): admit now, wait for
    memory, or never fits. The engine's manager answers with blocks or ``None`` instead (vLLM v1, 0.8.5);
    chapter 01's fragmentation simulator, whose manager admits whole requests, answers with this."""

    OK = "ok"
    LATER = "later"
    NEVER = "never"

    def __bool__(self) -> bool:
        """Truthy only when ``OK``, so ``if manager.can_allocate(n):`` (chapter 01's simulator) reads right."""
        return self is AllocStatus.OK


@dataclass
class NewBlocks:
    """What ``allocate_slots`` gave a sequence (vLLM v1's ``KVCacheBlocks``,
    ``vllm/v1/core/kv_cache_manager.py``, 0.9.2; 0.8.5 has none).

    ``block_ids``: GPU blocks appended to its table (cached hits of an admission included);
    ``copies``: ``(src, dst)`` copy-on-write pairs (at most one): ``dst`` replaced the shared, partly
    filled last block ``src``, and the engine copies ``src`` into it (``KVCache.copy_blocks``) before the
    step writes the new tokens.
    """

    block_ids: list[int] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)


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
        ValueError: bad sizes (checked by ``CacheConfig``); an order for a sequence in the wrong state
            (no blocks, swapped out, slots asked beyond its tokens): a bug of the caller.
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
        CacheConfig(block_size, num_gpu_blocks, num_cpu_blocks, watermark)  # the sizes' one check
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.gpu_allocator = allocator_cls(num_gpu_blocks)
        self.prefix_cache = prefix_cache_cls(block_size, hash_fn) if enable_prefix_caching else None
        self.block_tables: dict[int, BlockTable] = {}  # seq_id -> GPU blocks
        self.swap = SwapSpace(block_size, num_cpu_blocks, allocator_cls)
        self.copy_on_write = copy_on_write

    # ---- queries -------------------------------------------------------------------------------
    def get_num_free_gpu_blocks(self) -> int:
        """Free GPU blocks, counting freed cached blocks (they are reusable; reuse evicts them)."""
        return self.gpu_allocator.num_free_blocks

    def get_num_free_cpu_blocks(self) -> int:
        return self.swap.allocator.num_free_blocks

    @property
    def cpu_block_tables(self) -> dict[int, BlockTable]:
        """``seq_id -> CPU blocks`` of the swapped-out sequences (the swap space's tables)."""
        return self.swap.tables

    def get_block_table(self, seq: Sequence) -> list[int]:
        """Physical GPU block ids of ``seq``, logical order (a copy)."""
        return list(self._table(seq).block_ids)

    def has_blocks(self, seq: Sequence) -> bool:
        return seq.seq_id in self.block_tables or seq.seq_id in self.swap.tables

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens fits beside the watermark in an empty pool (the
        scheduler asks once, when a request arrives or a preempted sequence waits again)."""
        return (
            blocks_needed(num_tokens, self.block_size)
            <= self.num_gpu_blocks - self.watermark_blocks
        )

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens looked up (0.0 when off)."""
        return self.prefix_cache.hit_rate if self.prefix_cache else 0.0

    def _table(self, seq: Sequence) -> BlockTable:
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            where = "is swapped out to CPU" if seq.seq_id in self.swap.tables else "has no blocks"
            raise ValueError(f"sequence {seq.seq_id} {where} (never allocated, or already freed)")
        return table

    # ---- admission and growth ------------------------------------------------------------------
    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """The cached blocks admission would share: the longest cached prefix of full blocks strictly
        before the last token (``[]`` when caching is off). One prefix lookup; changes nothing."""
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.lookup(seq, (len(seq) - 1) // self.block_size)

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int | None = None, computed: list[int] | None = None
    ) -> NewBlocks | None:
        """Give slots to the next ``num_new_tokens`` tokens of ``seq`` (default: all that have none yet).

        A sequence without a table is admitted: it shares ``computed`` (from ``get_computed_blocks``;
        ``None``: looked up here), its ``num_cached_tokens`` and ``num_computed_tokens`` become the cached
        tokens, and the slots must leave ``watermark_blocks`` free. A sequence with a table grows and only
        needs the blocks (a copy-on-write block included). Returns ``None``, changing nothing, when the
        pool cannot give them now.

        Raises:
            ValueError: ``seq`` is swapped out, ``computed`` given for a sequence that has a table, or
                slots asked beyond ``len(seq)``.
        """
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return self._admit(seq, num_new_tokens, computed)
        if computed:
            raise ValueError(f"sequence {seq.seq_id} has blocks: computed blocks are for admission")
        return self._grow(seq, table, num_new_tokens)

    def _admit(self, seq: Sequence, num_new_tokens: int | None, computed: list[int] | None):
        if seq.seq_id in self.swap.tables:
            raise ValueError(f"sequence {seq.seq_id} is swapped out: swap_in brings it back")
        gpu, bs = self.gpu_allocator, self.block_size
        hits = self.get_computed_blocks(seq) if computed is None else computed
        cached = len(hits) * bs
        num_tokens = len(seq) if num_new_tokens is None else cached + num_new_tokens
        num_new = blocks_needed(num_tokens, bs) - len(hits)
        free_hits = sum(gpu.ref_count(b) == 0 for b in hits)  # hits in the free queue leave it
        if gpu.num_free_blocks - (num_new + free_hits) < self.watermark_blocks:
            return None
        for b in hits:  # take the hits before allocating, so that allocation cannot evict them
            if gpu.ref_count(b):
                gpu.incref(b)
            else:
                gpu.take(b)
        new = self._new_gpu_blocks(num_new)
        table = BlockTable(bs, hits + new, num_tokens)
        self.block_tables[seq.seq_id] = table
        seq.num_cached_tokens = seq.num_computed_tokens = cached
        if self.prefix_cache is not None:
            self.prefix_cache.record_query(len(seq), cached)
            self.prefix_cache.insert(seq, table.block_ids, len(hits), num_tokens // bs)
        return NewBlocks(table.block_ids.copy())

    def _grow(self, seq: Sequence, table: BlockTable, num_new_tokens: int | None):
        gpu, have, bs = self.gpu_allocator, table.num_tokens, self.block_size
        upto = len(seq) if num_new_tokens is None else have + num_new_tokens
        if not have <= upto <= len(seq):
            raise ValueError(
                f"sequence {seq.seq_id}: slots for {upto} tokens asked; it has {len(seq)} tokens "
                f"and {have} slots"
            )
        cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
        needed = blocks_needed(upto, bs) - len(table) + cow
        if needed > gpu.num_free_blocks:
            return None
        new = self._new_gpu_blocks(needed)  # the copy-on-write block first, when one is needed
        copies = self.copy_on_write(table, gpu, lambda: new.pop(0)) if upto > have else []
        if len(copies) != cow:
            raise RuntimeError(
                f"copy_on_write returned {copies} for sequence {seq.seq_id}, whose last block is "
                f"{'' if cow else 'not '}shared and partly filled"
            )
        if upto > have and have % bs and not cow and self.swap.maps:
            # written in place: older swap copies of the last block are stale
            self.swap.maps.forget_gpu(table.block_ids[-1])
        table.block_ids += new
        table.num_tokens = upto
        if self.prefix_cache is not None:
            self.prefix_cache.insert(seq, table.block_ids, have // bs, upto // bs)
        return NewBlocks(new, copies)

    def _new_gpu_blocks(self, n: int) -> list[int]:
        """``n`` blocks from the front of the free queue; cached ones among them are evicted (forgotten)."""
        new = self.gpu_allocator.allocate_many(n)
        if self.prefix_cache is not None:
            for b in new:
                self.prefix_cache.evict(b)
        return new

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
        """Release ``seq``'s blocks, GPU or CPU, tail first (a no-op for a sequence without blocks, as in
        vLLM v0 and v1, 0.10.2)."""
        table = self.block_tables.pop(seq.seq_id, None)
        if table is not None:
            self.swap.maps.release(self.gpu_allocator, table, self.swap.maps.forget_gpu)
        self.swap.free(seq.seq_id)

    # ---- swapping (vLLM v0's preemption by swap, 0.10.2) ----------------------------------------
    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None:
        """Move ``seq`` to the CPU pool; returns ``(gpu_block, cpu_block)`` pairs to copy (blocks shared
        with a swapped-out sibling once), or ``None`` when the CPU pool has no room (nothing changes)."""
        table = self._table(seq)
        pairs = self.swap.swap_out(seq.seq_id, table)
        if pairs is not None:
            del self.block_tables[seq.seq_id]
            self.swap.maps.release(self.gpu_allocator, table, self.swap.maps.forget_gpu)
        return pairs

    def swap_in(self, seq: Sequence, num_new_tokens: int = 0) -> list[tuple[int, int]] | None:
        """Bring ``seq`` back to the GPU with room for ``num_new_tokens`` more (then ``allocate_slots(seq,
        num_new_tokens)`` gives them and cannot fail); returns ``(cpu_block, gpu_block)`` pairs to copy, or
        ``None`` when that would not leave ``watermark_blocks`` free (an admission; nothing changes).

        Raises:
            ValueError: ``seq`` is not swapped out.
        """
        cpu_table = self.swap.tables.get(seq.seq_id)
        if cpu_table is None:
            raise ValueError(f"sequence {seq.seq_id} is not swapped out")
        have, bs = cpu_table.num_tokens, self.block_size
        grow = blocks_needed(have + num_new_tokens, bs) - len(cpu_table)
        cow = num_new_tokens > 0 and have % bs > 0  # the last block may be shared once back
        needed = self.swap.maps.blocks_to_copy(cpu_table, out=False) + grow + cow
        if self.gpu_allocator.num_free_blocks - needed < self.watermark_blocks:
            return None
        pairs, table = self.swap.swap_in(
            seq.seq_id, self.gpu_allocator, lambda: self._new_gpu_blocks(1)[0]
        )
        self.block_tables[seq.seq_id] = table
        return pairs
