"""Physical KV blocks: a free queue and one reference count per block.

The KV cache pool is cut into ``num_blocks`` fixed-size blocks, numbered ``0 .. num_blocks - 1``. The
allocator only hands out and takes back these *numbers*; it never touches tensor memory (that is
``kv_cache.py``). A block is in use while its reference count is above zero: one reference per block
table holding it. Forked sequences (parallel sampling) and prefix-cache hits share a block by raising
its count instead of copying it; the block returns to the free queue when the last holder frees it.

The free queue is first-in first-out: blocks come out in id order at first, and a freed block goes to
the back, so the block freed longest ago is reused first. Chapter 05 relies on that order: a freed
block keeps its prefix-cache entry until it is reused, and reusing the least recently freed one first
is LRU eviction.

A prefix-cache hit must also pull one *given* free block out of the middle of the queue (``take``).
The queue is a plain ``deque`` (the cheapest FIFO in CPython) with *lazy deletion*: ``take`` leaves
the block's entry where it is and counts it as dead (``_dead[block]``); ``allocate`` skips dead entries when
they reach the front. A block's dead entries always sit before its live one (they were appended
earlier), so "skip while the block has dead entries" is exact. When dead entries outnumber live ones
the queue is rebuilt without them, so it never holds more than ``2 * num_blocks + 1`` entries.

Sources: vLLM v0 ``vllm/core/block/naive_block.py`` (``NaiveBlockAllocator``: free ids and a
ref counter) and v1 ``vllm/v1/core/block_pool.py`` (``BlockPool``: ``ref_cnt`` per block and a queue of
free blocks ordered by free time; vLLM v1 removes from the middle of its ``FreeKVCacheBlockQueue``,
a doubly linked list in ``vllm/v1/core/kv_cache_utils.py``, where this file marks entries dead).
"""

from __future__ import annotations

from collections import deque


class NoFreeBlocksError(RuntimeError):
    """The pool has fewer free blocks than a request for new blocks asked for.

    Attributes:
        requested: blocks asked for.
        available: free blocks at the time of the request.
    """

    def __init__(self, requested: int, available: int, what: str = "KV cache"):
        self.requested = requested
        self.available = available
        super().__init__(f"no free blocks in the {what}: requested {requested}, available {available}")


