# Generated from solutions/ex05_block_manager.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

"""Exercise 05, second part: the block manager, the scheduler's only view of KV memory (chapter 05).

You build the engine part ``block_manager`` (``paged.engine.parts``): the class ``BlockSpaceManager``.
The scheduler (``paged/core/scheduler.py``) speaks to it in three verbs, as vLLM v1's scheduler speaks to
its ``KVCacheManager`` (``vllm/v1/core/kv_cache_manager.py``, 0.8.5 and later):

- ``get_computed_blocks(seq)`` once when it considers admitting a waiting sequence: the cached blocks
  the sequence can share;
- ``allocate_slots(seq, num_new_tokens, computed)`` for every scheduled chunk: the slots, or ``None``
  when the pool cannot give them now (the scheduler then waits or preempts, so ``None`` must change
  nothing);
- ``free(seq)`` when a sequence finishes or is preempted by recomputation.

Your manager owns the parts you built before: ``self.gpu_allocator`` (an ``allocator_cls``, chapter 02:
``allocate_many``, ``free_many``, ``incref``, ``take``, ``ref_count``, ``num_free_blocks``),
``self.prefix_cache`` (a ``prefix_cache_cls``, the first part of this chapter, or ``None`` when prefix
caching is off) and ``self.copy_on_write`` (ch05.ex6). ``self.block_tables`` maps a sequence id to its
``BlockTable`` (``block_ids``, ``num_tokens``: the tokens that have slots). Forks, swapping and the
queries are given (they are the reference's: this class extends ``paged.core.block_manager``'s).

7. ``get_computed_blocks`` (ch05.ex7): what admission may share.
8. ``_admit`` (ch05.ex8): the first slots of a sequence without a table.
9. ``_grow`` (ch05.ex9): the next chunk's or the next decode token's slots, copy-on-write included.
10. ``free`` (ch05.ex10): give the blocks back.

Sources: vLLM v1 ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``, ``allocate_slots``,
``free``) and ``vllm/v1/core/block_pool.py`` (``touch``, ``free_blocks``, ``_maybe_evict_cached_block``);
v0 ``vllm/core/block_manager.py`` (``can_allocate``'s watermark, ``append_slots``); PagedAttention paper
§4.3-4.5. Check each step with ``check("ch05.exK")``.
"""

from __future__ import annotations

from paged.core.block_manager import BlockSpaceManager as ReferenceBlockManager
from paged.core.block_manager import NewBlocks
from paged.core.block_table import BlockTable, blocks_needed
from paged.core.sequence import Sequence


