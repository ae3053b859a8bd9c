"""Graded: chapter 01, the contiguous first-fit allocator (exercises/ex01_contiguous.py).

ch01.ex4 (``allocate``) and ch01.ex5 (``free``) are compared with a slot-by-slot model written here (a list
of booleans: a run goes to the lowest slot that starts ``size`` free slots; the holes are the maximal runs of
free slots), on hand-made pools with the fitting hole, the exact fit and the touching neighbour at every
position, and on random traces. ``None`` and errors leave the state as it was; ``free`` finds its place by
binary search (the tests count the hole list's reads).
"""

from __future__ import annotations

import random

import pytest


class CountingList(list):
    """A list that counts the items read from it (indexing and iteration)."""

    reads = 0

    def __getitem__(self, index):
        CountingList.reads += 1
        return super().__getitem__(index)

    def __iter__(self):
        for item in super().__iter__():
            CountingList.reads += 1
            yield item


def _pool(impl, num_slots, runs):
    """A pool whose runs are ``runs`` (``{start: size}``) and whose holes are everything else."""
    cls = impl("ex01_contiguous").ContiguousAllocator
    pool = cls(num_slots)
    taken = sorted(runs.items())
    holes, at = [], 0
    for start, size in taken:
        if start > at:
            holes.append([at, start])
        at = start + size
    if at < num_slots:
        holes.append([at, num_slots])
    pool.holes, pool.runs = holes, dict(runs)
    return pool


def _state(pool):
    return [list(h) for h in pool.holes], dict(pool.runs)


def _model_holes(free):
    holes, start = [], None
    for i, is_free in enumerate([*free, False]):
        if is_free and start is None:
            start = i
        elif not is_free and start is not None:
            holes.append([start, i])
            start = None
    return holes


def _model_first_fit(free, size):
    run = 0
    for i, is_free in enumerate(free):
        run = run + 1 if is_free else 0
        if run == size:
            return i - size + 1
    return None


# ============================================================ ch01.ex4: allocate


@pytest.mark.exercise("ch01.ex4", points=2)
def test_a_new_pool_hands_out_runs_back_to_back(impl):
    pool = impl("ex01_contiguous").ContiguousAllocator(100)
    starts = [pool.allocate(size) for size in (10, 1, 30)]
    assert starts == [0, 10, 11], (
        f"runs of 10, 1, 30 slots in a new pool of 100: got starts {starts}"
    )
    assert pool.holes == [[41, 100]], f"what is left is one hole [41, 100), got {pool.holes}"
    assert pool.runs == {0: 10, 10: 1, 11: 30}, f"runs must record start -> size, got {pool.runs}"
    assert pool.allocate(59) == 41, (
        "a run that fills the last hole exactly starts at its first slot"
    )
    assert pool.holes == [], f"an exact fit uses the hole up: no empty hole stays, got {pool.holes}"


@pytest.mark.exercise("ch01.ex4", points=1)
@pytest.mark.parametrize("position", [0, 1, 2, 3], ids=lambda p: f"the hole that fits is #{p}")
def test_the_lowest_hole_that_fits_at_every_position(impl, position):
    # Four holes of 3 slots; the one at `position` grows to 12. A run of 8 fits only there; a run of 3 then
    # goes to the lowest hole (first fit), not to the best one.
    runs, holes_at = {}, []
    for k in range(4):
        start = k * 20
        size = 12 if k == position else 3
        holes_at.append(start)
        runs[start + size] = 20 - size
    pool = _pool(impl, 80, runs)
    assert pool.allocate(8) == holes_at[position], (
        f"holes of 3, 3, 3, 3 slots but #{position} of 12: a run of 8 goes to #{position}, at slot "
        f"{holes_at[position]}"
    )
    expected = [[s, s + 3] for s in holes_at]
    expected[position] = [holes_at[position] + 8, holes_at[position] + 12]
    assert pool.holes == expected, f"the hole it came from shrinks from its start: {pool.holes}"
    expected_start = 8 if position == 0 else 0  # hole #0 is [8, 12) or [0, 3)
    got = pool.allocate(3)
    assert got == expected_start, (
        f"first fit: a run of 3 takes the lowest-addressed hole that holds it, at {expected_start}; got {got}"
    )