class BlockAllocator:
    """Hands out block ids ``0 .. num_blocks - 1`` and counts the references to each.

    Args:
        num_blocks: size of the pool in blocks (>= 0; an empty pool is legal, e.g. no CPU swap space).

    ``allocate()`` takes the block at the front of the free queue and sets its count to 1;
    ``incref(b)`` adds a holder; ``free(b)`` removes one and, at zero, appends the block to the back
    of the free queue. Invariant: ``num_free_blocks + (blocks with count > 0) == num_blocks``.

    Raises:
        ValueError: ``num_blocks < 0``; freeing / increfing an unknown id or a block that is free.
        NoFreeBlocksError: ``allocate`` on an empty free queue (requested and available counts).
    """

    def __init__(self, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._queue: deque[int] = deque(range(num_blocks))  # free ids, front first; may hold dead entries
        self._dead = [0] * num_blocks  # per block: its dead entries in _queue (taken while queued)
        self._num_dead = 0  # sum of _dead

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue) - self._num_dead

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._queue) + self._num_dead

    def allocate(self) -> int:
        """Take the front block of the free queue; its reference count becomes 1. Returns its id."""
        try:
            block_id = self._queue.popleft()
        except IndexError:
            raise NoFreeBlocksError(1, 0) from None
        if self._num_dead:  # some entries are dead: skip them (only after ``take``)
            return self._allocate_past_dead(block_id)
        self._ref_counts[block_id] = 1
        return block_id

    def _allocate_past_dead(self, block_id: int) -> int:
        """``allocate`` when the queue holds dead entries: ``block_id`` was just popped from the front."""
        queue, dead = self._queue, self._dead
        while dead[block_id]:
            dead[block_id] -= 1
            self._num_dead -= 1
            if not queue:  # only dead entries were left (cannot happen while num_free_blocks > 0)
                raise NoFreeBlocksError(1, 0)
            block_id = queue.popleft()
        self._ref_counts[block_id] = 1
        return block_id

    def allocate_many(self, n: int) -> list[int]:
        """Allocate ``n`` blocks at once, all or nothing (raises before taking any if fewer are free)."""
        queue = self._queue
        if n > len(queue) - self._num_dead:
            raise NoFreeBlocksError(n, len(queue) - self._num_dead)
        pop, refs = queue.popleft, self._ref_counts
        if self._num_dead:  # skip dead entries on the way
            dead, block_ids = self._dead, []
            while len(block_ids) < n:
                block_id = pop()
                if dead[block_id]:
                    dead[block_id] -= 1
                    self._num_dead -= 1
                else:
                    refs[block_id] = 1
                    block_ids.append(block_id)
            return block_ids
        block_ids = [pop() for _ in range(n)]
        for block_id in block_ids:
            refs[block_id] = 1
        return block_ids

    def free(self, block_id: int) -> None:
        """Drop one reference; at zero the block goes to the back of the free queue."""
        refs = self._ref_counts
        try:
            count = refs[block_id] if type(block_id) is int and block_id >= 0 else 0
        except IndexError:
            count = 0
        if count == 1:  # the common case first: the last holder lets go
            refs[block_id] = 0
            self._queue.append(block_id)
        elif count:
            refs[block_id] = count - 1
        else:
            self._raise_not_held(block_id, "free")

    def free_many(self, block_ids) -> None:
        """``free`` each id in order (a sequence frees its tail first: pass its ids reversed).

        All or nothing: on a bad id the ids before it are restored and the queue is as before.
        """
        refs, push, n = self._ref_counts, self._queue.append, self.num_blocks
        done = []
        for block_id in block_ids:
            count = refs[block_id] if type(block_id) is int and 0 <= block_id < n else 0
            if count == 1:
                refs[block_id] = 0
                push(block_id)
            elif count:
                refs[block_id] = count - 1
            else:
                for b in reversed(done):  # undo: the blocks freed to zero sit at the back of the queue
                    if refs[b] == 0:
                        self._queue.pop()
                    refs[b] += 1
                self._raise_not_held(block_id, "free")
            done.append(block_id)

    def incref(self, block_id: int) -> None:
        """Add one reference to a block in use (a fork or a prefix-cache hit shares it)."""
        self._ref_counts[block_id] = self._checked_count(block_id, "incref") + 1

    def take(self, block_id: int) -> None:
        """Pull one *given* free block out of the free queue (count 0 -> 1): a hit on a free cached block."""
        if not (isinstance(block_id, int) and 0 <= block_id < self.num_blocks):
            raise ValueError(f"take: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
        if self._ref_counts[block_id]:
            raise ValueError(f"take: block {block_id} is in use (ref count {self._ref_counts[block_id]})")
        self._ref_counts[block_id] = 1
        self._dead[block_id] += 1  # its queue entry is dead now
        self._num_dead += 1
        self._compact_if_mostly_dead()

    def _compact_if_mostly_dead(self) -> None:
        """Rebuild the queue without dead entries once they outnumber live ones (amortized O(1) per take)."""
        if self._num_dead > len(self._queue) - self._num_dead:
            self._queue = deque(self._live_entries())
            self._dead = [0] * self.num_blocks
            self._num_dead = 0

    def share(self, block_ids: list[int]) -> None:
        """Add a holder to each block: a free one leaves the free queue (``take``), one in use gets +1.

        Used for prefix-cache hits. Raises ``ValueError`` on an unknown id before changing anything.
        """
        refs, dead, n = self._ref_counts, self._dead, self.num_blocks
        if block_ids and not (set(map(type, block_ids)) == {int} and min(block_ids) >= 0 and max(block_ids) < n):
            bad = next(b for b in block_ids if not (type(b) is int and 0 <= b < n))
            raise ValueError(f"share: block id {bad!r} is not in 0..{n - 1}")
        taken = 0
        for block_id in block_ids:
            if refs[block_id]:
                refs[block_id] += 1
            else:  # a free block: ``take`` it (its queue entry becomes dead)
                refs[block_id] = 1
                dead[block_id] += 1
                taken += 1
        if taken:
            self._num_dead += taken
            self._compact_if_mostly_dead()

    def num_free_among(self, block_ids: list[int]) -> int:
        """How many of ``block_ids`` are free (reference count 0)."""
        refs = self._ref_counts
        return [refs[b] for b in block_ids].count(0)

    def ref_count(self, block_id: int) -> int:
        """Number of holders of ``block_id`` (0 when free)."""
        if not (isinstance(block_id, int) and 0 <= block_id < self.num_blocks):
            raise ValueError(f"block id {block_id!r} is not in 0..{self.num_blocks - 1}")
        return self._ref_counts[block_id]

    def free_queue(self) -> list[int]:
        """The free block ids in the order ``allocate`` will hand them out (front first)."""
        return list(self._live_entries())

    def _live_entries(self):
        """The queue without its dead entries, front first (changes nothing)."""
        if not self._num_dead:
            yield from self._queue
            return
        skip = list(self._dead)
        for block_id in self._queue:
            if skip[block_id]:
                skip[block_id] -= 1
            else:
                yield block_id

    def _raise_not_held(self, block_id, op: str) -> None:
        """Raise the ``ValueError`` for an id that is not an int in range, or a block that is free."""
        if type(block_id) is int and 0 <= block_id < self.num_blocks:
            raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
        raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")

    def _checked_count(self, block_id: int, op: str) -> int:
        try:
            count = self._ref_counts[block_id] if block_id >= 0 else -1
        except (IndexError, TypeError):
            count = -1
        if count <= 0:
            if count < 0:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
        return count

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, free={self.num_free_blocks})"
