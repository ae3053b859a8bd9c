"""Graded: chapter 06, the CPU swap space (exercises/ex06_swap.py).

Each region is tested on its own: the learner's method goes into the learner's ``SwapSpace`` with the other
step taken from the reference (``paged.core.swap.SwapSpace``), so an unfinished ``swap_in`` never fails the
checks of ``swap_out``. The swap space is plugged into the reference block manager, which checks the GPU
side, releases the GPU blocks and forgets the copies of GPU blocks written in place. The checks are what any
correct swap space holds, with the data modelled: every block of both pools holds a list of tokens that
each copy the engine is told to make moves; after every operation of a random trace (admissions, decodes,
forks with copy-on-write, swaps out and in, frees) each sequence's table holds exactly its own tokens, each
block's reference count equals the number of tables holding it in its pool, no table holds a block twice,
and every remembered copy joins two held blocks with the same data; plus the contract's edges at every
position (the length of a table within its last block, the free CPU blocks around what a swap-out needs),
inputs left unchanged, ``None`` changing nothing, the copies a sibling reuses, the order freed CPU blocks
reach the free queue, and the scheduler swapping forked samples through the whole swap space
(a content-checked fake engine), tokens equal to the reference's.
"""

from __future__ import annotations

import itertools
import random

import pytest

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_manager import BlockSpaceManager as RefManager
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup
from paged.core.swap import SwapSpace as RefSwap
from paged_course.sim.kv_check import CheckedEngine, assert_all_free

REGION_METHODS = {"ch06.ex6": "swap_out", "ch06.ex7": "swap_in"}


def mix(ex, region):
    """The learner's ``SwapSpace`` with the method of ``region`` its own and the other step the reference's."""
    cls = ex.SwapSpace
    own = vars(cls)
    method = REGION_METHODS[region]
    assert method in own, f"SwapSpace must define {method} (the block manager calls it)"
    other = {m: getattr(RefSwap, m) for m in REGION_METHODS.values() if m != method}
    return type("LearnerSwapSpace", (cls,), other)


_ids = itertools.count(1)


def seq_of(tokens, bs):
    return Sequence(next(_ids), list(tokens), bs)


def manager(cls, bs=4, gpu=16, cpu=8, watermark=0.0):
    """The reference block manager on the swap space ``cls`` (``None``: the reference's)."""
    m = RefManager(bs, gpu, cpu, watermark)
    if cls is not None:
        m.swap = cls(bs, cpu)
    return m


