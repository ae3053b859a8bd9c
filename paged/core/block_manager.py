"""The block space manager: the scheduler's only view of KV memory.

It owns a ``BlockAllocator`` for the GPU pool and one for the CPU swap space, one ``BlockTable`` per
sequence, and (optionally) the ``PrefixCache``. The scheduler asks it questions (``can_allocate``,
``can_append_slots``, ``can_swap_in/out``) and gives it orders (``allocate``, ``append_slots``,
``fork``, ``free``, ``swap_in/out``); the orders that move data return ``(src, dst)`` block pairs that
the engine hands to ``KVCache.copy_blocks`` / ``swap_in`` / ``swap_out``.

Rules (vLLM v0 ``vllm/core/block_manager.py``, ``SelfAttnBlockSpaceManager``, and the paper §4.3-4.5):

- Watermark: admitting a prompt must leave at least ``watermark_blocks = int(watermark * num_gpu_blocks)``
  blocks free, so a new prefill does not force an immediate preemption of running decodes.
  ``NEVER`` if the prompt needs more than ``num_gpu_blocks - watermark_blocks`` blocks.
- Copy-on-write: forked sequences share every block (reference counts). A sequence about to write
  into a shared, partially filled last block first gets a private copy: ``append_slots`` returns the
  ``(src, dst)`` pair and the engine copies the block before the step writes the new token.
- Prefix caching: ``allocate`` reuses the longest cached prefix of full blocks, never the whole
  prompt (at least the last token is computed); a block is cached when it becomes full (prompt blocks
  at ``allocate``, decode blocks at ``append_slots``), on the assumption that the step the slots were
  allocated for runs. Freed cached blocks stay hit-able until the free queue hands them out again.
- Every order is all-or-nothing: it checks first and raises before changing any count or table.

Contract for callers: ``allocate`` / ``append_slots`` give slots to every token of ``seq.token_ids``
that has none yet; call them only for sequences the current step computes.
"""

from __future__ import annotations

import enum

from paged.core.allocator import BlockAllocator, NoFreeBlocksError
from paged.core.block_table import BlockTable, blocks_needed
from paged.core.prefix_cache import BlockHasher, BlockKeys, HashFn, PrefixCache
from paged.core.sequence import Sequence
from paged.core.swap import SwapMaps


