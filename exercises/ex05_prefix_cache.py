# Generated from solutions/ex05_prefix_cache.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

"""Exercise 05: the engine's prefix cache and copy-on-write (chapter 05).

You build two parts the engine runs (``paged.engine.parts``): ``prefix_cache`` (the class
``PrefixCache``) and ``copy_on_write`` (the function), plus the eviction order the chapter predicts.

``PrefixCache(block_size, hash_fn)`` maps the chained keys of full blocks to the physical blocks that
hold them. The block manager (``paged/core/block_manager.py``) calls it like this:

- ``lookup(seq, max_blocks)`` at admission: the block ids of the longest *verified* cached prefix of
  ``seq``, at most ``max_blocks`` full blocks (the manager passes ``(len(seq) - 1) // block_size``, so
  the last prompt token is always computed). Pure: it changes nothing.
- ``insert(seq, block_ids, first, stop)`` when the step that fills logical blocks ``first .. stop - 1``
  is scheduled: register them (``block_ids`` is the sequence's block table).
- ``evict(block_id)`` when the allocator's free queue hands a block out for new data: forget it.

The data structures are given (``__init__``): ``_by_key`` maps a key to the list of ``Entry`` objects
stored under it (several blocks can hold one key: two requests computing the same prefix at once, or a
hash collision), ``_by_block`` maps a block id to its entry, ``_next_uid`` numbers the entries.
Costs: ``lookup`` reads only the entries stored under the keys it tries, and ``evict`` takes constant
time: neither scans the cache, which holds an entry per cached block of a pool of many thousands.

1. ``update_hashes`` (ch05.ex1): extend ``seq.block_hashes`` to every full block of ``seq.token_ids``,
   ``key(i) = hash_fn(key(i - 1), tuple(tokens of block i))`` with ``key(-1) = ROOT_KEY``; a block is
   hashed once in the life of a sequence, a partial block gets no key.
2. ``lookup`` (ch05.ex2): block ``i`` hits when an entry under ``key(i)`` holds exactly the block's
   tokens *and* its ``parent_uid`` is the ``uid`` of the entry that hit at ``i - 1`` (0 for block 0):
   a hash is never trusted alone. The first miss ends the prefix.
3. ``insert`` (ch05.ex3): a fresh ``Entry`` (new ``uid``, its parent's ``uid``, the block's tokens) for
   each block not cached yet; a block already cached keeps its entry; the chain stops at the first
   block whose parent block is not cached. Returns the number of new entries.
4. ``evict`` (ch05.ex4): forget one block's entry (and only that one). Returns whether it was cached.
5. ``eviction_order`` (ch05.ex5): which cached blocks the pool will evict first, once some sequences
   finish: the allocator's free queue (``paged/core/allocator.py``) is first in, first out, and the block
   manager frees a sequence's blocks tail first (``BlockSpaceManager.free``).
6. ``copy_on_write`` (ch05.ex6): before a sequence writes after ``table.num_tokens``, a shared (reference
   count > 1), partially filled last block is replaced by a private copy.

Sources: vLLM v1 ``vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``, ``FreeKVCacheBlockQueue``),
``vllm/v1/core/block_pool.py`` (``get_cached_block``, ``cache_full_blocks``, ``_maybe_evict_cached_block``);
v0 ``vllm/core/block/prefix_caching_block.py`` and ``vllm/core/block/common.py`` (``CopyOnWriteTracker``,
``cow_block_if_not_appendable``); PagedAttention paper §4.4. Check each step in the chapter with
``check("ch05.exK")``, or all with ``python -m paged grade ch05``.
"""

from __future__ import annotations

from collections.abc import Callable

ROOT_KEY = 0  # the "parent key" of a sequence's first block


def default_hash(parent_key: int, token_ids: tuple) -> int:
    """Python's tuple hash of ``(parent_key, token_ids)`` (deterministic for ints)."""
    return hash((parent_key, token_ids))


class Entry:
    """One cached full block: its physical id, its chained key, its own ``uid``, the ``uid`` of the entry
    of the block before it in the sequence that computed it (``parent_uid``, 0 for a first block), and
    its token ids."""

    __slots__ = ("block_id", "key", "uid", "parent_uid", "token_ids")

    def __init__(self, block_id: int, key: int, uid: int, parent_uid: int, token_ids: tuple):
        self.block_id, self.key, self.uid, self.parent_uid, self.token_ids = (
            block_id,
            key,
            uid,
            parent_uid,
            token_ids,
        )

    def __repr__(self) -> str:
        return f"Entry(block {self.block_id}, uid {self.uid}, parent {self.parent_uid}, tokens {self.token_ids})"


