"""Exercise 02: the engine's block allocator (chapter 02).

You write ``BlockAllocator``, the part of the engine that hands out KV-cache block ids, and the chapter
runs the engine with it: ``LLM(..., parts=Parts(allocator=BlockAllocator))``. Its interface is exactly
the one ``paged/engine/parts.py`` names (the reference is ``paged/core/allocator.py``):

- ``BlockAllocator(num_blocks)``: blocks ``0 .. num_blocks - 1``, all free;
- ``allocate()`` / ``allocate_many(n)``: blocks from the front of the free queue, reference count 1;
- ``free(b)`` / ``free_many(ids)``: one reference fewer each; a block whose count reaches 0 joins the
  back of the free queue (first in, first out: the block freed longest ago is reused first);
- ``incref(b)``: one more holder for a block in use (a fork, a prefix-cache hit);
- ``take(b)``: a *given* free block leaves the middle of the free queue (a prefix-cache hit on a block
  that was freed but still holds its tokens, chapter 05);
- ``ref_count(b)``, ``num_free_blocks``, ``num_used_blocks``, ``free_queue()`` (the free ids, front first).

Errors, as the reference: ``NoFreeBlocksError(requested, available)`` when too few blocks are free;
``ValueError`` naming the id and the range ``0..num_blocks-1`` for an id that is not an int in range, or
saying "already free" for a block nobody holds; and every call that raises changes nothing.

The regions: the free queue (ch02.ex1), ``allocate_many`` (ch02.ex2), the id and count check that every
other method uses (ch02.ex3), ``free_many`` (ch02.ex4), ``take`` (ch02.ex5). Check each in the chapter with
``check("ch02.ex1")`` ... or with ``python -m paged grade ch02``. vLLM v1 keeps the same state in
``vllm/v1/core/block_pool.py`` (``BlockPool``) and ``vllm/v1/core/kv_cache_utils.py``
(``FreeKVCacheBlockQueue``, a doubly linked list); vLLM v0 in ``vllm/core/block/naive_block.py``.
"""

from __future__ import annotations

from paged.core.allocator import NoFreeBlocksError

PART_REGIONS = {"BlockAllocator": ("ch02.ex1", "ch02.ex2", "ch02.ex3", "ch02.ex4", "ch02.ex5")}