class AllocStatus(enum.Enum):
    """Answer of ``can_allocate`` / ``can_swap_in``: admit now, wait for memory, or never fits."""

    OK = "ok"
    LATER = "later"
    NEVER = "never"

    def __bool__(self) -> bool:  # truthy only when OK, so `if manager.can_swap_in(seq):` reads right
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

    Raises:
        ValueError: bad sizes; a sequence allocated twice, unknown, or of another block size.
        NoFreeBlocksError: an order that needs more free blocks than there are (nothing changes).
    """

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0, watermark: float = 0.01,
                 enable_prefix_caching: bool = False, hash_fn: HashFn | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        if num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be > 0, got {num_gpu_blocks}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {watermark}")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.gpu_allocator = BlockAllocator(num_gpu_blocks)
        self.cpu_allocator = BlockAllocator(num_cpu_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_cache = PrefixCache(block_size, BlockHasher(hash_fn)) if enable_prefix_caching else None
        self.block_tables: dict[int, BlockTable] = {}  # seq_id -> GPU blocks
        self.cpu_block_tables: dict[int, BlockTable] = {}  # seq_id -> CPU blocks of swapped-out sequences
        self.swaps = SwapMaps()

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
            where = "is swapped out to CPU" if seq.seq_id in self.cpu_block_tables else "has no blocks"
            raise ValueError(f"sequence {seq.seq_id} {where} (never allocated, or already freed)")
        return table

    def _cpu_table(self, seq: Sequence) -> BlockTable:
        table = self.cpu_block_tables.get(seq.seq_id)
        if table is None:
            raise ValueError(f"sequence {seq.seq_id} is not swapped out")
        return table

    # ---- admission -----------------------------------------------------------------------------
    def block_keys(self, seq: Sequence) -> BlockKeys | None:
        """The prefix-cache keys of ``seq``'s full blocks, kept on the sequence (``seq.block_keys``) and
        extended as blocks fill, so each block is hashed once (vLLM v1 ``Request.block_hashes``).

        The scheduler calls it when a request is added; every lookup and registration reuses it.
        None when prefix caching is off.
        """
        cache = self.prefix_cache
        if cache is None:
            return None
        keys = seq.block_keys
        if keys is None or keys.token_ids is not seq.token_ids or keys.hash_fn is not cache.hasher.hash_fn:
            keys = seq.block_keys = cache.block_keys(seq.token_ids)  # first use here (or another token list)
        else:
            keys.update(self.block_size)
        return keys

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks ``allocate`` would reuse: full blocks strictly before the last prompt token."""
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.lookup(seq.token_ids, (len(seq) - 1) // self.block_size,
                                        block_keys=self.block_keys(seq))

    def num_cached_prompt_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` that ``allocate`` would take from the prefix cache now (0 when caching is off)."""
        return len(self._cached_prefix(seq)) * self.block_size

    def can_allocate(self, seq: Sequence) -> AllocStatus:
        """``NEVER`` if the prompt cannot fit beside the watermark even in an empty pool; ``OK`` if
        ``free - needed >= watermark_blocks``; else ``LATER``. Hits on in-use cached blocks need no block."""
        needed = blocks_needed(len(seq), self.block_size)
        if self.num_gpu_blocks - needed < self.watermark_blocks:
            return AllocStatus.NEVER
        gpu = self.gpu_allocator
        hits = self._cached_prefix(seq)
        needed -= len(hits) - gpu.num_free_among(hits)
        return self._status_now(needed)

    def _status_now(self, needed: int) -> AllocStatus:
        """``OK`` if taking ``needed`` free GPU blocks leaves ``watermark_blocks`` free, else ``LATER``."""
        ok = self.gpu_allocator.num_free_blocks - needed >= self.watermark_blocks
        return AllocStatus.OK if ok else AllocStatus.LATER

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` blocks for all its tokens; set ``num_cached_tokens`` and ``num_computed_tokens``.

        With prefix caching the longest cached prefix is shared (free cached blocks are taken out of
        the free queue, in-use ones get one more reference) and the rest is allocated fresh.
        """
        if seq.block_size != self.block_size:
            raise ValueError(f"sequence {seq.seq_id} uses block_size {seq.block_size}, the manager {self.block_size}")
        if self.has_blocks(seq):
            raise ValueError(f"sequence {seq.seq_id} already has blocks; free it before allocating again")
        gpu, bs = self.gpu_allocator, self.block_size
        hits = self._cached_prefix(seq)
        num_free_hits = gpu.num_free_among(hits)
        num_new = blocks_needed(len(seq), bs) - len(hits)
        if num_new > gpu.num_free_blocks - num_free_hits:
            raise NoFreeBlocksError(num_new + num_free_hits, gpu.num_free_blocks)
        gpu.share(hits)  # take the hits before allocating, so that allocation cannot evict them
        new = gpu.allocate_many(num_new)
        if self.prefix_cache is not None:  # the free queue may hand out cached blocks: forget their keys
            self.prefix_cache.evict_blocks(new)
        table = BlockTable(bs, hits + new, len(seq))
        self.block_tables[seq.seq_id] = table
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * bs
        if self.prefix_cache is not None:
            self.prefix_cache.record_query(len(seq), len(hits) * bs)
            self._cache_full_blocks(seq, table, len(hits))

    def _new_gpu_block(self) -> int:
        block_id = self.gpu_allocator.allocate()
        if self.prefix_cache is not None:
            self.prefix_cache.evict(block_id)  # the free queue handed out a cached block: forget its key
        return block_id

    def _cache_full_blocks(self, seq: Sequence, table: BlockTable, first: int) -> None:
        """Register logical blocks ``first ..`` that are full (their K/V are computed this step)."""
        self.prefix_cache.register_blocks(table.block_ids, seq.token_ids, first, table.num_tokens // self.block_size,
                                          block_keys=self.block_keys(seq))

    # ---- decode --------------------------------------------------------------------------------
    def _append_needs(self, seq: Sequence, table: BlockTable) -> tuple[int, bool]:
        """(new blocks, copy-on-write?) to give slots to the tokens of ``seq`` that have none yet."""
        num_tokens, have, bs = len(seq.token_ids), table.num_tokens, self.block_size
        if num_tokens < have:
            raise ValueError(f"sequence {seq.seq_id} has {num_tokens} tokens but {have} slots")
        cow = num_tokens > have and have % bs != 0 and self.gpu_allocator.ref_count(table.block_ids[-1]) > 1
        return -(-num_tokens // bs) - len(table.block_ids) + cow, cow

    def can_append_slots(self, seq: Sequence) -> bool:
        """Whether the free blocks cover the new tokens' blocks plus a copy-on-write block if needed."""
        return self._append_needs(seq, self._table(seq))[0] <= self.gpu_allocator.num_free_blocks

    def append_slots(self, seq: Sequence) -> list[tuple[int, int]]:
        """Give slots to the new tokens of ``seq`` (usually the one sampled last step).

        Returns the copy-on-write pairs ``[(src, dst)]`` (at most one): ``seq`` wrote into a shared,
        partially filled last block, so it now owns ``dst``, a copy of ``src`` that the engine must
        fill with ``KVCache.copy_blocks`` before the forward pass writes the new token.
        """
        table = self._table(seq)
        needed, cow = self._append_needs(seq, table)
        if needed > self.gpu_allocator.num_free_blocks:
            raise NoFreeBlocksError(needed, self.gpu_allocator.num_free_blocks)
        num_tokens, have, bs = len(seq.token_ids), table.num_tokens, self.block_size
        copies = []
        if cow:
            src, dst = table[-1], self._new_gpu_block()
            self.gpu_allocator.free(src)  # one holder fewer; the other holders keep src
            table.block_ids[-1] = dst
            copies.append((src, dst))
            needed -= 1
        elif num_tokens > have and have % bs and self.swaps:
            self.swaps.forget_gpu(table[-1])  # written in place: older swap copies of it are stale
        for _ in range(needed):
            table.append(self._new_gpu_block())
        table.num_tokens = num_tokens
        if self.prefix_cache is not None:
            self._cache_full_blocks(seq, table, have // bs)
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
        keys = parent.block_keys
        if self.prefix_cache is not None and keys is not None and keys.token_ids is parent.token_ids:
            child.block_keys = parent.block_keys.copy_for(child.token_ids)  # no re-hashing of the prompt

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks, tail first (a no-op for a sequence without blocks, as in vLLM)."""
        table = self.block_tables.pop(seq.seq_id, None)
        if table is not None:
            self._release(table, self.gpu_allocator, self.swaps.forget_gpu)
        cpu_table = self.cpu_block_tables.pop(seq.seq_id, None)
        if cpu_table is not None:
            self._release(cpu_table, self.cpu_allocator, self.swaps.forget_cpu)

    def _release(self, table: BlockTable, allocator: BlockAllocator, forget) -> None:
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
        if self.gpu_allocator.num_used_blocks:
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
        pairs, cpu_ids = self.swaps.move(table, self.cpu_allocator, self.cpu_allocator.allocate, out=True)
        self._release(table, self.gpu_allocator, self.swaps.forget_gpu)
        del self.block_tables[seq.seq_id]
        self.cpu_block_tables[seq.seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
        return pairs

    def can_swap_in(self, seq: Sequence) -> AllocStatus:
        """Watermark rule for bringing ``seq`` back: ``NEVER`` / ``LATER`` / ``OK`` as in ``can_allocate``."""
        needed = self.swaps.blocks_to_copy_in(self._cpu_table(seq))
        if self.num_gpu_blocks - needed < self.watermark_blocks:
            return AllocStatus.NEVER
        return self._status_now(needed)

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring ``seq`` back to the GPU; returns ``(cpu_block, gpu_block)`` pairs to copy (shared once)."""
        cpu_table = self._cpu_table(seq)
        pairs, gpu_ids = self.swaps.move(cpu_table, self.gpu_allocator, self._new_gpu_block, out=False)
        self._release(cpu_table, self.cpu_allocator, self.swaps.forget_cpu)
        del self.cpu_block_tables[seq.seq_id]
        self.block_tables[seq.seq_id] = BlockTable(self.block_size, gpu_ids, cpu_table.num_tokens)
        return pairs