class PrefixCache:
    """Chained block keys -> the full blocks that hold them, with exact hit verification (module docstring).

    Args:
        block_size: tokens per block (> 0).
        hash_fn: ``hash_fn(parent_key, token_ids: tuple) -> int`` (default ``default_hash``).

    Raises:
        ValueError: ``block_size <= 0``; ``insert`` past the sequence's full blocks.
    """

    def __init__(self, block_size: int, hash_fn: Callable[[int, tuple], int] | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        self.block_size = block_size
        self.hash_fn = hash_fn or default_hash
        self._by_key: dict[int, list[Entry]] = {}
        self._by_block: dict[int, Entry] = {}
        self._next_uid = 1
        self.queried_tokens = self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._by_block)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._by_block

    def update_hashes(self, seq) -> list[int]:
        """Extend ``seq.block_hashes`` (the keys of its first full blocks) to all its full blocks; return it."""
        keys, tokens, bs = seq.block_hashes, seq.token_ids, self.block_size
        raise NotImplementedError(
            "ch05.ex1: one chained key per full block; the keys already there are kept"
        )
        return keys

    def lookup(self, seq, max_blocks: int) -> list[int]:
        """Block ids of the longest verified cached prefix of ``seq``, at most ``max_blocks`` blocks."""
        keys, tokens, bs = self.update_hashes(seq), seq.token_ids, self.block_size
        hits: list[int] = []
        raise NotImplementedError(
            "ch05.ex2: the longest verified cached prefix, at most max_blocks blocks"
        )
        return hits

    def insert(self, seq, block_ids: list[int], first: int, stop: int) -> int:
        """Register logical blocks ``first .. stop - 1`` of ``seq`` (physical ids from ``block_ids``).
        Returns the number of new entries."""
        keys, tokens, bs = self.update_hashes(seq), seq.token_ids, self.block_size
        if len(keys) < stop:
            raise ValueError(f"insert: blocks up to {stop} requested, only {len(keys)} are full")
        added = 0
        raise NotImplementedError(
            "ch05.ex3: blocks first..stop-1 registered, chained to their parents; the count added"
        )
        return added

    def evict(self, block_id: int) -> bool:
        """Forget ``block_id``'s entry (the block is reused for other data). Returns whether it was cached."""
        raise NotImplementedError(
            "ch05.ex4: the block's entry forgotten, every other entry kept; whether it was cached"
        )

    def record_query(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.queried_tokens += num_queried_tokens
        self.hit_tokens += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens (0.0 before any query)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def clear(self) -> None:
        """Forget every entry (the caller checks that no block is in use); keeps the hit counters."""
        self._by_key.clear()
        self._by_block.clear()


def eviction_order(
    free_queue: list[int], ref_counts: list[int], finishing: list[list[int]], cached: set[int]
) -> list[int]:
    """The cached blocks in the order later allocations will evict them, once the sequences whose block
    tables are ``finishing`` have finished, in that order.

    Args:
        free_queue: the allocator's free queue now, front first (``BlockAllocator.free_queue()``).
        ref_counts: ``ref_counts[b]`` = holders of block ``b`` now (0 = free).
        finishing: the block tables (logical order) of the sequences that finish, first to finish first.
        cached: the blocks that hold a prefix-cache entry.

    The arguments are not changed.
    """
    raise NotImplementedError(
        "ch05.ex5: the cached blocks in future eviction order; the arguments unchanged"
    )


def copy_on_write(table, allocator, allocate: Callable[[], int]) -> list[tuple[int, int]]:
    """Before tokens are written after ``table.num_tokens``: if the last block is partially filled and
    shared, move ``table`` to a private block from ``allocate()``, drop one reference to the shared one and
    return ``[(shared, private)]`` (the engine copies the block's K/V before the step writes); else ``[]``.

    Args:
        table: the sequence's ``BlockTable`` (``block_ids``, ``num_tokens``, ``block_size``).
        allocator: the GPU allocator (``ref_count(b)``, ``free_many(ids)``).
        allocate: hands out one free block id (call it only for a copy).
    """
    raise NotImplementedError(
        "ch05.ex6: a private copy of a shared, partly filled last block; [] otherwise"
    )


# The graded regions each engine part is made of (paged_course/capstone.py reads this).
PART_REGIONS = {
    "PrefixCache": ("ch05.ex1", "ch05.ex2", "ch05.ex3", "ch05.ex4"),
    "copy_on_write": ("ch05.ex6",),
}
