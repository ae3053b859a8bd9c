"""BlockAllocator: free queue order, reference counts, errors (the public contract of ``paged.core.allocator``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.core.allocator import BlockAllocator, NoFreeBlocksError


def test_allocate_hands_out_ids_in_order_and_counts_references():
    a = BlockAllocator(4)
    assert [a.allocate() for _ in range(3)] == [0, 1, 2], (
        "a fresh pool hands out blocks in id order"
    )
    assert a.num_free_blocks == 1 and a.num_used_blocks == 3
    a.incref(1)
    assert a.ref_count(1) == 2, "incref adds one holder"
    a.free(1)
    assert a.ref_count(1) == 1 and a.num_free_blocks == 1, "a block with a holder left stays in use"
    a.free(1)
    assert a.ref_count(1) == 0 and a.free_queue() == [3, 1], (
        "a freed block goes to the back of the queue"
    )


def test_free_queue_is_fifo_so_the_least_recently_freed_block_is_reused_first():
    a = BlockAllocator(3)
    ids = [a.allocate() for _ in range(3)]
    for b in (2, 0, 1):
        a.free(b)
    assert a.free_queue() == [2, 0, 1]
    assert [a.allocate() for _ in range(3)] == [2, 0, 1], "allocation follows free order"
    assert sorted(ids) == [0, 1, 2]


def test_running_out_raises_with_requested_and_available_counts():
    a = BlockAllocator(2)
    a.allocate()
    with pytest.raises(NoFreeBlocksError, match="requested 3, available 1") as err:
        a.allocate_many(3)
    assert (err.value.requested, err.value.available) == (3, 1)
    assert a.num_free_blocks == 1, "a failed allocate_many takes nothing"
    a.allocate()
    with pytest.raises(NoFreeBlocksError, match="requested 1, available 0"):
        a.allocate()


@pytest.mark.parametrize("bad", [-1, 4, 99, 1.0, "1", None])
def test_free_and_incref_of_unknown_ids_raise_value_error(bad):
    a = BlockAllocator(4)
    a.allocate()
    for op in (a.free, a.incref, a.ref_count):
        with pytest.raises(ValueError, match="not in 0..3"):
            op(bad)
    assert a.num_free_blocks == 3 and a.ref_count(0) == 1, "state unchanged after the errors"


def test_double_free_and_incref_of_a_free_block_raise():
    a = BlockAllocator(2)
    b = a.allocate()
    a.free(b)
    with pytest.raises(ValueError, match="already free"):
        a.free(b)
    with pytest.raises(ValueError, match="already free"):
        a.incref(b)
    assert a.free_queue() == [1, 0], "state unchanged after the errors"


def test_take_pulls_a_given_free_block_out_of_the_queue():
    a = BlockAllocator(4)
    a.take(2)
    assert a.ref_count(2) == 1 and a.free_queue() == [0, 1, 3]
    with pytest.raises(ValueError, match="in use"):
        a.take(2)


def test_bad_pool_size():
    with pytest.raises(ValueError, match="non-negative"):
        BlockAllocator(-1)
    assert BlockAllocator(0).num_free_blocks == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alloc", "incref", "free"]), st.integers(0, 10)), max_size=60
    )
)
def test_random_operations_keep_counts_consistent(ops):
    a = BlockAllocator(6)
    holders: dict[int, int] = {}  # model: block -> references
    for op, pick in ops:
        held = sorted(holders)
        if op == "alloc":
            if a.num_free_blocks == 0:
                with pytest.raises(NoFreeBlocksError):
                    a.allocate()
            else:
                b = a.allocate()
                assert b not in holders, "allocate returned a block in use"
                holders[b] = 1
        elif held:
            b = held[pick % len(held)]
            if op == "incref":
                a.incref(b)
                holders[b] += 1
            else:
                a.free(b)
                holders[b] -= 1
                if holders[b] == 0:
                    del holders[b]
        for b in range(6):
            assert a.ref_count(b) == holders.get(b, 0), "ref count = number of holders"
        assert a.num_free_blocks + len(holders) == 6, "free + used = total"
        assert sorted(a.free_queue()) == [b for b in range(6) if b not in holders], (
            "free queue = unheld blocks"
        )


def test_take_leaves_a_dead_entry_that_allocate_skips():
    a = BlockAllocator(4)
    a.take(0)
    a.free(0)  # 0 now has a dead entry at the front and a live one at the back
    assert a.free_queue() == [1, 2, 3, 0], "a taken then freed block queues by its latest free time"
    assert a.num_free_blocks == 4
    assert [a.allocate() for _ in range(4)] == [1, 2, 3, 0], "the dead entry of block 0 is skipped"
    with pytest.raises(NoFreeBlocksError, match="requested 1, available 0"):
        a.allocate()


def test_free_of_a_bool_id_raises_instead_of_freeing_block_1():
    a = BlockAllocator(4)
    a.allocate_many(2)
    with pytest.raises(ValueError, match="not in 0..3"):
        a.free(True)
    assert a.ref_count(1) == 1, "state unchanged after the error"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                ["alloc", "alloc_many", "take", "share", "free", "free_many", "bad_free"]
            ),
            st.integers(0, 30),
        ),
        max_size=80,
    )
)
def test_queue_order_matches_an_ordered_dict_model_with_take(ops):
    """Lazy deletion (dead entries) must give exactly the order of a queue that removes taken blocks."""
    from collections import OrderedDict

    n = 5
    a = BlockAllocator(n)
    queue: OrderedDict[int, None] = OrderedDict.fromkeys(
        range(n)
    )  # model: the free queue, front first
    refs = [0] * n
    for op, pick in ops:
        held = [b for b in range(n) if refs[b]]
        free = list(queue)
        if op == "alloc" and free:
            b = queue.popitem(last=False)[0]
            refs[b] = 1
            assert a.allocate() == b, "allocate takes the front of the queue"
        elif op == "alloc_many":
            k = pick % (n + 2)
            if k > len(free):
                with pytest.raises(NoFreeBlocksError):
                    a.allocate_many(k)
            else:
                expect = [queue.popitem(last=False)[0] for _ in range(k)]
                for b in expect:
                    refs[b] = 1
                assert a.allocate_many(k) == expect, "allocate_many takes the front k in order"
        elif op == "take" and free:
            b = free[pick % len(free)]
            del queue[b]
            refs[b] = 1
            a.take(b)
        elif op == "share":  # a prefix-cache hit: take a free block, incref a held one
            for b in [(pick + 3 * i) % n for i in range(pick % 3 + 1)]:
                if refs[b] == 0:
                    del queue[b]
                    a.take(b)
                else:
                    a.incref(b)
                refs[b] += 1
        elif op == "free" and held:
            b = held[pick % len(held)]
            refs[b] -= 1
            if refs[b] == 0:
                queue[b] = None
            a.free(b)
        elif op == "free_many" and held:
            ids = held[pick % len(held) :][::-1]
            for b in ids:
                refs[b] -= 1
                if refs[b] == 0:
                    queue[b] = None
            a.free_many(ids)
        elif op == "bad_free":
            ids = held[: pick % 3] + [
                n + pick
            ]  # valid ids, then an unknown one: nothing may change
            with pytest.raises(ValueError, match="not in"):
                a.free_many(ids)
            if (
                held and refs[held[0]] == 1
            ):  # a block listed twice with one holder: nothing may change
                with pytest.raises(ValueError, match="listed 2 times but has 1 holders"):
                    a.free_many([held[0], held[0]])
        assert a.free_queue() == list(queue), (
            "free queue order = the model's (never-used, then by free time)"
        )
        assert [a.ref_count(b) for b in range(n)] == refs, "ref counts = the model's"
        assert a.num_free_blocks == len(queue) and a.num_used_blocks == n - len(queue), (
            "free + used = total"
        )
        assert len(a._queue) <= 2 * n + 1, (
            "dead entries are compacted: the deque stays O(num_blocks)"
        )