class Kv:
    """The data of both pools: block -> the token each slot holds (``None``: never written)."""

    def __init__(self, m):
        self.m, self.bs = m, m.block_size
        self.gpu: dict[int, list] = {}
        self.cpu: dict[int, list] = {}

    def copy(self, pairs, src, dst):
        for a, b in pairs:
            dst[b] = list(src.get(a, [None] * self.bs))

    def grow(self, seq, n):
        """Slots for ``n`` more tokens of ``seq`` (an admission when it has none), then the step writes
        them. Returns the ``NewBlocks`` or ``None``."""
        table = self.m.block_tables.get(seq.seq_id)
        have = table.num_tokens if table else 0
        got = self.m.allocate_slots(seq, n)
        if got is not None:
            self.copy(got.copies, self.gpu, self.gpu)
            table = self.m.block_tables[seq.seq_id]
            for p in range(have, have + n):
                self.gpu.setdefault(table[p // self.bs], [None] * self.bs)[p % self.bs] = (
                    seq.token_ids[p]
                )
        return got

    def swap_out(self, seq):
        pairs = self.m.swap_out(seq)
        if pairs is not None:
            self.copy(pairs, self.gpu, self.cpu)
        return pairs

    def swap_in(self, seq):
        pairs = self.m.swap_in(seq)
        if pairs is not None:
            self.copy(pairs, self.cpu, self.gpu)
        return pairs


def state(m):
    """Everything a swap may change: both pools' tables, counts and free queues, and the maps."""
    swap, maps = m.swap, m.swap.maps
    return (
        {s: (list(t.block_ids), t.num_tokens) for s, t in m.block_tables.items()},
        {s: (list(t.block_ids), t.num_tokens) for s, t in swap.tables.items()},
        [m.gpu_allocator.ref_count(b) for b in range(m.num_gpu_blocks)],
        [swap.allocator.ref_count(b) for b in range(swap.allocator.num_blocks)],
        m.gpu_allocator.free_queue(),
        swap.allocator.free_queue(),
        dict(maps.out),
        dict(maps.in_),
    )


def _holders(tables, num_blocks, pool, where):
    owners = [0] * num_blocks
    for seq_id, table in tables.items():
        assert len(set(table.block_ids)) == len(table.block_ids), (
            f"{where}: sequence {seq_id}'s {pool} table {table.block_ids} holds a block twice"
        )
        assert len(table.block_ids) == -(-table.num_tokens // table.block_size), (
            f"{where}: sequence {seq_id}'s {pool} table: {len(table.block_ids)} blocks for "
            f"{table.num_tokens} tokens"
        )
        for b in table.block_ids:
            owners[b] += 1
    return owners


def check_invariants(m, kv, seqs, where=""):
    """Counts equal holders in both pools; tables hold their own tokens; remembered copies are valid."""
    swap = m.swap
    for pool, tables, alloc, n in (
        ("GPU", m.block_tables, m.gpu_allocator, m.num_gpu_blocks),
        ("CPU", swap.tables, swap.allocator, swap.allocator.num_blocks),
    ):
        owners = _holders(tables, n, pool, where)
        counts = [alloc.ref_count(b) for b in range(n)]
        assert counts == owners, (
            f"{where}: {pool} reference counts {counts}, but the tables hold the blocks {owners} times"
        )
        queue = alloc.free_queue()
        assert sorted(queue) == [b for b in range(n) if not owners[b]], (
            f"{where}: the {pool} free queue {queue} is not the blocks no table holds"
        )
    bs = m.block_size
    for seq in seqs:
        for pool, tables, data in (("GPU", m.block_tables, kv.gpu), ("CPU", swap.tables, kv.cpu)):
            table = tables.get(seq.seq_id)
            if table is None:
                continue
            got = [data.get(table[p // bs], [None] * bs)[p % bs] for p in range(table.num_tokens)]
            assert got == seq.token_ids[: table.num_tokens], (
                f"{where}: sequence {seq.seq_id} on the {pool} (table {table.block_ids}) holds the tokens "
                f"{got}, expected its own {seq.token_ids[: table.num_tokens]}"
            )
    maps = swap.maps
    for name, mapping, src, dst in (
        ("out", maps.out, (m.gpu_allocator, kv.gpu), (swap.allocator, kv.cpu)),
        ("in_", maps.in_, (swap.allocator, kv.cpu), (m.gpu_allocator, kv.gpu)),
    ):
        for a, b in mapping.items():
            assert src[0].ref_count(a) and dst[0].ref_count(b), (
                f"{where}: maps.{name} remembers {a} -> {b}, but a block of the pair is free"
            )
            assert src[1].get(a) == dst[1].get(b), (
                f"{where}: maps.{name} remembers {a} -> {b} as a copy, but they hold different data "
                f"({src[1].get(a)} and {dst[1].get(b)})"
            )
    assert {c: g for g, c in maps.out.items()} == maps._out_by_cpu, (
        f"{where}: maps.out and its inverse disagree: record copies with maps.remember"
    )
    assert {g: c for c, g in maps.in_.items()} == maps._in_by_gpu, (
        f"{where}: maps.in_ and its inverse disagree: record copies with maps.remember"
    )


def trace(cls, seed, bs=4, gpu=24, cpu=8, ops=200):
    """A random trace through the reference manager on swap space ``cls``; the invariants after each
    operation. Returns counts of what happened."""
    rng = random.Random(seed)
    m = manager(cls, bs, gpu, cpu)
    kv = Kv(m)
    on_gpu: list[Sequence] = []
    swapped: list[Sequence] = []
    seen = dict.fromkeys(("out", "out_none", "out_reused", "in", "in_reused", "copies"), 0)
    for op in range(ops):
        kind, where = rng.random(), f"seed {seed}, block size {bs}, operation {op}"
        if kind < 0.15 or not (on_gpu or swapped):
            seq = seq_of([rng.randrange(1, 50) for _ in range(rng.randrange(1, 3 * bs))], bs)
            if kv.grow(seq, len(seq)) is not None:
                on_gpu.append(seq)
        elif kind < 0.4 and on_gpu:
            seq = rng.choice(on_gpu)
            if m.block_tables[seq.seq_id].num_tokens == len(seq):
                seq.append_token_id(rng.randrange(1, 50))
            got = kv.grow(seq, 1)
            seen["copies"] += bool(got and got.copies)
        elif kind < 0.6 and on_gpu:
            seq = rng.choice(on_gpu)
            if m.block_tables[seq.seq_id].num_tokens == len(seq):
                child = seq.fork(next(_ids))
                m.fork(seq, child)
                on_gpu.append(child)
        elif kind < 0.78 and on_gpu:
            seq = rng.choice(on_gpu)
            gpu_ids = set(m.block_tables[seq.seq_id].block_ids)
            family = [seq] + [  # with its siblings sharing GPU blocks, half the time
                s
                for s in on_gpu
                if s is not seq and gpu_ids & set(m.block_tables[s.seq_id]) and rng.random() < 0.5
            ]
            for seq in family:
                table = list(m.block_tables[seq.seq_id].block_ids)
                num_tokens = m.block_tables[seq.seq_id].num_tokens
                before = state(m)
                pairs = kv.swap_out(seq)
                if pairs is None:
                    seen["out_none"] += 1
                    assert state(m) == before, (
                        f"{where}: a swap-out that returned None changed the state"
                    )
                    break
                seen["out"] += 1
                seen["out_reused"] += len(pairs) < len(table)
                on_gpu.remove(seq)
                swapped.append(seq)
                cpu_table = m.swap.tables[seq.seq_id]
                assert cpu_table.num_tokens == num_tokens, (
                    f"{where}: the CPU table holds {cpu_table.num_tokens} tokens, the GPU one {num_tokens}"
                )
                assert [g for g, _ in pairs] == [g for g in table if g in dict(pairs)], (
                    f"{where}: swap-out pairs {pairs} are not in table order"
                )
                check_invariants(m, kv, on_gpu + swapped, where)
        elif kind < 0.92 and swapped:
            seq = rng.choice(swapped)
            cpu_ids = set(m.swap.tables[seq.seq_id].block_ids)
            family = [seq] + [  # its siblings sharing CPU blocks come back with it
                s for s in swapped if s is not seq and cpu_ids & set(m.swap.tables[s.seq_id])
            ]
            for seq in family:
                cpu_blocks = len(m.swap.tables[seq.seq_id])
                pairs = kv.swap_in(seq)
                if pairs is None:
                    break
                seen["in"] += 1
                seen["in_reused"] += len(pairs) < cpu_blocks
                swapped.remove(seq)
                on_gpu.append(seq)
                check_invariants(m, kv, on_gpu + swapped, where)
        else:
            pool = on_gpu if (rng.random() < 0.6 and on_gpu) or not swapped else swapped
            seq = pool.pop(rng.randrange(len(pool)))
            m.free(seq)
        check_invariants(m, kv, on_gpu + swapped, where)
    for seq in on_gpu + swapped:
        m.free(seq)
    check_invariants(m, kv, [], "after freeing everything")
    assert m.get_num_free_gpu_blocks() == gpu and m.get_num_free_cpu_blocks() == cpu, (
        "every block of both pools is free at the end"
    )
    assert not m.swap.maps, "no copy is remembered once every block is free"
    return seen


def forks(m, kv, bs, shared_tokens, private_tokens=0):
    """A parent of ``shared_tokens`` tokens and a child forked from it; with ``private_tokens`` > 0 the
    child decodes that many more (its own blocks, a copy-on-write when the shared last block is partial)."""
    parent = seq_of([(7 * i) % 31 + 1 for i in range(shared_tokens)], bs)
    kv.grow(parent, len(parent))
    child = parent.fork(next(_ids))
    m.fork(parent, child)
    for i in range(private_tokens):
        child.append_token_id(40 + i)
        kv.grow(child, 1)
    return parent, child


# ================================================================ ch06.ex6: swap out
@pytest.mark.exercise("ch06.ex6", points=1)
@pytest.mark.parametrize("bs", [1, 4])
def test_swap_out_copies_each_block_to_a_fresh_cpu_block_at_every_length(impl, bs):
    cls = mix(impl("ex06_swap"), "ch06.ex6")
    for length in range(1, 3 * bs + 2):
        m = manager(cls, bs, 16, 8)
        kv = Kv(m)
        filler = seq_of(
            [99] * bs, bs
        )  # so the sequence's GPU ids do not start at 0 like the CPU ids
        kv.grow(filler, bs)
        seq = seq_of(list(range(1, length + 1)), bs)
        kv.grow(seq, length)
        table = m.block_tables[seq.seq_id]
        gpu_ids, num_tokens = list(table.block_ids), table.num_tokens
        pairs = m.swap.swap_out(seq.seq_id, table)
        where = f"a {length}-token sequence, blocks of {bs}"
        assert pairs is not None, f"{where}: the CPU pool has room, yet swap_out returned None"
        cpu_table = m.swap.tables.get(seq.seq_id)
        assert cpu_table is not None, f"{where}: no CPU table recorded in self.tables"
        assert (table.block_ids, table.num_tokens) == (gpu_ids, num_tokens), (
            f"{where}: swap_out changed the GPU table it was given"
        )
        assert [g for g, _ in pairs] == gpu_ids, (
            f"{where}: pairs {pairs}: every GPU block once, in table order, expected {gpu_ids}"
        )
        assert [c for _, c in pairs] == cpu_table.block_ids, (
            f"{where}: the pairs' CPU blocks {[c for _, c in pairs]} are not the CPU table's "
            f"{cpu_table.block_ids}"
        )
        assert cpu_table.num_tokens == length, (
            f"{where}: the CPU table holds {cpu_table.num_tokens} tokens, expected {length}"
        )
        assert m.get_num_free_cpu_blocks() == 8 - len(gpu_ids), (
            f"{where}: {8 - m.get_num_free_cpu_blocks()} CPU blocks in use, expected {len(gpu_ids)}"
        )
        assert m.gpu_allocator.num_free_blocks == 16 - 1 - len(gpu_ids), (
            f"{where}: swap_out changed the GPU pool (the block manager releases it)"
        )
        assert dict(m.swap.maps.out) == dict(pairs), (
            f"{where}: maps.out {m.swap.maps.out}: each copy made must be remembered, {dict(pairs)}"
        )


@pytest.mark.exercise("ch06.ex6", points=1)
@pytest.mark.parametrize("bs", [2, 4])
def test_swap_out_refuses_when_the_cpu_pool_is_short_and_changes_nothing(impl, bs):
    """Free CPU blocks at every distance from what the swap-out needs, without and with a sibling's
    copies to reuse (a reused copy costs no free block)."""
    cls = mix(impl("ex06_swap"), "ch06.ex6")
    seen = set()
    for sibling_first in (False, True):
        for free in range(0, 6):
            m = manager(cls, bs, 20, 8)
            kv = Kv(m)
            parent, child = forks(m, kv, bs, 2 * bs + 1, bs + 1)  # shares 2 full blocks, 2 private
            if sibling_first:
                # copies the 2 shared blocks and its last one
                assert kv.swap_out(parent) is not None, (
                    f"block size {bs}: the parent (3 blocks) swaps out to 8 free CPU blocks"
                )
            used = 8 - m.get_num_free_cpu_blocks()
            blocker = seq_of([5] * (8 - used - free) * bs, bs)
            if 8 - used - free:
                kv.grow(blocker, len(blocker))
                # takes CPU blocks: `free` are left
                assert kv.swap_out(blocker) is not None, (
                    f"block size {bs}: a sequence of {len(blocker)} tokens swaps out to the "
                    f"{8 - used} free CPU blocks"
                )
            needed = len(m.block_tables[child.seq_id]) - (2 if sibling_first else 0)
            before = state(m)
            pairs = kv.swap_out(child)
            fits = free >= needed
            seen.add(fits)
            where = f"{free} free CPU blocks, {needed} fresh copies needed" + (
                " (2 shared blocks copied by a sibling before)" if sibling_first else ""
            )
            assert (pairs is not None) == fits, (
                f"{where}: swap_out {'returned None' if pairs is None else 'swapped out'}; expected "
                f"{'pairs' if fits else 'None'}"
            )
            if pairs is None:
                assert state(m) == before, (
                    f"{where}: a swap-out that returned None changed the state"
                )
            check_invariants(m, kv, [parent, child, blocker], where)
    assert seen == {True, False}, "the trial must cross the CPU pool's limit"


@pytest.mark.exercise("ch06.ex6", points=1)
@pytest.mark.parametrize("bs", [1, 3, 4])
def test_swap_out_of_a_fork_reuses_the_copies_of_shared_blocks(impl, bs):
    cls = mix(impl("ex06_swap"), "ch06.ex6")
    for shared in range(1, 2 * bs + 2):  # the shared last block filled to every position
        m = manager(cls, bs, 20, 10)
        kv = Kv(m)
        parent, child = forks(m, kv, bs, shared, 2)
        where = f"a fork sharing {shared} tokens, blocks of {bs}"
        p_gpu = list(m.block_tables[parent.seq_id].block_ids)
        c_gpu = list(m.block_tables[child.seq_id].block_ids)
        first = kv.swap_out(parent)
        assert first is not None and [g for g, _ in first] == p_gpu, (
            f"{where}: the first sibling out copies each of its blocks, got {first}"
        )
        free = m.get_num_free_cpu_blocks()
        second = kv.swap_out(child)
        fresh = [g for g in c_gpu if g not in p_gpu]
        assert second is not None and [g for g, _ in second] == fresh, (
            f"{where}: the second sibling out copies only the blocks the first did not copy "
            f"({fresh}), got {second}"
        )
        assert free - m.get_num_free_cpu_blocks() == len(fresh), (
            f"{where}: the second swap-out took {free - m.get_num_free_cpu_blocks()} CPU blocks, "
            f"expected {len(fresh)}"
        )
        p_cpu, c_cpu = m.swap.tables[parent.seq_id], m.swap.tables[child.seq_id]
        for i, g in enumerate(c_gpu):
            if g in p_gpu:
                same = p_cpu[p_gpu.index(g)]
                assert c_cpu[i] == same, (
                    f"{where}: shared GPU block {g}: the child's CPU block {c_cpu[i]} should reuse the "
                    f"parent's copy {same}"
                )
                assert m.swap.allocator.ref_count(same) == 2, (
                    f"{where}: CPU block {same} is held by both siblings: count "
                    f"{m.swap.allocator.ref_count(same)}, expected 2"
                )
        check_invariants(m, kv, [parent, child], where)


@pytest.mark.exercise("ch06.ex6", points=1)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swap_out_holds_the_invariants_on_a_random_trace(impl, seed):
    cls = mix(impl("ex06_swap"), "ch06.ex6")
    seen = trace(cls, seed, bs=[4, 2, 3][seed])
    assert seen["out"] > 5 and seen["out_none"] > 0 and seen["out_reused"] > 0, seen


# ================================================================ ch06.ex7: swap in
@pytest.mark.exercise("ch06.ex7", points=1)
@pytest.mark.parametrize("bs", [1, 4])
def test_swap_in_copies_each_block_back_and_frees_the_cpu_tail_first(impl, bs):
    cls = mix(impl("ex06_swap"), "ch06.ex7")
    for length in range(1, 3 * bs + 2):
        m = manager(cls, bs, 16, 8)
        kv = Kv(m)
        seq = seq_of(list(range(1, length + 1)), bs)
        kv.grow(seq, length)
        kv.swap_out(seq)
        cpu_table = m.swap.tables[seq.seq_id]
        cpu_ids, queue = list(cpu_table.block_ids), m.swap.allocator.free_queue()
        filler = seq_of([99] * bs, bs)  # GPU ids on the way back differ from those it had
        kv.grow(filler, bs)
        handed = m.gpu_allocator.free_queue()[: len(cpu_ids)]
        where = f"a {length}-token sequence, blocks of {bs}"
        pairs, table = m.swap.swap_in(seq.seq_id, m.gpu_allocator, m.gpu_allocator.allocate)
        assert [c for c, _ in pairs] == cpu_ids and [g for _, g in pairs] == table.block_ids, (
            f"{where}: pairs {pairs}: each CPU block {cpu_ids} once, in table order, to the GPU table's "
            f"block {table.block_ids}"
        )
        assert table.block_ids == handed, (
            f"{where}: GPU table {table.block_ids}: fresh blocks come from allocate_gpu, expected {handed}"
        )
        assert table.num_tokens == length, (
            f"{where}: the GPU table holds {table.num_tokens} tokens, expected {length}"
        )
        assert seq.seq_id not in m.swap.tables, f"{where}: the CPU table is still in self.tables"
        want = queue + cpu_ids[::-1]
        assert m.swap.allocator.free_queue() == want, (
            f"{where}: CPU free queue {m.swap.allocator.free_queue()}, expected {want} (every CPU block "
            "freed, the table's tail first)"
        )
        assert not m.swap.maps.in_, (
            f"{where}: maps.in_ {m.swap.maps.in_} remembers copies of CPU blocks that are free now"
        )
        m.block_tables[seq.seq_id] = table
        kv.copy(pairs, kv.cpu, kv.gpu)
        check_invariants(m, kv, [seq, filler], where)


@pytest.mark.exercise("ch06.ex7", points=1)
@pytest.mark.parametrize("bs", [1, 3, 4])
def test_swap_in_of_a_fork_reuses_the_copy_a_sibling_brought_back(impl, bs):
    cls = mix(impl("ex06_swap"), "ch06.ex7")
    for shared in range(1, 2 * bs + 2):
        m = manager(cls, bs, 20, 10)
        kv = Kv(m)
        parent, child = forks(m, kv, bs, shared, 2)
        where = f"a fork sharing {shared} tokens, blocks of {bs}"
        kv.swap_out(parent)
        kv.swap_out(child)
        p_cpu = list(m.swap.tables[parent.seq_id].block_ids)
        c_cpu = list(m.swap.tables[child.seq_id].block_ids)
        first = kv.swap_in(parent)
        assert first is not None and [c for c, _ in first] == p_cpu, (
            f"{where}: the first sibling back copies each of its blocks, got {first}"
        )
        for c in p_cpu:
            held = 1 if c in c_cpu else 0
            assert m.swap.allocator.ref_count(c) == held, (
                f"{where}: after the parent's swap-in CPU block {c} has count "
                f"{m.swap.allocator.ref_count(c)}, expected {held}"
            )
        check_invariants(m, kv, [parent, child], where + ", parent back")
        free = m.get_num_free_gpu_blocks()
        second = kv.swap_in(child)
        fresh = [c for c in c_cpu if c not in p_cpu]
        assert second is not None and [c for c, _ in second] == fresh, (
            f"{where}: the second sibling back copies only what the first did not bring back "
            f"({fresh}), got {second}"
        )
        assert free - m.get_num_free_gpu_blocks() == len(fresh), (
            f"{where}: the second swap-in took {free - m.get_num_free_gpu_blocks()} GPU blocks, "
            f"expected {len(fresh)}"
        )
        p_gpu, c_gpu = m.block_tables[parent.seq_id], m.block_tables[child.seq_id]
        shared_gpu = [g for g in c_gpu if g in p_gpu.block_ids]
        assert len(shared_gpu) == len(c_cpu) - len(fresh), (
            f"{where}: the siblings share {shared_gpu} on the GPU again, expected "
            f"{len(c_cpu) - len(fresh)} blocks"
        )
        check_invariants(m, kv, [parent, child], where + ", both back")
        assert m.get_num_free_cpu_blocks() == 10 and not m.swap.maps.in_, (
            f"{where}: every CPU block is free and no copy back is remembered"
        )


@pytest.mark.exercise("ch06.ex7", points=1)
@pytest.mark.parametrize("bs", [2, 4])
def test_swap_in_forgets_the_copies_of_cpu_blocks_it_frees(impl, bs):
    """A sequence swapped out and back leaves its CPU blocks free; the next sequence swapped out gets
    them with other data. A remembered copy of the old data would bring the wrong tokens back."""
    cls = mix(impl("ex06_swap"), "ch06.ex7")
    for length in range(1, 2 * bs + 1):
        m = manager(cls, bs, 16, 4)
        kv = Kv(m)
        a = seq_of([3] * length, bs)
        kv.grow(a, length)
        kv.swap_out(a)
        kv.swap_in(a)  # a's CPU blocks are free again
        b = seq_of([8] * length, bs)
        kv.grow(b, length)
        kv.swap_out(b)  # b gets the CPU blocks a had
        where = f"{length}-token sequences, blocks of {bs}"
        before = len(m.swap.tables[b.seq_id])
        pairs = kv.swap_in(b)
        assert pairs is not None and len(pairs) == before, (
            f"{where}: the second sequence's swap-in must copy its {before} CPU blocks, got {pairs} "
            "(a copy remembered from the first sequence's swap-in is stale)"
        )
        check_invariants(m, kv, [a, b], where)


@pytest.mark.exercise("ch06.ex7", points=1)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_swap_in_holds_the_invariants_on_a_random_trace(impl, seed):
    cls = mix(impl("ex06_swap"), "ch06.ex7")
    seen = trace(cls, seed, bs=[4, 2, 3][seed])
    assert seen["in"] > 5 and seen["in_reused"] > 0, seen


def scheduler_run(swap_cls, seed, bs=4, num_blocks=12, num_cpu_blocks=12):
    """Requests with n = 2 samples preempted by swap through the scheduler and a content-checked fake
    engine. Returns the tokens and the swap counts."""
    rng = random.Random(seed)
    m = manager(swap_cls, bs, num_blocks, num_cpu_blocks, 0.0)
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=6, max_model_len=48, max_num_batched_tokens=16, preemption_mode="swap"
        ),
        CacheConfig(block_size=bs, num_gpu_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks),
        m,
    )
    engine = CheckedEngine(sched)
    groups, ids = [], itertools.count()
    for r in range(6):
        prompt = [rng.randrange(1, 90) for _ in range(rng.randrange(3, 10))]
        group = SequenceGroup(
            f"r{r}",
            [Sequence(next(ids), prompt, bs)],
            SamplingParams(n=2 if r % 2 == 0 else 1, max_tokens=rng.randrange(8, 16)),
        )
        sched.add_request(group)
        groups.append(group)
    engine.run(max_steps=400)
    assert_all_free(sched)
    assert not m.swap.maps, "no copy is remembered once every block is free"
    tokens = [[s.output_token_ids for s in g.seqs] for g in groups]
    return tokens, sched.num_swap_outs, sched.num_swap_ins


@pytest.mark.exercise("ch06.ex7", points=1, uses=("ch06.ex6",))
@pytest.mark.parametrize("seed", [0, 1])
def test_your_swap_space_swaps_forks_in_the_scheduler_like_the_reference(impl, seed):
    cls = impl("ex06_swap").SwapSpace
    want = scheduler_run(RefSwap, seed)
    got = scheduler_run(cls, seed)
    assert got == want, "your swap space: the same tokens and swaps as the reference's"
    assert want[1] > 0 and want[2] > 0, "the run must swap out and in"