class BlockSpaceManager(ReferenceBlockManager):
    """Block tables over a GPU pool, with prefix sharing and copy-on-write (module docstring).

    Constructed like the reference (``block_size, num_gpu_blocks, num_cpu_blocks, watermark,
    enable_prefix_caching, hash_fn, allocator_cls=, prefix_cache_cls=, copy_on_write=``);
    ``self.watermark_blocks`` is the number of blocks an admission must leave free.

    Invariants after every call: each GPU block's reference count equals the number of tables that hold
    it; a block with count 0 is in the allocator's free queue and may still be cached; a table's blocks
    cover exactly its ``num_tokens`` tokens.

    Cost: each verb takes time in proportion to the blocks it touches (the sequence's, the fresh ones),
    never to the size of the pool: a real pool has hundreds of thousands of blocks.
    """

    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """The cached blocks an admission of ``seq`` would share, in logical order.

        Returns the longest cached prefix of ``seq``'s full blocks that still leaves at least one token
        of ``seq`` to compute (the step must produce logits for the last token), or ``[]`` when prefix
        caching is off. Exactly one prefix-cache lookup; changes no count, table or cache entry.
        """
        raise NotImplementedError(
            "ch05.ex7: one lookup; the last token of the sequence is never served from cache"
        )

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int | None = None, computed: list[int] | None = None
    ) -> NewBlocks | None:
        """Slots for the next ``num_new_tokens`` tokens of ``seq`` (default: all that have none yet): a
        sequence without a table is admitted (``_admit``), one with a table grows (``_grow``).

        Raises:
            ValueError: ``computed`` given for a sequence that has a table (``_admit`` and ``_grow`` raise
                their own).
        """
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return self._admit(seq, num_new_tokens, computed)
        if computed:
            raise ValueError(f"sequence {seq.seq_id} has blocks: computed blocks are for admission")
        last, have = (table.block_ids[-1] if table.block_ids else None), table.num_tokens
        new = self._grow(seq, table, num_new_tokens)
        if new is not None and not new.copies and have % self.block_size and self.swap.maps:
            self.swap.maps.forget_gpu(last)  # written in place: its older swap copy is stale
        return new

    def _admit(
        self, seq: Sequence, num_new_tokens: int | None, computed: list[int] | None
    ) -> NewBlocks | None:
        """Give ``seq`` (no table yet) its table: the shared ``computed`` blocks, then fresh blocks for
        ``num_new_tokens`` tokens after them (``None``: every token of ``seq``).

        Args:
            computed: ``get_computed_blocks(seq)`` from this admission, or ``None``: look them up here.
                Each is held by other tables or sits in the free queue, still cached.

        Returns:
            ``NewBlocks(block_ids=the whole new table)``, or ``None`` when taking them would leave fewer
            than ``self.watermark_blocks`` blocks free; ``None`` changes nothing (no count, table, cache
            entry or sequence field).

        On success: ``seq.num_cached_tokens`` and ``seq.num_computed_tokens`` are the shared tokens; each
        table block has one holder more; a cached block is never handed out as a fresh block of the same
        admission, and a fresh block that held a cache entry no longer answers lookups; the full blocks the
        new slots cover are registered in the prefix cache (``insert``); the cache's hit counters record
        ``len(seq)`` tokens queried, the shared tokens hit.

        Raises:
            ValueError: ``seq`` is swapped out (``seq.seq_id in self.swap.tables``).
        """
        raise NotImplementedError(
            "ch05.ex8: the hits shared, fresh blocks for the rest, the watermark kept; None: no change"
        )

    def _grow(
        self, seq: Sequence, table: BlockTable, num_new_tokens: int | None
    ) -> NewBlocks | None:
        """Extend ``table`` (``seq``'s) to cover ``num_new_tokens`` more tokens (``None``: up to ``len(seq)``):
        the next prefill chunk, or the one token a decode step computes.

        Returns:
            ``NewBlocks(block_ids=the blocks appended, copies=[(src, dst)] or [])``, or ``None`` when the
            pool has too few free blocks (no watermark: a running sequence only needs the blocks); ``None``
            changes nothing.

        When tokens will be written into a last block that is partly filled and shared (a fork), the
        sequence must first get a private copy: the ``copy_on_write`` part does it (it calls its
        ``allocate`` argument for the private block, once) and its pair goes in ``copies``; that block
        counts in what the pool must have. Fresh blocks no longer answer prefix-cache lookups; the blocks
        this growth fills are registered in the prefix cache. Asking for zero tokens is allowed.

        Raises:
            ValueError: slots asked beyond ``len(seq)`` or a negative ``num_new_tokens``.
        """
        raise NotImplementedError(
            "ch05.ex9: decide everything (copy included) before touching the pool"
        )

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq`` and forget its table (a no-op for a sequence without blocks).

        Each GPU block of the table loses one holder; a block nobody holds any more goes back to the free
        queue *and keeps its prefix-cache entry* (a later admission may still hit it until an allocation
        hands it out). The order in which blocks reach the free queue is the order they will be evicted
        in: a sequence's tail, which fewer later prompts share, should go first. Blocks nobody holds any
        more lose their swap copies (``self.forget_swap_copies(table)``, after the counts drop); a
        swapped-out sequence gives its CPU blocks back (``self.swap.free(seq.seq_id)``).
        """
        raise NotImplementedError(
            "ch05.ex10: one reference fewer per block, in eviction order; cache entries stay"
        )

    def forget_swap_copies(self, table: BlockTable) -> None:
        """Forget the swap copies of ``table``'s blocks that nobody holds any more (given)."""
        if self.swap.maps:
            for b in table.block_ids:
                if self.gpu_allocator.ref_count(b) == 0:
                    self.swap.maps.forget_gpu(b)


# The graded regions each engine part is made of (paged_course/capstone.py reads this).
PART_REGIONS = {"BlockSpaceManager": ("ch05.ex7", "ch05.ex8", "ch05.ex9", "ch05.ex10")}
