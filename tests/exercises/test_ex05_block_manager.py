"""Graded: chapter 05, the block manager the engine runs (exercises/ex05_block_manager.py).

Each region is tested on its own: the learner's method is put into a subclass of the reference
``paged.core.block_manager.BlockSpaceManager`` (same tables, allocator and prefix cache), so one
unfinished step never fails the checks of another. The checks are invariants any correct manager holds,
not a replay of the reference: after every operation of a random trace each block's reference count
equals the number of tables holding it, no table holds a block twice or shares one with the free queue,
an admission leaves the watermark free, a ``None`` changes nothing (tables, counts, free queue, cache
entries, hit counters, the sequence's fields); plus the contract's edges tried at every position (the
length of a prompt within its last block, the fill of a shared last block, the free blocks around the
watermark), inputs left unchanged, one prefix lookup per admission, the cost of each verb on a pool of
400,000 blocks, and the whole manager in the scheduler (a content-checked fake engine), tokens equal to the
reference manager's. The real engine on the tiny model runs on your manager in the capstone's checks
(``test_ex07_capstone.py``, ch07.ex1): seconds of model code that a check cell here should not wait for.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_manager import BlockSpaceManager as RefManager
from paged.core.prefix_cache import PrefixCache
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup
from paged_course.sim.kv_check import CheckedEngine, assert_all_free

GIVEN = ("allocate_slots", "forget_swap_copies")  # the file's given methods, used by the regions
REGION_METHODS = {
    "ch05.ex7": ("get_computed_blocks",),
    "ch05.ex8": ("_admit",),
    "ch05.ex9": ("_grow",),
    "ch05.ex10": ("free",),
}


def mix(ex, region):
    """The reference manager with the learner's methods of ``region`` (and the file's given ones)."""
    own = vars(ex.BlockSpaceManager)
    methods = REGION_METHODS[region] + GIVEN
    missing = [m for m in methods if m not in own]
    assert not missing, f"BlockSpaceManager must define {', '.join(missing)} (the engine calls it)"
    return type("LearnerBlockManager", (RefManager,), {m: own[m] for m in methods})


class CountingCache(PrefixCache):
    """The reference prefix cache, counting lookups."""

    lookups = 0

    def lookup(self, seq, max_blocks):
        self.lookups += 1
        return super().lookup(seq, max_blocks)


_ids = itertools.count(1)


def seq_of(tokens, bs):
    return Sequence(next(_ids), list(tokens), bs)


def manager(cls, bs=4, blocks=16, watermark=0.0, caching=True, cpu=0, **kw):
    return cls(
        bs,
        blocks,
        cpu,
        watermark,
        caching,
        prefix_cache_cls=kw.pop("prefix_cache_cls", CountingCache),
        **kw,
    )


def state(m, seqs=()):
    """Everything a call may change: tables, counts, free queue, cache entries, hit counters, sequences."""
    cache = m.prefix_cache
    return (
        {s: (list(t.block_ids), t.num_tokens) for s, t in m.block_tables.items()},
        [m.gpu_allocator.ref_count(b) for b in range(m.num_gpu_blocks)],
        m.gpu_allocator.free_queue(),
        None if cache is None else sorted(cache._by_block),
        None if cache is None else (cache.queried_tokens, cache.hit_tokens),
        [(s.num_cached_tokens, s.num_computed_tokens, list(s.token_ids)) for s in seqs],
        {s: list(t.block_ids) for s, t in m.swap.tables.items()},
    )


def check_invariants(m, where=""):
    """Counts equal owners; no block twice in a table; held blocks are not in the free queue."""
    owners = [0] * m.num_gpu_blocks
    for seq_id, table in m.block_tables.items():
        assert len(set(table.block_ids)) == len(table.block_ids), (
            f"{where}: sequence {seq_id}'s table {table.block_ids} holds a block twice"
        )
        assert len(table.block_ids) == -(-table.num_tokens // m.block_size), (
            f"{where}: sequence {seq_id}: {len(table.block_ids)} blocks for {table.num_tokens} tokens"
        )
        for b in table.block_ids:
            owners[b] += 1
    counts = [m.gpu_allocator.ref_count(b) for b in range(m.num_gpu_blocks)]
    assert counts == owners, (
        f"{where}: reference counts {counts}, but the tables hold the blocks {owners} times"
    )
    queue = m.gpu_allocator.free_queue()
    assert not [b for b in queue if owners[b]], f"{where}: a held block is in the free queue"
    assert len(queue) == owners.count(0), f"{where}: a block no table holds is not free"


def trace(cls, seed, bs=4, blocks=24, watermark=0.1, ops=150, check=None):
    """A random trace (admissions in chunks with shared heads, decodes, forks, frees) through ``cls``;
    ``check(m, live, where)`` after each operation. Returns counts of what happened."""
    rng = random.Random(seed)
    m = manager(cls, bs, blocks, watermark)
    stems = [[rng.randrange(1, 6) for _ in range(5 * bs)] for _ in range(3)]
    live: list[Sequence] = []
    seen = {"admitted": 0, "refused": 0, "hits": 0, "copies": 0, "grow_none": 0, "freed": 0}
    for op in range(ops):
        kind, where = rng.random(), f"seed {seed}, block size {bs}, operation {op}"
        before = None
        if kind < 0.35 or not live:
            prompt = rng.choice(stems)[: rng.randrange(1, 4 * bs)] + [rng.randrange(1, 6)] * (
                rng.randrange(3)
            )
            seq = seq_of(prompt, bs)
            computed = m.get_computed_blocks(seq)
            given = list(computed)
            first = rng.randrange(1, len(seq) - len(computed) * bs + 1)
            before = state(m, [seq])
            got = m.allocate_slots(seq, first, computed)
            assert computed == given, f"{where}: allocate_slots changed the computed list"
            if got is None:
                seen["refused"] += 1
                assert state(m, [seq]) == before, f"{where}: a refused admission changed the state"
            else:
                seen["admitted"] += 1
                seen["hits"] += bool(computed)
                live.append(seq)
                assert m.get_num_free_gpu_blocks() >= m.watermark_blocks, (
                    f"{where}: the admission left fewer than the watermark's blocks free"
                )
        elif kind < 0.75:
            seq = rng.choice(live)
            table = m.block_tables[seq.seq_id]
            if table.num_tokens == len(seq):
                seq.append_token_id(rng.randrange(1, 6))
            n = rng.randrange(1, len(seq) - table.num_tokens + 1)
            before = state(m, live)
            got = m.allocate_slots(seq, n)
            if got is None:
                seen["grow_none"] += 1
                assert state(m, live) == before, f"{where}: a refused growth changed the state"
            else:
                seen["copies"] += len(got.copies)
        elif kind < 0.85:
            seq = rng.choice(live)
            if m.block_tables[seq.seq_id].num_tokens == len(seq):
                child = seq.fork(next(_ids))
                m.fork(seq, child)
                live.append(child)
        else:
            seq = live.pop(rng.randrange(len(live)))
            m.free(seq)
            seen["freed"] += 1
        check_invariants(m, where)
        if check:
            check(m, live, where)
    for seq in live:
        m.free(seq)
    check_invariants(m, "after freeing everything")
    assert m.get_num_free_gpu_blocks() == blocks, "every block is free at the end"
    return seen


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


BIG = 400_000  # blocks: a verb that scans the pool costs seconds here


# ================================================================ ch05.ex7: computed blocks
@pytest.mark.exercise("ch05.ex7", points=2)
@pytest.mark.parametrize("bs", [1, 4])
def test_computed_blocks_leave_the_last_token_at_every_length(impl, bs):
    cls = mix(impl("ex05_block_manager"), "ch05.ex7")
    m = manager(cls, bs, 32)
    prompt = [7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5][: 3 * bs + 1]
    owner = seq_of(prompt, bs)
    m.allocate_slots(owner)  # caches its full blocks
    blocks = m.get_block_table(owner)
    for length in range(1, len(prompt) + 1):
        seq = seq_of(prompt[:length], bs)
        got = m.get_computed_blocks(seq)
        want = blocks[: (length - 1) // bs]
        assert got == want, (
            f"a {length}-token prompt (blocks of {bs}) whose full blocks are cached: computed {got}, "
            f"expected {want} (every full block before the last token)"
        )
        grown = seq_of(prompt[:1], bs)  # a preempted sequence admitted again: most tokens generated
        for token in prompt[1:length]:
            grown.append_token_id(token)
        got = m.get_computed_blocks(grown)
        assert got == want, (
            f"a 1-token prompt that generated {length - 1} more (blocks of {bs}), its full blocks cached: "
            f"computed {got}, expected {want} (generated tokens are cached like the prompt's)"
        )
    assert manager(cls, bs, 8, caching=False).get_computed_blocks(seq_of(prompt, bs)) == [], (
        "prefix caching off: no computed blocks"
    )


@pytest.mark.exercise("ch05.ex7", points=2)
def test_computed_blocks_is_one_pure_lookup(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex7")
    bs = 4
    m = manager(cls, bs, 16)
    prompt = list(range(1, 12))
    first = seq_of(prompt, bs)
    m.allocate_slots(first)
    m.free(first)  # its blocks are free and still cached
    seq = seq_of(prompt + [3], bs)
    before, lookups = state(m, [seq]), m.prefix_cache.lookups
    got = m.get_computed_blocks(seq)
    assert m.prefix_cache.lookups - lookups == 1, (
        f"get_computed_blocks made {m.prefix_cache.lookups - lookups} prefix-cache lookups, expected one"
    )
    assert len(got) == 2, (
        f"tokens 1..11 then 3 (12 tokens, blocks of {bs}): its first 2 blocks are cached, so 2 computed "
        f"blocks; got {got}"
    )
    assert state(m, [seq]) == before, (
        "get_computed_blocks changed the manager, the cache (its hit counters included) or the sequence"
    )
    whole = seq_of(prompt[: 2 * bs], bs)  # every full block is cached: only the cap trims
    lookups = m.prefix_cache.lookups
    assert m.get_computed_blocks(whole) == got[:1], (
        f"a prompt cached in full ({2 * bs} tokens, blocks of {bs}): its last token must be computed, so "
        "only its first block counts as computed"
    )
    assert m.prefix_cache.lookups - lookups == 1, (
        "a prompt cached in full: still one lookup (its cap leaves the last token out)"
    )


# ================================================================ ch05.ex8: admission
@pytest.mark.exercise("ch05.ex8", points=2)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_admission_holds_the_invariants_on_a_random_trace(impl, seed):
    cls = mix(impl("ex05_block_manager"), "ch05.ex8")
    seen = trace(cls, seed, bs=[4, 2, 3][seed], blocks=20)
    assert seen["admitted"] > 10 and seen["refused"] > 0 and seen["hits"] > 0, seen


@pytest.mark.exercise("ch05.ex8", points=2)
@pytest.mark.parametrize("idle_hits", [0, 1, 2])
def test_admission_watermark_counts_free_cached_hits(impl, idle_hits):
    """A hit that sits in the free queue leaves it: it costs the admission a free block. Tried with the
    free blocks at every distance from the watermark."""
    cls = mix(impl("ex05_block_manager"), "ch05.ex8")
    bs, blocks = 4, 20
    head = list(range(1, 4 * bs + 1))
    seen = set()
    for fill in range(0, 14):
        m = manager(cls, bs, blocks)
        cached = seq_of(head, bs)
        m.allocate_slots(cached)  # 4 blocks, all cached
        busy = seq_of([99] * bs * fill, bs) if fill else None
        if busy:
            m.allocate_slots(busy)  # fill blocks in use
        keep = seq_of(head[: (2 - idle_hits) * bs] + [50], bs) if idle_hits < 2 else None
        if keep:
            m.allocate_slots(keep)  # holds the first 2 - idle_hits head blocks
        m.free(cached)  # idle_hits of the two shared head blocks are now free (and cached)
        m.watermark_blocks = (
            4  # the set-up ignored it; the admission under test keeps 4 blocks free
        )
        seq = seq_of(head[: 2 * bs] + [60] * (2 * bs + 1), bs)  # hits 2 blocks, needs 3 fresh
        computed = m.get_computed_blocks(seq)
        assert len(computed) == 2, f"set-up ({fill} busy blocks): the prompt hits its 2 head blocks"
        free = m.get_num_free_gpu_blocks()
        fits = free - 3 - idle_hits >= m.watermark_blocks
        seen.add(fits)
        before = state(m, [seq])
        got = m.allocate_slots(seq, None, computed)
        where = f"{free} free blocks, watermark {m.watermark_blocks}, {idle_hits} of 2 hits free"
        assert (got is not None) == fits, (
            f"{where}: admission needing 3 fresh blocks {'refused' if got is None else 'granted'}; "
            f"expected it {'granted' if fits else 'refused'}"
        )
        if got is None:
            assert state(m, [seq]) == before, f"{where}: a refused admission changed the state"
        else:
            check_invariants(m, where)
            assert m.get_num_free_gpu_blocks() >= m.watermark_blocks, (
                f"{where}: the admission left {m.get_num_free_gpu_blocks()} free blocks, below the "
                "watermark (a free cached hit it takes costs a free block too)"
            )
    assert seen == {True, False}, "the trial must cross the watermark"


@pytest.mark.exercise("ch05.ex8", points=2)
@pytest.mark.parametrize("bs", [1, 4])
def test_admission_shares_hits_and_never_hands_one_out_fresh(impl, bs):
    cls = mix(impl("ex05_block_manager"), "ch05.ex8")
    prompt = [5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4][: 3 * bs]
    for tail in range(1, bs + 2):  # the new prompt ends at every position of its last block
        m = manager(cls, bs, 8)
        first = seq_of(prompt, bs)
        m.allocate_slots(first)
        m.free(first)  # its blocks go to the back of the free queue, cached, tail first
        filler = seq_of([77] * (m.get_num_free_gpu_blocks() - 3) * bs, bs)
        m.allocate_slots(filler)  # only the three cached blocks stay free: they are the front
        m.free(filler)  # now the cached blocks are at the front of the queue
        seq = seq_of(prompt + [11] * tail, bs)
        computed = m.get_computed_blocks(seq)
        given = list(computed)
        got = m.allocate_slots(seq, None, computed)
        where = f"block size {bs}, prompt of {len(seq)} tokens"
        assert got is not None, f"{where}: the admission fits"
        assert computed == given, f"{where}: the computed list was changed"
        table = m.get_block_table(seq)
        assert table[: len(computed)] == computed, f"{where}: the table starts with the hits"
        assert got.block_ids == table, f"{where}: NewBlocks holds the whole new table at admission"
        assert seq.num_cached_tokens == seq.num_computed_tokens == len(computed) * bs, (
            f"{where}: num_cached_tokens / num_computed_tokens are the shared tokens"
        )
        check_invariants(m, where)


@pytest.mark.exercise("ch05.ex8", points=2)
def test_admission_looks_up_once_and_forgets_reused_blocks(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex8")
    bs = 4
    m = manager(cls, bs, 6)
    old = seq_of(list(range(1, 4 * bs + 1)), bs)
    m.allocate_slots(old)
    old_blocks = m.get_block_table(old)
    m.free(old)  # 4 cached free blocks behind 2 never-used ones
    lookups = m.prefix_cache.lookups
    seq = seq_of([40] * (4 * bs), bs)  # no hit; takes 4 blocks, two of them cached ones
    m.allocate_slots(seq, None, m.get_computed_blocks(seq))
    assert m.prefix_cache.lookups - lookups == 1, (
        "one prefix lookup per admission: allocate_slots uses the computed blocks it is given"
    )
    again = seq_of(list(range(1, 4 * bs + 1)) + [1], bs)
    assert m.get_computed_blocks(again) == old_blocks[:2], (
        "the two cached blocks the admission took for new data must stop answering lookups"
    )
    lookups = m.prefix_cache.lookups
    other = seq_of([41] * (bs + 1), bs)
    m.allocate_slots(other)
    assert m.prefix_cache.lookups - lookups == 1, "without computed blocks, admission looks up once"
    m.free(other)
    hits = m.prefix_cache.queried_tokens, m.prefix_cache.hit_tokens
    third = seq_of([40] * (2 * bs) + [1], bs)
    m.allocate_slots(third)
    assert (m.prefix_cache.queried_tokens, m.prefix_cache.hit_tokens) == (
        hits[0] + len(third),
        hits[1] + 2 * bs,
    ), "the hit counters record the prompt's tokens queried and the shared tokens hit"


@pytest.mark.exercise("ch05.ex8", points=1)
def test_admission_refuses_a_swapped_out_sequence(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex8")
    m = manager(cls, 4, 8, cpu=8)
    seq = seq_of(list(range(9)), 4)
    m.allocate_slots(seq)
    m.swap_out(seq)
    before = state(m, [seq])
    with pytest.raises(ValueError):
        m.allocate_slots(seq)
    assert state(m, [seq]) == before, (
        "admitting a swapped-out sequence raises ValueError and changes nothing (no block, no hit)"
    )


@pytest.mark.exercise("ch05.ex8", points=2)
def test_admission_costs_the_blocks_it_touches(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex8")
    bs = 2
    m = manager(cls, bs, BIG, watermark=0.01)
    head = list(range(1, 8 * bs + 1))
    owner = seq_of(head + [1], bs)
    m.allocate_slots(owner)
    m.free(owner)  # 8 cached blocks in the free queue

    def admit():
        for i in range(150):
            seq = seq_of(head + [i + 100] * 3, bs)
            m.allocate_slots(seq, None, m.get_computed_blocks(seq))

    seconds = timed(admit)
    assert seconds < 1.0, (
        f"150 admissions of 10 blocks took {seconds:.2f} s in a pool of {BIG} blocks: an admission must "
        "cost what it touches, not a scan of the pool"
    )


# ================================================================ ch05.ex9: growth and copy-on-write
@pytest.mark.exercise("ch05.ex9", points=2)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_growth_holds_the_invariants_on_a_random_trace(impl, seed):
    cls = mix(impl("ex05_block_manager"), "ch05.ex9")
    seen = trace(cls, seed + 10, bs=[4, 2, 3][seed], blocks=18)
    assert seen["copies"] > 0 and seen["grow_none"] > 0, seen


@pytest.mark.exercise("ch05.ex9", points=2)
@pytest.mark.parametrize("bs", [1, 4])
def test_growth_copies_a_shared_last_block_at_every_fill(impl, bs):
    """A fork shares every block; the first write into a partly filled shared block copies it. Tried for
    every fill of the last block, with the pool one block short, exactly enough, and above."""
    cls = mix(impl("ex05_block_manager"), "ch05.ex9")
    for length in range(bs * 2, bs * 3 + 1):
        for spare in (0, 1, 2):
            m = manager(cls, bs, 8)
            parent = seq_of([3] * length, bs)
            m.allocate_slots(parent, None, [])
            child = parent.fork(next(_ids))
            m.fork(parent, child)
            busy = seq_of([9] * (m.get_num_free_gpu_blocks() - spare) * bs, bs)
            if len(busy):
                m.allocate_slots(busy, None, [])  # the pool keeps `spare` free blocks
            m.watermark_blocks = 4  # growth ignores the watermark
            partial = length % bs != 0
            needed = 1  # one new token: a copy when partial, a fresh block when full
            check_invariants(m, "set-up")
            child.append_token_id(5)
            where = f"block size {bs}, {length} tokens, {spare} free blocks"
            before = state(m, [parent, child])
            got = m.allocate_slots(child, 1)
            if spare < needed:
                assert got is None, f"{where}: the growth needs a block the pool does not have"
                assert state(m, [parent, child]) == before, f"{where}: None changed the state"
                continue
            assert got is not None, (
                f"{where}: the growth fits (no watermark for a running sequence)"
            )
            if partial:
                shared = m.get_block_table(parent)[-1]
                assert len(got.copies) == 1 and got.copies[0][0] == shared, (
                    f"{where}: the shared partial block {shared} is copied: copies {got.copies}"
                )
                assert m.get_block_table(child)[-1] == got.copies[0][1] != shared, (
                    f"{where}: the child's table ends in its private copy {got.copies[0][1]}, not in "
                    f"the shared block {shared}"
                )
                assert got.block_ids == [], f"{where}: the copy is not an appended block"
            else:
                assert got.copies == [], f"{where}: a full shared block is never copied"
                assert len(got.block_ids) == 1, f"{where}: one block appended"
            kept = len(m.get_block_table(child)) - 1
            assert m.get_block_table(child)[:kept] == m.get_block_table(parent)[:kept], (
                f"{where}: the blocks before the last stay shared"
            )
            check_invariants(m, where)


@pytest.mark.exercise("ch05.ex9", points=2)
def test_growth_caches_the_blocks_it_fills(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex9")
    bs = 4
    m = manager(cls, bs, 12)
    prompt = list(range(1, 11))  # 10 tokens: 2 full blocks and a partial one
    seq = seq_of(prompt, bs)
    m.allocate_slots(seq, 3, [])  # a first chunk of 3 tokens
    for n in (5, 2):  # the next chunks
        m.allocate_slots(seq, n)
    for t in (11, 12, 13):  # decodes fill the third block and start a fourth
        seq.append_token_id(t)
        m.allocate_slots(seq, 1)
    probe = seq_of(list(range(1, 14)) + [0], bs)
    assert m.get_computed_blocks(probe) == m.get_block_table(seq)[:3], (
        "blocks filled by later chunks and by decodes are cached for other prompts"
    )
    blocks = m.get_block_table(seq)
    m.free(seq)  # the free queue: the 8 unused blocks, then seq's, tail first
    m.allocate_slots(seq_of([50] * 8 * bs, bs), None, [])  # takes the unused ones
    grown = seq_of([60] * bs, bs)
    m.allocate_slots(grown, None, [])  # takes seq's partial last block
    grown.append_token_id(1)
    got = m.allocate_slots(grown, 1)
    assert got.block_ids == [blocks[2]], "growth takes the front of the free queue"
    assert m.get_computed_blocks(probe) == blocks[:2], (
        "a cached block handed out for new data no longer answers for its old tokens"
    )


@pytest.mark.exercise("ch05.ex9", points=1)
def test_growth_rejects_slots_beyond_the_sequence(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex9")
    m = manager(cls, 4, 8)
    seq = seq_of(list(range(6)), 4)
    m.allocate_slots(seq, 4, [])
    before = state(m, [seq])
    for n in (3, 7, -1):
        with pytest.raises(ValueError):
            m.allocate_slots(seq, n)
        assert state(m, [seq]) == before, f"asking for {n} slots changed the state"
    got = m.allocate_slots(seq, 0)
    assert got is not None and got.block_ids == [] and got.copies == [], (
        "zero tokens: nothing to do"
    )


@pytest.mark.exercise("ch05.ex9", points=2)
def test_growth_costs_the_blocks_it_touches(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex9")
    bs = 2
    m = manager(cls, bs, BIG)
    seqs = [seq_of([i] * 3, bs) for i in range(30)]
    for s in seqs:
        m.allocate_slots(s)

    def grow():
        for step in range(10):
            for s in seqs:
                s.append_token_id(step)
                m.allocate_slots(s, 1)

    seconds = timed(grow)
    assert seconds < 1.0, (
        f"300 decode growths took {seconds:.2f} s in a pool of {BIG} blocks: growth must cost what it "
        "touches, not a scan of the pool"
    )


# ================================================================ ch05.ex10: free
@pytest.mark.exercise("ch05.ex10", points=2)
@pytest.mark.parametrize("holders", [1, 2, 3])
def test_free_drops_one_reference_per_block_tail_first(impl, holders):
    cls = mix(impl("ex05_block_manager"), "ch05.ex10")
    bs = 4
    for length in range(1, 4 * bs + 1):  # every fill of the last block
        m = manager(cls, bs, 12)
        seq = seq_of(list(range(100, 100 + length)), bs)
        m.allocate_slots(seq)
        others = []
        for _ in range(holders - 1):
            other = seq.fork(next(_ids))
            m.fork(seq, other)
            others.append(other)
        table = m.get_block_table(seq)
        queue = m.gpu_allocator.free_queue()
        m.free(seq)
        where = f"{length} tokens, {holders} holders"
        assert seq.seq_id not in m.block_tables, f"{where}: the table is gone"
        assert [m.gpu_allocator.ref_count(b) for b in table] == [holders - 1] * len(table), (
            f"{where}: each block has one holder fewer"
        )
        want = queue + (table[::-1] if holders == 1 else [])
        assert m.gpu_allocator.free_queue() == want, (
            f"{where}: free queue {m.gpu_allocator.free_queue()}, expected {want}: blocks nobody holds "
            "join the back, the tail of the table first"
        )
        m.free(seq)
        assert m.gpu_allocator.free_queue() == want, f"{where}: a second free is a no-op"
        for other in others:
            m.free(other)
        check_invariants(m, where)
    m.free(seq_of([1, 2], bs))  # never allocated: a no-op


@pytest.mark.exercise("ch05.ex10", points=2)
def test_freed_blocks_stay_cached_until_reused(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex10")
    bs = 4
    m = manager(cls, bs, 10)
    prompt = list(range(1, 13))
    first = seq_of(prompt, bs)
    m.allocate_slots(first)
    blocks = m.get_block_table(first)
    m.free(first)
    again = seq_of(prompt + [5], bs)
    assert m.get_computed_blocks(again) == blocks, "a freed sequence's full blocks stay hit-able"
    m.allocate_slots(again)
    assert m.get_block_table(again)[:3] == blocks, (
        f"re-admitted (12 tokens + 1, blocks of 4): its 3 full blocks are the freed, cached {blocks}"
    )
    check_invariants(m, "re-admitted")


@pytest.mark.exercise("ch05.ex10", points=1)
def test_free_gives_a_swapped_out_sequence_its_cpu_blocks_back(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex10")
    m = manager(cls, 4, 8, cpu=6)
    seq = seq_of(list(range(10)), 4)
    m.allocate_slots(seq)
    assert m.swap_out(seq) is not None, "set-up: 10 tokens (3 blocks) swap out to 6 CPU blocks"
    m.free(seq)
    assert m.get_num_free_cpu_blocks() == 6, "free returns a swapped-out sequence's CPU blocks"
    assert not m.has_blocks(seq), "a freed, swapped-out sequence holds no blocks"
    assert m.get_num_free_gpu_blocks() == 8, (
        "the swap-out gave the GPU blocks back: free leaves all 8 GPU blocks free"
    )


@pytest.mark.exercise("ch05.ex10", points=2)
@pytest.mark.parametrize("seed", [0, 1])
def test_free_holds_the_invariants_on_a_random_trace(impl, seed):
    cls = mix(impl("ex05_block_manager"), "ch05.ex10")
    seen = trace(cls, seed + 20, bs=[4, 3][seed], blocks=20)
    assert seen["freed"] > 5, seen


@pytest.mark.exercise("ch05.ex10", points=1)
def test_free_costs_the_blocks_it_touches(impl):
    cls = mix(impl("ex05_block_manager"), "ch05.ex10")
    bs = 2
    m = manager(cls, bs, BIG)
    seqs = [seq_of([i] * 9, bs) for i in range(200)]
    for s in seqs:
        m.allocate_slots(s)
    seconds = timed(lambda: [m.free(s) for s in seqs])
    assert seconds < 1.0, (
        f"freeing 200 sequences of 5 blocks took {seconds:.2f} s in a pool of {BIG} blocks"
    )


# ================================================================ the whole manager in the engine
WHOLE = ("ch05.ex7", "ch05.ex8", "ch05.ex9")


def scheduler_run(cls, seed=0, bs=4, num_blocks=14, watermark=0.1):
    """Three waves of requests sharing heads (n = 2 for some) through the scheduler and a content-checked
    fake engine: returns the tokens, the hit rate and the copies."""
    rng = random.Random(seed)
    m = cls(bs, num_blocks, 0, watermark, True)
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_model_len=40, max_num_batched_tokens=10),
        CacheConfig(
            block_size=bs,
            num_gpu_blocks=num_blocks,
            watermark=watermark,
            enable_prefix_caching=True,
        ),
        m,
    )
    engine = CheckedEngine(sched)
    heads = [[1, 2, 3, 4, 5, 6, 7, 8], [4, 3, 2, 1, 8, 7, 6, 5]]
    groups, ids = [], itertools.count()
    for wave in range(3):
        for r in range(4):
            prompt = rng.choice(heads)[: rng.choice([4, 6, 8])] + [
                rng.randrange(10, 20) for _ in range(rng.randrange(5))
            ]
            group = SequenceGroup(
                f"w{wave}r{r}",
                [Sequence(next(ids), prompt, bs)],
                SamplingParams(n=2 if (wave + r) % 3 == 0 else 1, max_tokens=rng.randrange(2, 7)),
            )
            sched.add_request(group)
            groups.append(group)
        engine.run(max_steps=400)
    assert_all_free(sched)
    tokens = [[s.output_token_ids for s in g.seqs] for g in groups]
    copies = sum(len(o.blocks_to_copy) for o in engine.log)
    return tokens, m.prefix_cache_hit_rate, copies


@pytest.mark.exercise("ch05.ex10", points=2, uses=WHOLE)
@pytest.mark.parametrize("seed", [0, 1])
def test_your_manager_runs_the_scheduler_like_the_reference(impl, seed):
    cls = impl("ex05_block_manager").BlockSpaceManager
    want = scheduler_run(RefManager, seed)
    got = scheduler_run(cls, seed)
    assert got == want, "your block manager: same tokens, hit rate and copies as the reference's"
    assert want[1] > 0 and want[2] > 0, "the run must hit the prefix cache and copy blocks"