class FreeBlockQueue:
    """The free block ids in the order they will be handed out, with removal from anywhere.

    - ``FreeBlockQueue(num_blocks)`` holds ``0, 1, ..., num_blocks - 1``, front first;
    - ``popleft()`` removes and returns the front id (``IndexError`` when the queue is empty);
    - ``append(block_id)`` puts an id that is not in the queue at the back;
    - ``remove(block_id)`` takes out an id that is in the queue, wherever it stands;
    - ``len(queue)`` counts the ids; ``iter(queue)`` yields them front first.

    The allocator calls these in its hot path (once per block of every sequence), so ``popleft``,
    ``append``, ``remove`` and ``len`` must not walk the queue: constant time each. The callers guarantee
    that ``append`` gets an id that is not queued and ``remove`` one that is. Any structure works: vLLM
    v1 links the free blocks in a doubly linked list (``prev`` / ``next`` per block); Python's
    ``collections.OrderedDict`` keeps insertion order and deletes any key in constant time.
    """

    # BEGIN SOLUTION ch02.ex1 -- FreeBlockQueue: FIFO with removal from anywhere, every operation constant time
    # HINT: A list or a deque gets the order right but walks itself in pop(0), remove or insert; what structure
    # HINT+ unlinks one id without searching for it?
    # HINT: Link the ids to each other: for every id remember the one before it and the one after it, in a ring
    # HINT+ closed by one extra node that stands for both ends; taking an id out then only relinks its two
    # HINT+ neighbours. (An ordered dictionary that can drop its oldest key and any key also does it.) Count the ids
    # HINT+ as you go rather than walking them for the length.
    # STUB: def __init__(self, num_blocks: int):
    # STUB:     raise NotImplementedError("ch02.ex1: write FreeBlockQueue (its docstring says what each method does)")
    # STUB: def popleft(self) -> int:
    # STUB:     raise NotImplementedError("ch02.ex1: write FreeBlockQueue.popleft")
    # STUB: def append(self, block_id: int) -> None:
    # STUB:     raise NotImplementedError("ch02.ex1: write FreeBlockQueue.append")
    # STUB: def remove(self, block_id: int) -> None:
    # STUB:     raise NotImplementedError("ch02.ex1: write FreeBlockQueue.remove")
    # STUB: def __len__(self) -> int:
    # STUB:     raise NotImplementedError("ch02.ex1: write FreeBlockQueue.__len__")
    # STUB: def __iter__(self):
    # STUB:     raise NotImplementedError("ch02.ex1: write FreeBlockQueue.__iter__")
    def __init__(self, num_blocks: int):
        # a circular doubly linked list through ids 0 .. n-1 and a sentinel node n: _next[n] is the
        # front, _prev[n] the back; an empty queue is the sentinel linked to itself
        self._end = num_blocks
        self._next = [i + 1 for i in range(num_blocks)] + [0]
        self._prev = [i - 1 for i in range(num_blocks + 1)]
        self._prev[0] = num_blocks
        self._size = num_blocks

    def _unlink(self, block_id: int) -> None:
        before, after = self._prev[block_id], self._next[block_id]
        self._next[before], self._prev[after] = after, before
        self._size -= 1

    def popleft(self) -> int:
        if not self._size:
            raise IndexError("popleft from an empty free queue")
        front = self._next[self._end]
        self._unlink(front)
        return front

    def append(self, block_id: int) -> None:
        back = self._prev[self._end]
        self._next[back], self._prev[block_id] = block_id, back
        self._next[block_id], self._prev[self._end] = self._end, block_id
        self._size += 1

    def remove(self, block_id: int) -> None:
        self._unlink(block_id)

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        block_id = self._next[self._end]
        while block_id != self._end:
            yield block_id
            block_id = self._next[block_id]

    # END SOLUTION


