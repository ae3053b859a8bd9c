"""Graded: chapter 02, the block allocator (exercises/ex02_allocator.py).

Each test compares the learner's allocator with a plain model written here (a list as the free queue,
a dict of counts), on hand-made cases and on seeded random traces over several pool sizes.
"""

from __future__ import annotations

import random

import pytest

from paged.core.allocator import NoFreeBlocksError


class Model:
    """Reference: FIFO free queue, counts per block."""

    def __init__(self, n):
        self.n, self.free, self.refs = n, list(range(n)), [0] * n

    def allocate(self):
        if not self.free:
            return "NoFreeBlocksError"
        b = self.free.pop(0)
        self.refs[b] = 1
        return b

    def valid(self, b):
        return isinstance(b, int) and 0 <= b < self.n and self.refs[b] > 0

    def free_(self, b):
        if not self.valid(b):
            return "ValueError"
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free.append(b)

    def incref(self, b):
        if not self.valid(b):
            return "ValueError"
        self.refs[b] += 1


def _state(a):
    return list(a.free_list), [a.ref_count(b) for b in range(a.num_blocks)], a.num_free_blocks


@pytest.mark.exercise("ch02.ex1", points=2)
def test_allocate_in_order_until_empty(impl):
    ex = impl("ex02_allocator")
    for n in (1, 5, 11):
        a = ex.BlockAllocator(n)
        assert [a.allocate() for _ in range(n)] == list(range(n)), "a fresh pool hands out ids in order"
        assert [a.ref_count(b) for b in range(n)] == [1] * n, "an allocated block has count 1"
        assert a.num_free_blocks == 0
        with pytest.raises(NoFreeBlocksError) as err:
            a.allocate()
        assert (err.value.requested, err.value.available) == (1, 0), "requested 1, available 0"


@pytest.mark.exercise("ch02.ex2", points=2)
@pytest.mark.parametrize("bad", [-1, 7, 100, 2.0, "3", None])
def test_free_and_incref_reject_unknown_ids_without_change(impl, bad):
    ex = impl("ex02_allocator")
    a = ex.BlockAllocator(7)
    a.free_list.rotate(3)  # a non-trivial queue order
    before = _state(a)
    for op in (a.free, a.incref):
        with pytest.raises(ValueError):
            op(bad)
    assert _state(a) == before, "state unchanged after a rejected call"


@pytest.mark.exercise("ch02.ex2", points=2)
def test_free_and_incref_reject_a_free_block(impl):
    ex = impl("ex02_allocator")
    a = ex.BlockAllocator(4)
    a.ref_counts[2] = 1  # block 2 in use (held outside the free list), block 0 free
    a.free_list.remove(2)
    before = _state(a)
    for op in (a.free, a.incref):
        with pytest.raises(ValueError):
            op(0)
    assert _state(a) == before, "state unchanged after a rejected call"


@pytest.mark.exercise("ch02.ex3", points=3)
def test_free_returns_blocks_to_the_back_of_the_queue(impl):
    ex = impl("ex02_allocator")
    a = ex.BlockAllocator(5)
    for _ in range(5):
        a.allocate()
    a.ref_counts[3] = 3  # three holders
    for b in (4, 1, 3, 3, 0):
        a.free(b)
    assert list(a.free_list) == [4, 1, 0], "blocks reach the back of the queue when their count hits 0"
    assert a.ref_count(3) == 1, "a block with holders left stays in use"
    a.free(3)
    assert list(a.free_list) == [4, 1, 0, 3]
    assert [a.allocate() for _ in range(2)] == [4, 1], "the least recently freed block is reused first"
    with pytest.raises(ValueError):
        a.free(3)  # double free


@pytest.mark.exercise("ch02.ex4", points=1)
def test_incref_adds_a_holder(impl):
    ex = impl("ex02_allocator")
    a = ex.BlockAllocator(3)
    b = a.allocate()
    a.incref(b)
    a.incref(b)
    assert a.ref_count(b) == 3
    a.free(b)
    a.free(b)
    assert a.ref_count(b) == 1 and a.num_free_blocks == 2, "shared block stays in use until its last holder frees it"


@pytest.mark.exercise("ch02.ex3", points=2)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_trace_matches_the_model(impl, seed):
    ex = impl("ex02_allocator")
    rng = random.Random(seed)
    n = rng.choice([3, 6, 9])
    a, m = ex.BlockAllocator(n), Model(n)
    for step in range(300):
        op = rng.choice(["allocate", "allocate", "free", "free", "incref", "bad"])
        held = [b for b in range(n) if m.refs[b] > 0]
        if op == "allocate":
            want = m.allocate()
            if want == "NoFreeBlocksError":
                with pytest.raises(NoFreeBlocksError):
                    a.allocate()
            else:
                assert a.allocate() == want, f"step {step}: allocate returned another block than the queue front"
        else:
            b = rng.choice(held) if held and op != "bad" else rng.choice([-2, n, rng.randrange(n)])
            fn, mfn = (a.incref, m.incref) if op == "incref" else (a.free, m.free_)
            if mfn(b) == "ValueError":
                with pytest.raises(ValueError):
                    fn(b)
            else:
                fn(b)
        assert _state(a) == (m.free, m.refs, len(m.free)), f"step {step} ({op}): queue or counts differ"
