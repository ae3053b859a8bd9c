# Generated from solutions/ex02_allocator.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

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

    def __init__(self, num_blocks: int):
        raise NotImplementedError(
            "ch02.ex1: write FreeBlockQueue (its docstring says what each method does)"
        )

    def popleft(self) -> int:
        raise NotImplementedError("ch02.ex1: write FreeBlockQueue.popleft")

    def append(self, block_id: int) -> None:
        raise NotImplementedError("ch02.ex1: write FreeBlockQueue.append")

    def remove(self, block_id: int) -> None:
        raise NotImplementedError("ch02.ex1: write FreeBlockQueue.remove")

    def __len__(self) -> int:
        raise NotImplementedError("ch02.ex1: write FreeBlockQueue.__len__")

    def __iter__(self):
        raise NotImplementedError("ch02.ex1: write FreeBlockQueue.__iter__")


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
        raise NotImplementedError(
            "ch02.ex2: the front n blocks, each held once, or NoFreeBlocksError and no change"
        )

    def _check(self, block_id, op: str, in_use: bool = True) -> int:
        """The reference count of ``block_id``, after checking it.

        Raises ``ValueError`` whose message starts with ``op`` and names the id and the range
        ``0..num_blocks-1`` unless ``block_id`` is an ``int`` in that range (a float, a string, ``None``
        or a negative id is not an id); with ``in_use``, ``ValueError`` saying the block is "already free"
        when its count is 0. Changes nothing. A ``bool`` is not an id either (``True`` is an ``int`` to
        ``isinstance``).
        """
        raise NotImplementedError(
            "ch02.ex3: the count of a valid id, else ValueError starting with op (see the docstring)"
        )

    def free_many(self, block_ids) -> None:
        """Drop one holder of each listed block, in the order listed; a block whose count reaches 0 joins
        the back of the free queue (a sequence frees its blocks tail first, so its tail is reused first).

        All or nothing: every id is checked before anything changes (``_check`` with op ``"free"``), and
        an id listed ``k`` times needs ``k`` holders, else ``ValueError`` naming it, wherever the bad id
        stands in the list. The time depends on the ids listed, not on the size of the pool.
        """
        block_ids = tuple(block_ids)
        # Spot the bug: this free_many runs and looks right, and it passes some of its checks, but one
        # promise of the docstring does not hold (chapter 02 shows the symptom). Fix it; the region
        # counts only when every one of its checks passes.
        for block_id in block_ids:
            self._check(block_id, "free")
            self._ref_counts[block_id] -= 1
            if not self._ref_counts[block_id]:
                self._free.append(block_id)

    def take(self, block_id: int) -> None:
        """Pull the free block ``block_id`` out of the free queue, wherever it stands; its count becomes 1.

        ``ValueError`` for an id out of range (``_check`` with op ``"take"``) and for a block in use (the
        message says "in use" and gives its count); nothing changes then. Constant time: the other free
        blocks keep their order.
        """
        raise NotImplementedError(
            "ch02.ex5: a given free block leaves the queue and is held once; a block in use is refused"
        )

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, free={self.num_free_blocks})"