@pytest.mark.exercise("ch01.ex4", points=1)
@pytest.mark.parametrize("position", [0, 1, 2], ids=lambda p: f"the exact fit is hole #{p}")
def test_first_fit_not_best_fit_and_exact_fits_at_every_position(impl, position):
    # Holes of 9 slots, with one of exactly 5 at `position`: a run of 5 goes to the first hole that holds it.
    sizes = [9, 9, 9]
    sizes[position] = 5
    runs, starts, at = {}, [], 0
    for size in sizes:
        starts.append(at)
        runs[at + size] = 1
        at += size + 1
    pool = _pool(impl, at, runs)
    before = _state(pool)
    got = pool.allocate(5)
    assert got == starts[0], (
        f"holes of {sizes} slots: a run of 5 goes to the first, at {starts[0]} (first fit, not the best "
        f"fit), got {got}"
    )
    if position == 0:
        assert [starts[0], starts[0] + 5] not in pool.holes and len(pool.holes) == 2, (
            f"an exact fit removes its hole: {pool.holes}"
        )
    assert len(pool.runs) == len(before[1]) + 1 and pool.runs[got] == 5, (
        f"holes of {sizes} slots: allocate(5) adds exactly one run, of 5 slots at {got}: runs {pool.runs}"
    )


@pytest.mark.exercise("ch01.ex4", points=2)
def test_external_fragmentation_returns_none_and_changes_nothing(impl):
    # 30 slots free in holes of 10: a run of 11 fits in none. Nothing may change, not even the holes' lists.
    pool = _pool(impl, 60, {10: 10, 30: 10, 50: 10})
    before = _state(pool)
    hole_lists = [id(h) for h in pool.holes]
    assert pool.free_slots == 30 and pool.largest_hole == 10, "set-up: 3 holes of 10 slots"
    assert pool.allocate(11) is None, (
        "30 slots are free but no hole holds 11: allocate returns None"
    )
    assert _state(pool) == before and [id(h) for h in pool.holes] == hole_lists, (
        f"allocate returned None but changed the state: {_state(pool)} (was {before})"
    )
    full = _pool(impl, 8, {0: 8})
    assert full.allocate(1) is None and full.holes == [] and full.runs == {0: 8}, (
        "a full pool holds nothing"
    )


@pytest.mark.exercise("ch01.ex4", points=1)
def test_allocate_reads_each_hole_once_at_most(impl):
    pool = _pool(impl, 30_000, {3 * k + 2: 1 for k in range(10_000)})  # 10,000 holes of 2 slots
    pool.holes = CountingList(pool.holes)
    CountingList.reads = 0
    assert pool.allocate(3) is None, "10,000 holes of 2 slots: a run of 3 fits in none (None)"
    assert CountingList.reads <= len(pool.holes) + 2, (
        f"allocate read {CountingList.reads} holes of {len(pool.holes)}: one pass at most"
    )


# ============================================================ ch01.ex5: free


@pytest.mark.exercise("ch01.ex5", points=1)
@pytest.mark.parametrize("position", [0, 1, 2], ids=lambda p: f"run #{p}")
@pytest.mark.parametrize(
    "touch", ["none", "before", "after", "both"], ids=lambda t: f"touching {t}"
)
def test_free_merges_with_the_holes_it_touches_at_every_position(impl, position, touch):
    # Three runs of 4 slots at 10, 30, 50 in a pool of 70, with holes around them; the run freed is number
    # `position`, and the runs next to it are moved so that it touches the hole before it, after it, both
    # or neither.
    starts = [10, 30, 50]
    runs = {s: 4 for s in starts}
    s = starts[position]
    if touch in ("none", "after"):  # a 1-slot run just before keeps it off the hole before
        runs[s - 1] = 1
    if touch in ("none", "before"):  # and one just after keeps it off the hole after
        runs[s + 4] = 1
    pool = _pool(impl, 70, runs)
    free = [True] * 70
    for start, size in runs.items():
        free[start : start + size] = [False] * size
    pool.free(s)
    free[s : s + 4] = [True] * 4
    assert pool.holes == _model_holes(free), (
        f"after freeing the run at {s} (touching {touch}): holes {pool.holes}, expected "
        f"{_model_holes(free)} (sorted, merged, none empty)"
    )
    assert s not in pool.runs and len(pool.runs) == len(runs) - 1, "the freed run leaves runs"


