"""Physical KV blocks: a free queue and one reference count per block.

Contract (vLLM v1 ``vllm/v1/core/block_pool.py``, ``BlockPool``; v0 ``vllm/core/block/naive_block.py``; both
0.10.2):

- The pool holds ``num_blocks`` blocks, ids ``0 .. num_blocks - 1``. The allocator hands out and takes
  back these *numbers*; it never touches tensor memory (``paged/worker/kv_cache.py`` does).
- A block is **in use** while its reference count is above zero: one reference per block table that
  holds it (a fork or a prefix-cache hit shares a block by adding a reference, not by copying it).
  A block is **free** when its count is 0; ``num_free_blocks`` counts exactly those.
- **Order:** the free queue is first in, first out. A fresh pool hands out ids in increasing order; a
  block freed to zero joins the back, so the block freed longest ago is reused first. Chapter 05 turns
  this into LRU eviction: a freed block keeps its prefix-cache entry until the queue hands it out again,
  and ``take`` pulls one *given* free block out of the middle when a new request hits it.
- Every operation checks its arguments first and changes nothing when it raises.

Mechanism: the queue is a ``deque`` (CPython's cheapest FIFO) with lazy deletion. ``take`` cannot cut an
entry out of a deque in O(1), so it leaves the entry and counts it dead (``_dead[b]``); the pops skip
dead entries. A block's dead entries always sit in front of its live one (they were appended earlier),
so "skip while the block has dead entries" gives exactly the order of a queue that removed them. When
dead entries outnumber live ones the deque is rebuilt without them, which bounds its length by
``2 * num_blocks + 1`` (vLLM v1 uses a doubly linked list, ``FreeKVCacheBlockQueue`` in
``vllm/v1/core/kv_cache_utils.py``, 0.10.2, for the same job).
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
        super().__init__(
            f"no free blocks in the {what}: requested {requested}, available {available}"
        )


class BlockAllocator:
    """Hands out block ids ``0 .. num_blocks - 1`` and counts the references to each (module docstring).

    Args:
        num_blocks: size of the pool in blocks (>= 0; an empty pool is legal, e.g. no CPU swap space).

    Invariant: ``num_free_blocks + (blocks with count > 0) == num_blocks``.

    Raises:
        ValueError: ``num_blocks < 0``; ``free`` / ``incref`` / ``take`` / ``ref_count`` of an id that is
            not an int in range, ``free`` / ``incref`` of a free block, ``take`` of a block in use.
        NoFreeBlocksError: ``allocate`` / ``allocate_many`` with too few free blocks (both counts given).
    """

    def __init__(self, num_blocks: int):
        if type(num_blocks) is not int or num_blocks < 0:
            raise ValueError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        # free ids, front first (may hold dead entries)
        self._queue: deque[int] = deque(range(num_blocks))
        self._dead = [0] * num_blocks  # per block: its dead entries in _queue
        self._num_dead = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._queue) - self._num_dead

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self) -> int:
        """Take the front of the free queue; its count becomes 1. Returns its id."""
        if self._num_dead:  # entries left behind by ``take`` to skip: the general path
            return self.allocate_many(1)[0]
        try:  # one block, the hot case: no list to build (allocate_many(1) costs 2x)
            block_id = self._queue.popleft()
        except IndexError:
            raise NoFreeBlocksError(1, 0) from None
        self._ref_counts[block_id] = 1
        return block_id

    def allocate_many(self, n: int) -> list[int]:
        """The ``n`` blocks at the front of the free queue, in order, all or nothing (vLLM v1
        ``BlockPool.get_new_blocks``, 0.10.2)."""
        if n > self.num_free_blocks:
            raise NoFreeBlocksError(n, self.num_free_blocks)
        pop, refs, dead = self._queue.popleft, self._ref_counts, self._dead
        # no dead entry: pop n at once
        taken = [pop() for _ in range(n)] if not self._num_dead else []
        for block_id in taken:
            refs[block_id] = 1
        while len(taken) < n:
            block_id = pop()
            if dead[block_id]:  # an entry left behind by ``take``: skip it
                dead[block_id] -= 1
                self._num_dead -= 1
            else:
                refs[block_id] = 1
                taken.append(block_id)
        return taken

    def free(self, block_id: int) -> None:
        """Drop one reference; at zero the block goes to the back of the free queue."""
        refs = self._ref_counts  # checked inline: free_many((b,)) costs this hot path 5x
        try:
            count = refs[block_id] if type(block_id) is int and block_id >= 0 else 0
        except IndexError:  # past the end of the pool
            count = 0
        if not count:
            self._check(block_id, "free")  # raises, naming what is wrong
        refs[block_id] = count - 1
        if count == 1:
            self._queue.append(block_id)

    def free_many(self, block_ids) -> None:
        """``free`` each id in order (a sequence frees its tail first: pass its ids reversed), all or nothing.

        Checked first, in bulk: every id an int in range whose count covers how often it is listed.
        """
        block_ids, refs = tuple(block_ids), self._ref_counts
        try:  # the common case: ints in range, in use, each listed once
            for block_id in block_ids:
                if type(block_id) is not int or block_id < 0 or not refs[block_id]:
                    raise IndexError
            if len(set(block_ids)) != len(block_ids):
                raise IndexError
        except IndexError:
            self._check_frees(block_ids)
        push = self._queue.append
        for block_id in block_ids:
            refs[block_id] -= 1
            if not refs[block_id]:
                push(block_id)

    def _check_frees(self, block_ids: tuple) -> None:
        """Raise the ValueError for the first id ``free_many`` cannot free (an id listed k times needs k holders)."""
        listed: dict[int, int] = {}
        for block_id in block_ids:
            count = self._check(block_id, "free")
            listed[block_id] = listed.get(block_id, 0) + 1
            if listed[block_id] > count:
                raise ValueError(
                    f"free: block {block_id} is listed {listed[block_id]} times but has {count} holders"
                )

    def incref(self, block_id: int) -> None:
        """Add one reference to a block in use (a fork or a prefix-cache hit shares it)."""
        self._check(block_id, "incref")
        self._ref_counts[block_id] += 1

    def take(self, block_id: int) -> None:
        """Pull one *given* free block out of the free queue (count 0 -> 1): a hit on a free cached block."""
        if self._check(block_id, "take", in_use=False):
            raise ValueError(
                f"take: block {block_id} is in use (ref count {self._ref_counts[block_id]})"
            )
        self._ref_counts[block_id] = 1
        self._dead[block_id] += 1  # its queue entry is dead now
        self._num_dead += 1
        if self._num_dead > self.num_free_blocks:  # mostly dead: rebuild (amortized O(1) per take)
            self._queue = deque(self.free_queue())
            self._dead, self._num_dead = [0] * self.num_blocks, 0

    def ref_count(self, block_id: int) -> int:
        """Number of holders of ``block_id`` (0 when free)."""
        return self._check(block_id, "ref_count", in_use=False)

    def free_queue(self) -> list[int]:
        """The free block ids in the order ``allocate`` will hand them out (front first)."""
        skip, live = list(self._dead), []
        for block_id in self._queue:
            if skip[block_id]:
                skip[block_id] -= 1
            else:
                live.append(block_id)
        return live

    def _check(self, block_id, op: str, in_use: bool = True) -> int:
        """The count of ``block_id``; ValueError unless an int in range (and, with ``in_use``, held)."""
        if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
        count = self._ref_counts[block_id]
        if in_use and not count:
            raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
        return count
