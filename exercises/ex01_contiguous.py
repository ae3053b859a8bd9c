# Generated from solutions/ex01_contiguous.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

"""Exercise 01, part 2: the contiguous first-fit allocator of the fragmentation simulator (chapter 01).

Before paging, a serving system gave each request one run of adjacent KV slots, reserved for its whole
stay (the PagedAttention paper's "contiguous" baseline, Kwon et al., SOSP 2023, §3). You write the
allocator that hands those runs out: ``allocate`` (ch01.ex4) places a request first fit, ``free``
(ch01.ex5) gives its run back and merges it with the free space around it, and ``compact`` (ch01.ex7)
slides the runs together to win the holes back, at the price of copying them. The chapter runs the
simulator's contiguous manager on your class (``simulate(..., contiguous_allocator=ContiguousAllocator)``)
and shows the third kind of waste that only this design has: **external fragmentation**, free slots that
add up to enough but lie in holes too small for the request that waits.

First fit, and merging neighbours on free, are the classic choices of a general-purpose memory allocator
(Knuth, *The Art of Computer Programming* vol. 1, §2.5, "Dynamic storage allocation"). The simulator's
own version (``paged_course.sim.fragmentation_events``) keeps the same holes in NumPy arrays; the graded
tests compare yours with a slot-by-slot model written in the tests.
"""

from __future__ import annotations

import bisect

PART_REGIONS = {"ContiguousAllocator": ("ch01.ex4", "ch01.ex5")}


class ContiguousAllocator:
    """A pool of ``num_slots`` token slots handed out as runs of adjacent slots, first fit.

    State (read by the tests and the simulator; keep it true after every call):
        holes: the free space as ``[start, end)`` pairs (lists of two ints), sorted by ``start``; no two
            overlap or touch (touching holes are one hole), none is empty. A new pool is one hole
            ``[0, num_slots)``.
        runs: ``{start: size}`` of every run handed out and not yet freed.

    Every slot is in exactly one hole or one run. An operation that returns ``None`` or raises leaves
    the state as it was.
    """

    def __init__(self, num_slots: int):
        if num_slots <= 0:
            raise ValueError(f"num_slots must be > 0, got {num_slots}")
        self.num_slots = num_slots
        self.holes: list[list[int]] = [[0, num_slots]]
        self.runs: dict[int, int] = {}

    @property
    def free_slots(self) -> int:
        """Slots in holes."""
        return sum(end - start for start, end in self.holes)

    @property
    def largest_hole(self) -> int:
        """The longest run that ``allocate`` can place now (0 when the pool is full)."""
        return max((end - start for start, end in self.holes), default=0)

    def allocate(self, size: int) -> int | None:
        """Place a run of ``size`` adjacent slots in the lowest-addressed hole that holds it.

        Returns the run's first slot, or ``None`` when no single hole holds ``size`` slots (even when the
        holes add up to more: external fragmentation); ``None`` changes nothing. The run is taken from
        the start of its hole. Time: one pass over the holes at most.

        Raises:
            ValueError: ``size`` <= 0 (nothing changes).
        """
        if size <= 0:
            raise ValueError(f"a run needs at least one slot, got size={size}")
        raise NotImplementedError(
            "ch01.ex4: the lowest-addressed hole that holds size slots gives its start; None: no change"
        )

    def free(self, start: int) -> None:
        """Give back the run that begins at slot ``start``; its slots join the holes, merged with a hole
        that ends where the run begins and with one that begins where it ends.

        Time: a binary search for the run's place among the holes, then constant work around it (plus
        the list's insert or delete).

        Raises:
            KeyError: no run begins at ``start`` (nothing changes; the message gives the runs' count).
        """
        if start not in self.runs:
            raise KeyError(
                f"no run begins at slot {start} ({len(self.runs)} runs are handed out; free takes the "
                "value allocate returned, once)"
            )
        raise NotImplementedError(
            "ch01.ex5: the run back among the holes, merged with the holes it touches"
        )

    def compact(self) -> list[tuple[int, int, int]]:
        """Close every hole by sliding the runs down: what a contiguous design must do to recover memory
        lost to external fragmentation, and what paging never needs.

        Every run keeps its size and its order in the pool and moves to the lowest address it can: the first
        run to slot 0, each next one to the slot after the one before it. Afterwards the free space is one
        hole at the top, ``[used, num_slots)``, or no hole when the runs fill the pool; ``runs`` maps each
        run's new start to its size (so ``free`` takes the new start from now on).

        Returns:
            The copies to make, ``(old_start, new_start, size)`` for every run that moves, in the order in
            which copying them one after another, each a copy of ``size`` slots, never overwrites a slot of a
            run not copied yet. A run already in place is not listed (copying it would cost for nothing).

        Time: ``O(r log r)`` for ``r`` runs (independent of the pool's size).

        Source: compaction of a memory with variable partitions (Knuth, *The Art of Computer Programming*
        vol. 1, §2.5); the PagedAttention paper (Kwon et al., SOSP 2023, §4.2) avoids it with fixed-size
        blocks mapped through a block table, as an operating system's paging does.
        """
        raise NotImplementedError(
            "ch01.ex7: runs slid down in address order, the moved ones listed in a safe copy order"
        )