@pytest.mark.exercise("ch01.ex5", points=1)
def test_freeing_every_run_gives_one_hole(impl):
    pool = _pool(impl, 40, {0: 10, 10: 10, 20: 10, 30: 10})
    with pytest.raises(KeyError):
        pool.free(5)  # not a run's start
    assert pool.runs == {0: 10, 10: 10, 20: 10, 30: 10} and pool.holes == [], (
        "a failed free changes nothing"
    )
    for start in (10, 30, 0, 20):
        pool.free(start)
    assert pool.holes == [[0, 40]] and pool.runs == {}, (
        f"an empty pool is one hole, got {pool.holes}"
    )


@pytest.mark.exercise("ch01.ex5", points=2)
def test_free_finds_its_place_by_binary_search(impl):
    runs = {3 * k + 2: 1 for k in range(10_000)}  # 10,000 holes of 2 slots, a run of 1 after each
    pool = _pool(impl, 30_000, runs)
    counting = CountingList(pool.holes)
    pool.holes = counting
    for start in (2, 3 * 5_000 + 2, 3 * 9_999 + 2, 3 * 7_777 + 2):
        CountingList.reads = 0
        pool.free(start)
        assert pool.holes is counting, "free must update the hole list in place, not rebuild it"
        assert CountingList.reads <= 40, (
            f"freeing the run at {start} read {CountingList.reads} of {len(pool.holes)} holes: find its "
            "place by binary search (bisect), then look at the two holes around it"
        )
    assert list(pool.holes)[:2] == [[0, 5], [6, 8]], "the first run's two holes merged into [0, 5)"


@pytest.mark.exercise("ch01.ex5", points=1, uses=("ch01.ex4",))
@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed {s}")
def test_random_traces_match_the_slot_model(impl, seed):
    rng = random.Random(seed)
    num_slots = 64
    pool = impl("ex01_contiguous").ContiguousAllocator(num_slots)
    free = [True] * num_slots
    for step in range(300):
        if pool.runs and rng.random() < 0.45:
            start = rng.choice(sorted(pool.runs))
            size = pool.runs[start]
            pool.free(start)
            free[start : start + size] = [True] * size
            what = f"free({start})"
        else:
            size = rng.choice([1, 2, 3, 5, 8, 13])
            expected = _model_first_fit(free, size)
            got = pool.allocate(size)
            assert got == expected, (
                f"seed {seed}, step {step}: allocate({size}) gave {got}, first fit is {expected}"
            )
            if got is not None:
                free[got : got + size] = [False] * size
            what = f"allocate({size})"
        assert pool.holes == _model_holes(free), (
            f"seed {seed}, step {step}, after {what}: holes {pool.holes}, expected {_model_holes(free)}"
        )
        assert pool.free_slots == sum(free), (
            f"seed {seed}, step {step}, after {what}: {pool.free_slots} free slots, the holes hold "
            f"{sum(free)}"
        )


# ---------------------------------------------------------------- ch01.ex7: compaction


def _compacted(pool, what):
    """Run ``pool.compact()`` on a slot model holding each run's id, replay the copies it returns one after
    another, and check the layout, the state and the copy list. Returns the copies."""
    before = dict(pool.runs)
    slots = [None] * pool.num_slots
    for start, size in before.items():
        slots[start : start + size] = [start] * size  # each slot holds its run's old start
    moves = pool.compact()
    assert isinstance(moves, list), f"{what}: compact returns a list of copies, got {moves!r}"
    for old, new, size in moves:
        assert before.get(old) == size, (
            f"{what}: copy {(old, new, size)} is not a run of the pool (runs {before})"
        )
        slots[new : new + size] = slots[old : old + size]  # one copy after another, as listed
    want, top = {}, 0
    for start in sorted(before):
        want[top] = before[start]
        assert slots[top : top + before[start]] == [start] * before[start], (
            f"{what}: after the copies {moves}, the run that began at {start} must fill slots "
            f"{top}..{top + before[start] - 1}; a copy overwrote slots of a run not copied yet, or a run "
            "that moves is missing from the list"
        )
        top += before[start]
    moved = [(old, new) for old, new, _ in moves]
    must = [(old, new) for old, new in zip(sorted(before), want) if old != new]
    assert sorted(moved) == sorted(must), (
        f"{what}: the runs that move are {must}; got {moved} (a run already in place costs no copy)"
    )
    assert pool.runs == want, f"{what}: runs must be {want} after compaction, got {pool.runs}"
    holes = [[top, pool.num_slots]] if top < pool.num_slots else []
    assert pool.holes == holes, f"{what}: holes must be {holes}, got {pool.holes}"
    return moves