class BlockAllocator:
    """Hands out block ids ``0 .. num_blocks - 1`` and counts the holders of each (module docstring).

    State (set up for you): ``_ref_counts[b]``, the holders of block ``b`` (0: free); ``_free``, a
    ``FreeBlockQueue`` of exactly the blocks whose count is 0. Invariant: ``num_free_blocks + (blocks with
    count > 0) == num_blocks``.
    """

    def __init__(self, num_blocks: int):
        if type(num_blocks) is not int or num_blocks < 0:
            raise ValueError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._free = FreeBlockQueue(num_blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def free_queue(self) -> list[int]:
        """The free block ids in the order ``allocate`` will hand them out (front first)."""
        return list(self._free)

    def allocate(self) -> int:
        """The block at the front of the free queue, its count set to 1."""
        return self.allocate_many(1)[0]

    def free(self, block_id: int) -> None:
        """One holder fewer; at zero the block joins the back of the free queue."""
        self.free_many((block_id,))

    def incref(self, block_id: int) -> None:
        """One more holder for a block in use."""
        self._check(block_id, "incref")
        self._ref_counts[block_id] += 1

    def ref_count(self, block_id: int) -> int:
        """Holders of ``block_id`` (0 when it is free)."""
        return self._check(block_id, "ref_count", in_use=False)

    def allocate_many(self, n: int) -> list[int]:
        """The ``n`` blocks at the front of the free queue, in queue order, each now held once.

        All or nothing: with fewer than ``n`` free blocks, raise ``NoFreeBlocksError(n, free blocks)``
        and change nothing (vLLM v1 ``BlockPool.get_new_blocks``). ``n == 0`` returns ``[]``. The time
        depends on ``n``, not on the size of the pool.
        """
        # BEGIN SOLUTION ch02.ex2 -- the front n blocks, each held once, or NoFreeBlocksError and no change
        # HINT: All or nothing: can you know whether the call will succeed before the first block leaves the queue?
        # HINT: Compare n with len(self._free) (constant time) and raise first; then popleft n times and set each
        # HINT+ count to 1.
        if n > len(self._free):
            raise NoFreeBlocksError(n, len(self._free))
        taken = [self._free.popleft() for _ in range(n)]
        for block_id in taken:
            self._ref_counts[block_id] = 1
        return taken
        # END SOLUTION

    def _check(self, block_id, op: str, in_use: bool = True) -> int:
        """The reference count of ``block_id``, after checking it.

        Raises ``ValueError`` whose message starts with ``op`` and names the id and the range
        ``0..num_blocks-1`` unless ``block_id`` is an ``int`` in that range (a float, a string, ``None``
        or a negative id is not an id); with ``in_use``, ``ValueError`` saying the block is "already free"
        when its count is 0. Changes nothing. A ``bool`` is not an id either (``True`` is an ``int`` to
        ``isinstance``).
        """
        # BEGIN SOLUTION ch02.ex3 -- the count of a valid id, else ValueError starting with op (see the docstring)
        # HINT: Which values would Python accept as a list index although they are not block ids (2.0 is not accepted,
        # HINT+ but -1 and True are)?
        # HINT: Test type(block_id) is int (not isinstance: a bool passes that) and the range before you read the
        # HINT+ count; then, with in_use, refuse a count of 0.
        if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
        count = self._ref_counts[block_id]
        if in_use and not count:
            raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
        return count
        # END SOLUTION

    def free_many(self, block_ids) -> None:
        """Drop one holder of each listed block, in the order listed; a block whose count reaches 0 joins
        the back of the free queue (a sequence frees its blocks tail first, so its tail is reused first).

        All or nothing: every id is checked before anything changes (``_check`` with op ``"free"``), and
        an id listed ``k`` times needs ``k`` holders, else ``ValueError`` naming it, wherever the bad id
        stands in the list. The time depends on the ids listed, not on the size of the pool.
        """
        block_ids = tuple(block_ids)
        # BEGIN SOLUTION ch02.ex4 -- one holder fewer per listed id, all or nothing (see the docstring)
        # STUB: # Spot the bug: this free_many runs and looks right, and it passes some of its checks, but one
        # STUB: # promise of the docstring does not hold (chapter 02 shows the symptom). Fix it; the region
        # STUB: # counts only when every one of its checks passes.
        # STUB: for block_id in block_ids:
        # STUB:     self._check(block_id, "free")
        # STUB:     self._ref_counts[block_id] -= 1
        # STUB:     if not self._ref_counts[block_id]:
        # STUB:         self._free.append(block_id)
        # HINT: Run the chapter's symptom cell: when the third id is bad, what has already happened to the first
        # HINT+ two? And what does _check say about a block listed twice with one holder, the second time?
        # HINT: Check every id first, counting its listings against its holders (a dict), and raise before any
        # HINT+ count changes; release in a second pass.
        listed: dict[int, int] = {}
        for block_id in block_ids:
            count = self._check(block_id, "free")
            listed[block_id] = listed.get(block_id, 0) + 1
            if listed[block_id] > count:
                raise ValueError(
                    f"free: block {block_id} is listed {listed[block_id]} times but has {count} holders"
                )
        for block_id in block_ids:
            self._ref_counts[block_id] -= 1
            if not self._ref_counts[block_id]:
                self._free.append(block_id)
        # END SOLUTION

    def take(self, block_id: int) -> None:
        """Pull the free block ``block_id`` out of the free queue, wherever it stands; its count becomes 1.

        ``ValueError`` for an id out of range (``_check`` with op ``"take"``) and for a block in use (the
        message says "in use" and gives its count); nothing changes then. Constant time: the other free
        blocks keep their order.
        """
        # BEGIN SOLUTION ch02.ex5 -- a given free block leaves the queue and is held once; a block in use is refused
        # HINT: The count already says whether the block is free: is there any need to look through the queue?
        # HINT: The id check you wrote in step 3, told that a free block is allowed here, hands you the count; a
        # HINT+ count other than zero is the error to raise, otherwise take the block out of the free queue and give
        # HINT+ it its one holder.
        count = self._check(block_id, "take", in_use=False)
        if count:
            raise ValueError(f"take: block {block_id} is in use (ref count {count})")
        self._free.remove(block_id)
        self._ref_counts[block_id] = 1
        # END SOLUTION

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, free={self.num_free_blocks})"