@pytest.mark.exercise("ch01.ex7", points=2)
def test_compact_slides_the_runs_down_in_order(impl):
    # 40 slots, runs of 10 at 0, 10, 20, 30; the ones at 10 and 30 finished: holes [10, 20) and [30, 40)
    pool = _pool(impl, 40, {0: 10, 20: 10})
    moves = _compacted(pool, "runs at 0 and 20 in 40 slots")
    assert moves == [(20, 10, 10)], f"only the run at 20 moves, to 10: got {moves}"
    assert pool.allocate(15) == 20, "after compaction one hole of 20 slots holds a run of 15 at 20"


@pytest.mark.exercise("ch01.ex7", points=2)
@pytest.mark.parametrize("gap", range(4), ids=lambda g: f"hole before run {g}")
def test_compact_with_the_first_hole_at_every_position(impl, gap):
    # four runs of sizes 3, 5, 2, 4; one hole of 6 slots before run `gap` (and a hole at the top)
    sizes, runs, at = [3, 5, 2, 4], {}, 0
    for i, size in enumerate(sizes):
        if i == gap:
            at += 6
        runs[at] = size
        at += size
    pool = _pool(impl, 30, runs)
    moves = _compacted(pool, f"the hole before run {gap}")
    assert len(moves) == 4 - gap, f"the {4 - gap} runs above the hole move, got {moves}"


@pytest.mark.exercise("ch01.ex7", points=2)
def test_compact_overlapping_moves_in_a_safe_order(impl):
    # long runs separated by one-slot holes: each run moves by less than its size, so its copy overlaps
    # the run below it; copying the higher runs first would overwrite runs not yet copied
    pool = _pool(impl, 64, {1: 12, 14: 12, 27: 12, 40: 12})
    moves = _compacted(pool, "runs of 12 after holes of 1")
    assert [new for _, new, _ in moves] == [0, 12, 24, 36], (
        "runs of 12 at 1, 14, 27, 40 move down to 0, 12, 24, 36, lowest first: a copy overlaps the run "
        f"above it only after that run has moved; moves {moves}"
    )


@pytest.mark.exercise("ch01.ex7", points=1)
def test_compact_a_full_pool_an_empty_pool_and_a_packed_one(impl):
    full = _pool(impl, 12, {0: 4, 4: 8})
    assert _compacted(full, "a full pool") == [] and full.holes == [], (
        "a full pool (runs 0-3, 4-11 of 12 slots): no move and no hole"
    )
    empty = _pool(impl, 12, {})
    assert _compacted(empty, "an empty pool") == [] and empty.holes == [[0, 12]], (
        "an empty pool of 12 slots: no move, one hole [0, 12]"
    )
    packed = _pool(impl, 12, {0: 4, 4: 3})
    assert _compacted(packed, "runs already at the bottom") == [], "nothing to copy"


@pytest.mark.exercise("ch01.ex7", points=2, uses=("ch01.ex4", "ch01.ex5"))
@pytest.mark.parametrize("seed", range(3), ids=lambda s: f"seed {s}")
def test_compact_then_allocate_and_free_on_random_pools(impl, seed):
    rng = random.Random(seed)
    pool = impl("ex01_contiguous").ContiguousAllocator(96)
    for round_ in range(6):
        for _ in range(40):
            if pool.runs and rng.random() < 0.5:
                pool.free(rng.choice(sorted(pool.runs)))
            else:
                pool.allocate(rng.choice([1, 2, 3, 5, 8, 13]))
        _compacted(pool, f"seed {seed}, round {round_}")
        size = pool.free_slots
        if size:
            assert pool.allocate(size) is not None, (
                f"seed {seed}, round {round_}: after compaction all {size} free slots are one hole"
            )
            pool.free(max(pool.runs))


@pytest.mark.exercise("ch01.ex7", points=1)
def test_compact_costs_the_runs_not_the_pool(impl):
    import time

    pool = _pool(impl, 10**9, {i * 1000 + 7: 500 for i in range(20_000)})
    start = time.perf_counter()
    moves = pool.compact()
    seconds = time.perf_counter() - start
    assert len(moves) == 20_000 and seconds < 2.0, (
        f"20,000 runs in a pool of 10^9 slots: {len(moves)} copies in {seconds:.2f} s; compaction must "
        "cost per run, never per slot of the pool"
    )
