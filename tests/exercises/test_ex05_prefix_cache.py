"""Graded: chapter 05, the prefix cache and copy-on-write the engine runs (exercises/ex05_prefix_cache.py).

Each region is tested on its own: the learner's method is put into a subclass of the reference
``paged.core.prefix_cache.PrefixCache`` (same data structures), so one unfinished step never fails the
checks of another. The checks: hand-made corner cases (a hash collision, keys that chain their parent, a
fully cached prompt, a colliding parent), the same random trace through the reference block manager and
through one holding the learner's piece in lockstep (block tables, cached tokens and cache sizes must be
equal after every operation), and a content-checked fake engine (``paged_course.sim.kv_check``): every
token a sequence attends to must hold that sequence's own prefix. A weak hash
``(parent * 7 + sum(tokens)) % 5`` makes keys collide, so only the token and parent checks separate hits
from misses.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest

from paged.config import CacheConfig, SchedulerConfig
from paged.core.allocator import BlockAllocator
from paged.core.block_manager import BlockSpaceManager
from paged.core.block_manager import copy_on_write as ref_copy_on_write
from paged.core.block_table import BlockTable
from paged.core.prefix_cache import ROOT_KEY
from paged.core.prefix_cache import PrefixCache as RefCache
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup
from paged_course.sim.kv_check import CheckedEngine, assert_all_free


def weak(parent, tokens):
    return (parent * 7 + sum(tokens)) % 5


def strong(parent, tokens):
    return hash((parent, tokens))


def ref_keys(tokens, bs, hash_fn):
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = hash_fn(parent, tuple(tokens[i * bs : (i + 1) * bs]))
        keys.append(parent)
    return keys


def mix(ex, *methods):
    """The reference PrefixCache with the learner's ``methods`` (their own definitions, not inherited)."""
    own = vars(ex.PrefixCache)
    missing = [m for m in methods if m not in own]
    assert not missing, f"PrefixCache must define {', '.join(missing)} (the engine calls it)"
    return type("LearnerPrefixCache", (RefCache,), {m: own[m] for m in methods})


_ids = itertools.count(1)


def seq_of(tokens, bs):
    return Sequence(next(_ids), list(tokens), bs)


def cache_with(cls, bs, hash_fn, prompts_and_blocks):
    """A cache of ``cls`` holding each (prompt, block ids) registered by the reference ``insert``."""
    cache = cls(bs, hash_fn)
    for prompt, block_ids in prompts_and_blocks:
        seq = seq_of(prompt, bs)
        RefCache.insert(cache, seq, block_ids, 0, len(prompt) // bs)
    return cache


BIG_CACHE = 50_000  # entries: a verb that scans the cache costs seconds here


def big_cache(cls):
    """A cache of ``cls`` holding BIG_CACHE entries: one long sequence, block size 1, registered by the
    reference ``insert`` (its blocks are the chain 0, 1, 2, ...)."""
    cache = cls(1, strong)
    RefCache.insert(cache, seq_of(range(BIG_CACHE), 1), list(range(BIG_CACHE)), 0, BIG_CACHE)
    return cache


# ---------------------------------------------------------------- lockstep: reference vs learner block manager
def lockstep(cls, copy_on_write, seed, bs, num_blocks, hash_fn, ops=120):
    """One random trace (admissions with shared heads, decodes, forks, frees) through the reference block
    manager and through one with the learner's part; everything observable must agree after each op."""
    rng = random.Random(seed)
    ref = BlockSpaceManager(
        bs, num_blocks, watermark=0.0, enable_prefix_caching=True, hash_fn=hash_fn
    )
    you = BlockSpaceManager(
        bs,
        num_blocks,
        watermark=0.0,
        enable_prefix_caching=True,
        hash_fn=hash_fn,
        prefix_cache_cls=cls,
        copy_on_write=copy_on_write,
    )
    stems = [[rng.randrange(1, 6) for _ in range(5 * bs)] for _ in range(3)]
    live: list[tuple[Sequence, Sequence]] = []
    hits = forks = evictions = 0
    for op in range(ops):
        kind = rng.random()
        where = f"seed {seed}, block size {bs}, operation {op}"
        if kind < 0.4 or not live:
            prompt = rng.choice(stems)[: rng.randrange(1, 4 * bs)] + [
                rng.randrange(1, 6)
            ] * rng.randrange(3)
            a, b = seq_of(prompt, bs), Sequence(next(_ids), list(prompt), bs)
            cached_before = {x for x in range(num_blocks) if x in ref.prefix_cache}
            admitted = ref.allocate_slots(a) is not None
            assert (you.allocate_slots(b) is not None) == admitted, (
                f"{where}: admission differs from the reference (cached prefix)"
            )
            if not admitted:
                continue
            fresh = ref.get_block_table(a)[a.num_cached_tokens // bs :]
            evictions += any(x in cached_before for x in fresh)
            assert b.num_cached_tokens == a.num_cached_tokens, (
                f"{where}: prompt {prompt}: {b.num_cached_tokens} tokens from cache, the reference finds "
                f"{a.num_cached_tokens}"
            )
            hits += a.num_cached_tokens > 0
            live.append((a, b))
        elif kind < 0.75:
            a, b = rng.choice(live)
            t = rng.randrange(1, 6)
            a.append_token_id(t)
            b.append_token_id(t)
            na = ref.allocate_slots(a, 1)
            if na is None:  # no room to grow: take the token back
                a.token_ids.pop()
                b.token_ids.pop()
                continue
            pa, pb = na.copies, you.allocate_slots(b, 1).copies
            assert len(pb) == len(pa), f"{where}: copy-on-write pairs {pb}, the reference {pa}"
        elif kind < 0.85:
            a, b = rng.choice(live)
            ca, cb = a.fork(next(_ids)), b.fork(next(_ids))
            ref.fork(a, ca)
            you.fork(b, cb)
            live.append((ca, cb))
            forks += 1
        else:
            a, b = live.pop(rng.randrange(len(live)))
            ref.free(a)
            you.free(b)
        for a, b in live:
            assert you.get_block_table(b) == ref.get_block_table(a), (
                f"{where}: block table {you.get_block_table(b)} of sequence {b.token_ids}, the reference has "
                f"{ref.get_block_table(a)}"
            )
        assert len(you.prefix_cache) == len(ref.prefix_cache), (
            f"{where}: {len(you.prefix_cache)} cached blocks, the reference has {len(ref.prefix_cache)}"
        )
        assert you.get_num_free_gpu_blocks() == ref.get_num_free_gpu_blocks(), (
            f"{where}: free blocks differ"
        )
    return hits, forks, evictions


def engine_run(cls, copy_on_write, hash_fn, bs=4, num_blocks=14, seed=0):
    """Three waves of requests sharing heads (n = 2 for some), through the scheduler and a content-checked
    fake engine. Returns every request's tokens and the prefix-cache hit rate."""
    rng = random.Random(seed)
    manager = BlockSpaceManager(
        bs,
        num_blocks,
        watermark=0.0,
        enable_prefix_caching=True,
        hash_fn=hash_fn,
        prefix_cache_cls=cls,
        copy_on_write=copy_on_write,
    )
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=4, max_model_len=32, max_num_batched_tokens=12),
        CacheConfig(
            block_size=bs, num_gpu_blocks=num_blocks, watermark=0.0, enable_prefix_caching=True
        ),
        manager,
    )
    engine = CheckedEngine(sched)
    heads = [
        [1, 2, 3, 4, 5, 6, 7, 8],
        [4, 3, 2, 1, 8, 7, 6, 5],
        [1, 2, 3, 4, 9, 9, 9, 9],
    ]  # collide under `weak`
    groups, ids = [], itertools.count()
    for wave in range(3):
        for r in range(4):
            tail = [rng.randrange(10, 20) for _ in range(rng.randrange(4))]
            prompt = rng.choice(heads)[: rng.choice([4, 6, 8])] + tail
            n = 2 if (wave + r) % 3 == 0 else 1
            group = SequenceGroup(
                f"w{wave}r{r}",
                [Sequence(next(ids), prompt, bs)],
                SamplingParams(n=n, max_tokens=rng.randrange(2, 6)),
            )
            sched.add_request(group)
            groups.append(group)
        engine.run(max_steps=300)
    assert_all_free(sched)
    tokens = [[s.output_token_ids for s in g.seqs] for g in groups]
    return tokens, manager.prefix_cache_hit_rate, sum(len(o.blocks_to_copy) for o in engine.log)


# ================================================================ ch05.ex1: chained keys
@pytest.mark.exercise("ch05.ex1", points=1)
@pytest.mark.parametrize("bs", [4, 16])
def test_keys_chain_every_full_block(impl, bs):
    ex = impl("ex05_prefix_cache")
    cls = mix(ex, "update_hashes")
    rng = random.Random(bs)
    for n in (0, 1, bs - 1, bs, bs + 1, 3 * bs, 3 * bs + 2):
        tokens = [rng.randrange(0, 50) for _ in range(n)]
        for hash_fn in (strong, weak):
            seq = seq_of(tokens, bs) if tokens else None
            if seq is None:
                continue
            got = cls(bs, hash_fn).update_hashes(seq)
            assert got == ref_keys(tokens, bs, hash_fn), (
                f"{n} tokens, block {bs}: key(i) = hash_fn(key(i-1), tuple(block i)), key(-1) = ROOT_KEY, "
                "full blocks only"
            )
            assert got is seq.block_hashes, (
                "update_hashes extends seq.block_hashes in place and returns it"
            )


@pytest.mark.exercise("ch05.ex1", points=1)
@pytest.mark.parametrize("bs", [2, 4])
def test_each_block_is_hashed_once_as_the_sequence_grows(impl, bs):
    ex = impl("ex05_prefix_cache")
    calls = []

    def counting(parent, tokens):
        calls.append(tokens)
        return weak(parent, tokens) * 1000 + len(
            calls
        )  # depends on the call order: a re-hash shows

    cache = mix(ex, "update_hashes")(bs, counting)
    seq = seq_of([3, 1, 4], bs)
    cache.update_hashes(seq)
    for t in [1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]:
        seq.append_token_id(t)
        cache.update_hashes(seq)
    full = len(seq) // bs
    assert len(calls) == full, (
        f"{len(calls)} hash calls for {full} full blocks: each block is hashed once"
    )
    assert calls == [tuple(seq.token_ids[i * bs : (i + 1) * bs]) for i in range(full)], (
        "blocks are hashed in order, each as a tuple of its tokens"
    )
    assert len(seq.block_hashes) == full, (
        f"{len(seq)} tokens in blocks of {bs}: one key per full block on the sequence, {full} in all"
    )


@pytest.mark.exercise("ch05.ex1", points=1)
def test_existing_keys_are_kept_and_extended(impl):
    ex = impl("ex05_prefix_cache")
    cache = mix(ex, "update_hashes")(4, weak)
    seq = seq_of(list(range(1, 18)), 4)  # 4 full blocks and one token
    seq.block_hashes = [3, 4]  # the keys of the first two blocks, computed earlier
    got = cache.update_hashes(seq)
    k2 = weak(4, (9, 10, 11, 12))
    assert got == [3, 4, k2, weak(k2, (13, 14, 15, 16))], (
        "the keys already on the sequence are kept; the next key chains the last one"
    )


# ================================================================ ch05.ex2: the verified lookup
@pytest.mark.exercise("ch05.ex2", points=2)
def test_lookup_hash_collision_is_a_miss(impl):
    ex = impl("ex05_prefix_cache")
    cls = mix(ex, "lookup")
    assert weak(ROOT_KEY, (1, 2, 3, 4)) == weak(ROOT_KEY, (4, 3, 2, 1)), (
        "test data: the keys collide"
    )
    cache = cache_with(cls, 4, weak, [([1, 2, 3, 4, 9], [5, 2])])
    assert cache.lookup(seq_of([4, 3, 2, 1, 9], 4), 1) == [], (
        "hash collision: the key matches but the tokens differ, so it is a miss"
    )
    assert cache.lookup(seq_of([1, 2, 3, 4, 9], 4), 1) == [5], (
        "the block with the right tokens hits"
    )
    # block 0 misses; block 1 = [1,2,3,4] has the key of the cached first block (weak(0, ...) twice)
    assert cache.lookup(seq_of([4, 3, 2, 1, 1, 2, 3, 4, 0], 4), 2) == [], (
        "the first miss ends the prefix: a later block can never hit (its K/V depend on the missed block)"
    )


@pytest.mark.exercise("ch05.ex2", points=2)
def test_lookup_chained_keys(impl):
    ex = impl("ex05_prefix_cache")
    cache = cache_with(mix(ex, "lookup"), 4, weak, [([1, 2, 3, 4, 5, 6, 7, 8], [6, 3])])
    assert cache.lookup(seq_of([9, 9, 9, 9, 5, 6, 7, 8, 0], 4), 2) == [], (
        "chained keys: block [5,6,7,8] after another parent is a miss"
    )
    assert cache.lookup(seq_of([1, 2, 3, 4, 1, 2, 3, 4, 0], 4), 2) == [6], (
        "chained keys: [1,2,3,4,1,2,3,4] hits exactly one block"
    )
    assert cache.lookup(seq_of([1, 2, 3, 4, 5, 6, 7, 8, 0], 4), 2) == [6, 3], (
        "chained keys: the cached [1,2,3,4,5,6,7,8] asked again (9 tokens, blocks of 4, max_blocks 2) "
        "hits both its blocks, in table order"
    )


@pytest.mark.exercise("ch05.ex2", points=2)
def test_lookup_never_more_than_max_blocks(impl):
    ex = impl("ex05_prefix_cache")
    cache = cache_with(mix(ex, "lookup"), 4, strong, [(list(range(1, 13)), [7, 1, 4])])
    seq = seq_of(list(range(1, 13)), 4)
    assert cache.lookup(seq, 2) == [7, 1], (
        "fully cached prompt: at most max_blocks blocks (its last token is computed, so its last block is not hit)"
    )
    assert cache.lookup(seq, 0) == [] and cache.lookup(seq, -1) == [], (
        "max_blocks 0 (or below): no hit"
    )
    assert cache.lookup(seq_of(list(range(1, 14)), 4), 9) == [7, 1, 4], (
        "max_blocks is a cap, not a count: tokens 1..13 in blocks of 4 (3 full blocks, all cached) "
        "with max_blocks 9 hit the 3 cached blocks and stop there"
    )


@pytest.mark.exercise("ch05.ex2", points=2)
def test_lookup_verifies_the_parent_entry(impl):
    ex = impl("ex05_prefix_cache")
    # (1,2,3,4) and (4,3,2,1) collide as first blocks. [A, B] is cached in blocks 10, 11; A' alone in 12.
    cache = cache_with(
        mix(ex, "lookup"), 4, weak, [([1, 2, 3, 4, 5, 6, 7, 8], [10, 11]), ([4, 3, 2, 1, 9], [12])]
    )
    got = cache.lookup(seq_of([4, 3, 2, 1, 5, 6, 7, 8, 0], 4), 2)
    assert got == [12], (
        "block 11 holds [5,6,7,8] computed after [1,2,3,4], not after the [4,3,2,1] that hit: its parent must match"
    )


@pytest.mark.exercise("ch05.ex2", points=1)
def test_lookup_changes_nothing(impl):
    ex = impl("ex05_prefix_cache")
    cache = cache_with(
        mix(ex, "lookup"), 4, weak, [([1, 2, 3, 4, 5, 6, 7, 8], [0, 1]), ([1, 2, 3, 4, 5], [0])]
    )

    def snapshot():
        return (
            {k: [e.block_id for e in v] for k, v in cache._by_key.items()},
            dict(cache._by_block),
            cache._next_uid,
            cache.queried_tokens,
            cache.hit_tokens,
        )

    before = snapshot()
    for call in (1, 2):
        assert cache.lookup(seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9], 4), 2) == [0, 1], (
            f"call {call}: tokens 1..9 in blocks of 4, max_blocks 2, hit the cached blocks [0, 1] "
            "on every call (a lookup takes nothing out of the cache)"
        )
    assert snapshot() == before, (
        "lookup is pure: the block manager takes the blocks and records the query"
    )


@pytest.mark.exercise("ch05.ex2", points=1)
@pytest.mark.parametrize("seed", range(4))
def test_lookup_matches_the_reference_on_random_caches(impl, seed):
    ex = impl("ex05_prefix_cache")
    cls = mix(ex, "lookup")
    rng = random.Random(seed)
    bs, hash_fn = rng.choice([2, 4]), (weak, strong)[seed % 2]
    stems = [[rng.randrange(1, 5) for _ in range(5 * bs)] for _ in range(3)]
    cache, ids = cls(bs, hash_fn), list(range(200))
    rng.shuffle(ids)
    hits = 0
    for _ in range(60):
        prompt = rng.choice(stems)[: rng.randrange(1, 5 * bs)] + [
            rng.randrange(1, 5) for _ in range(rng.randrange(3))
        ]
        seq = seq_of(prompt, bs)
        max_blocks = rng.randrange(-1, 6)
        want = RefCache.lookup(cache, seq_of(prompt, bs), max_blocks)
        got = cache.lookup(seq, max_blocks)
        assert got == want, (
            f"seed {seed}, query {prompt}, max_blocks {max_blocks}: hits {got}, expected {want}"
        )
        hits += len(want)
        table = want + [ids.pop() for _ in range(len(prompt) // bs - len(want))]
        RefCache.insert(cache, seq, table, len(want), len(prompt) // bs)
        if rng.random() < 0.3 and len(
            cache
        ):  # evict a random cached block: later chains through it break
            RefCache.evict(cache, rng.choice(list(cache._by_block)))
    assert hits > 0, "the test data must contain hits"


@pytest.mark.exercise("ch05.ex2", points=1)
@pytest.mark.parametrize("seed", [0, 1])
def test_lookup_in_the_block_manager_agrees_with_the_reference(impl, seed):
    ex = impl("ex05_prefix_cache")
    hits, _, _ = lockstep(mix(ex, "lookup"), ref_copy_on_write, seed, 4 if seed else 2, 12, weak)
    assert hits > 0, "the trace must contain prefix-cache hits (test data)"


@pytest.mark.exercise("ch05.ex2", points=2)
def test_lookup_in_the_engine_serves_each_token_its_own_prefix(impl):
    ex = impl("ex05_prefix_cache")
    want = engine_run(RefCache, ref_copy_on_write, weak)
    got = engine_run(mix(ex, "lookup"), ref_copy_on_write, weak)
    assert got == want, (
        "same requests, same tokens, same hit rate as with the reference prefix cache"
    )
    assert want[1] > 0, "the reference run must hit the cache (test data)"


@pytest.mark.exercise("ch05.ex2", points=1)
def test_lookup_costs_the_keys_it_tries_not_the_cache(impl):
    cls = mix(impl("ex05_prefix_cache"), "lookup")
    cache = big_cache(cls)
    prompts = [
        seq_of(list(range(9)) if i % 10 == 0 else [BIG_CACHE + i, 0, 1], 1) for i in range(1000)
    ]
    start = time.perf_counter()
    hits = [len(cache.lookup(seq, 8)) for seq in prompts]
    seconds = time.perf_counter() - start
    assert hits == [8 if i % 10 == 0 else 0 for i in range(1000)], (
        "the cache holds the chain 0, 1, 2, ..."
    )
    assert seconds < 1.0, (
        f"1,000 lookups (900 misses) took {seconds:.2f} s in a cache of {len(cache)} entries: a lookup "
        "reads the entries under its keys (a dictionary look-up), it never scans the cache"
    )


# ================================================================ ch05.ex3: registration
@pytest.mark.exercise("ch05.ex3", points=1)
@pytest.mark.parametrize("bs", [2, 4])
def test_insert_registers_chained_entries(impl, bs):
    ex = impl("ex05_prefix_cache")
    cache = mix(ex, "insert")(bs, weak)
    tokens = [5, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9][: 3 * bs + 1]
    seq, table = seq_of(tokens, bs), [8, 3, 6, 1]
    assert cache.insert(seq, table, 0, 3) == 3, "three new entries"
    keys = ref_keys(tokens, bs, weak)
    uids = []
    for i in range(3):
        entry = cache._by_block.get(table[i])
        assert entry is not None, f"logical block {i} (physical {table[i]}) must be cached"
        assert entry.block_id == table[i] and entry.key == keys[i], (
            f"block {i}: its physical block, its chained key"
        )
        assert tuple(entry.token_ids) == tuple(tokens[i * bs : (i + 1) * bs]), (
            f"block {i}: the entry stores its tokens"
        )
        assert entry.parent_uid == (uids[-1] if uids else 0), (
            f"block {i}: parent_uid is the uid of the previous block's entry (0 for block 0)"
        )
        assert entry in cache._by_key.get(keys[i], []), f"block {i}: findable under its key"
        uids.append(entry.uid)
    assert len(set(uids)) == 3 and min(uids) >= 1, "every entry gets a fresh uid (>= 1)"
    assert len(cache) == 3 and table[3] not in cache, "the partial block is not cached"
    assert RefCache.lookup(cache, seq_of(tokens + [0], bs), 3) == table[:3], (
        f"after insert, the same {3 * bs + 1} tokens (blocks of {bs}) plus one must hit the 3 registered "
        f"blocks {table[:3]}: each entry's key, tokens and parent uid chain the one before"
    )


@pytest.mark.exercise("ch05.ex3", points=2)
def test_insert_keeps_existing_entries_and_chains_after_shared_hits(impl):
    ex = impl("ex05_prefix_cache")
    cache = mix(ex, "insert")(4, weak)
    first = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert cache.insert(first, [2, 5, 7], 0, 2) == 2, (
        "insert returns the entries it added: blocks 0 and 1 of 9 tokens in blocks of 4, none cached: 2"
    )
    old = {b: cache._by_block[b] for b in (2, 5)}
    first.append_token_id(10), first.append_token_id(11), first.append_token_id(12)
    assert cache.insert(first, [2, 5, 7], 0, 3) == 1, (
        "blocks already cached are kept: one new entry"
    )
    assert all(cache._by_block[b] is e for b, e in old.items()), "existing entries are not replaced"
    assert sum(len(v) for v in cache._by_key.values()) == 3, "no duplicate entry for a cached block"
    # a second sequence that hit blocks 2 and 5 and computes its own third block in block 4
    second = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 1], 4)
    assert cache.insert(second, [2, 5, 4], 2, 3) == 1, (
        "a sequence that hit blocks 2 and 5 registers its own third block only (blocks 2 to 3): 1 entry"
    )
    assert cache._by_block[4].parent_uid == old[5].uid, (
        "a new block chains the entry of the hit before it"
    )
    again = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 1], 4)
    assert RefCache.lookup(cache, again, 3) == [2, 5, 4], (
        "the second prompt asked again hits all 3 of its blocks: block 4 chains the shared hits 2, 5"
    )


@pytest.mark.exercise("ch05.ex3", points=2)
def test_insert_stops_where_the_parent_is_not_cached(impl):
    ex = impl("ex05_prefix_cache")
    cache = mix(ex, "insert")(4, weak)
    seq = seq_of(list(range(1, 13)), 4)
    assert cache.insert(seq, [0, 1, 2], 1, 3) == 0 and len(cache) == 0, (
        "block 0 is not cached: its children cannot be (a chain is only as long as its cached head)"
    )
    assert cache.insert(seq, [0, 1, 2], 0, 2) == 2, (
        "blocks 0 and 1 of tokens 1..12 in blocks of 4, nothing cached yet: 2 new entries"
    )
    RefCache.evict(cache, 1)
    assert cache.insert(seq, [0, 1, 2], 2, 3) == 0 and 2 not in cache, (
        "block 1 was evicted: block 2 is not cached"
    )


@pytest.mark.exercise("ch05.ex3", points=1)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_insert_in_the_block_manager_agrees_with_the_reference(impl, seed):
    ex = impl("ex05_prefix_cache")
    hits, _, _ = lockstep(
        mix(ex, "insert"), ref_copy_on_write, seed, (2, 4, 4)[seed], 12, (weak, strong, weak)[seed]
    )
    assert hits > 0, "the trace must contain prefix-cache hits (test data)"


@pytest.mark.exercise("ch05.ex3", points=2)
def test_insert_in_the_engine_serves_each_token_its_own_prefix(impl):
    ex = impl("ex05_prefix_cache")
    want = engine_run(RefCache, ref_copy_on_write, weak, seed=1)
    got = engine_run(mix(ex, "insert"), ref_copy_on_write, weak, seed=1)
    assert got == want, (
        "same requests, same tokens, same hit rate as with the reference prefix cache"
    )


# ================================================================ ch05.ex4: eviction of one block
@pytest.mark.exercise("ch05.ex4", points=2)
def test_evict_forgets_that_block_only(impl):
    ex = impl("ex05_prefix_cache")
    cls = mix(ex, "evict")
    # two requests computed the same first block at once: blocks 3 and 6 hold the same key
    cache = cache_with(cls, 4, weak, [([1, 2, 3, 4, 5, 6, 7, 8], [3, 0]), ([1, 2, 3, 4, 9], [6])])
    key = weak(ROOT_KEY, (1, 2, 3, 4))
    assert cache.evict(3) is True, "evict returns True for a cached block"
    assert 3 not in cache and all(e.block_id != 3 for v in cache._by_key.values() for e in v), (
        "an evicted block must never be hit again: its entry leaves both maps"
    )
    assert [e.block_id for e in cache._by_key.get(key, [])] == [6], (
        "the other block under the same key stays cached"
    )
    assert RefCache.lookup(cache, seq_of([1, 2, 3, 4, 0], 4), 1) == [6], (
        "block 3 evicted: [1,2,3,4,0] hits block 6, which holds the same first block"
    )
    assert cache.evict(3) is False and cache.evict(99) is False, (
        "evicting a block that is not cached returns False"
    )
    assert cache.evict(6) is True and key not in cache._by_key, (
        "no empty list is left under a key (the map would grow with every key ever seen)"
    )
    assert 0 in cache and len(cache) == 1, (
        "evicting a parent leaves its child's entry (it simply cannot be reached)"
    )


@pytest.mark.exercise("ch05.ex4", points=1)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_evict_in_the_block_manager_agrees_with_the_reference(impl, seed):
    ex = impl("ex05_prefix_cache")
    bs, hash_fn = (2, 4, 2)[seed], (weak, strong, strong)[seed]
    _, _, evictions = lockstep(mix(ex, "evict"), ref_copy_on_write, seed, bs, 8, hash_fn)
    assert evictions > 0, "the trace must reuse cached blocks"


@pytest.mark.exercise("ch05.ex4", points=2)
def test_evict_in_the_engine_serves_each_token_its_own_prefix(impl):
    ex = impl("ex05_prefix_cache")
    want = engine_run(RefCache, ref_copy_on_write, weak, num_blocks=9, seed=2)
    got = engine_run(mix(ex, "evict"), ref_copy_on_write, weak, num_blocks=9, seed=2)
    assert got == want, (
        "same requests, same tokens, same hit rate as with the reference prefix cache"
    )


@pytest.mark.exercise("ch05.ex4", points=1)
def test_evict_takes_constant_time(impl):
    cls = mix(impl("ex05_prefix_cache"), "evict")
    cache = big_cache(cls)
    start = time.perf_counter()
    for b in range(0, 2000):
        cache.evict(b)
    seconds = time.perf_counter() - start
    assert seconds < 1.0, (
        f"2,000 evictions took {seconds:.2f} s in a cache of {BIG_CACHE} entries: evict finds the entry "
        "through the block map, it never scans the cache"
    )
    assert len(cache) == BIG_CACHE - 2000, (
        f"each of the 2,000 evictions of a cached block removes exactly its entry: "
        f"{BIG_CACHE} - 2000 entries left"
    )


# ================================================================ ch05.ex5: the eviction order (LRU)
def _manager_state(m):
    alloc = m.gpu_allocator
    return (
        alloc.free_queue(),
        [alloc.ref_count(b) for b in range(m.num_gpu_blocks)],
        {b for b in range(m.num_gpu_blocks) if b in m.prefix_cache},
    )


@pytest.mark.exercise("ch05.ex5", points=2)
def test_eviction_order_shared_head_stays_longest(impl):
    ex = impl("ex05_prefix_cache")
    m = BlockSpaceManager(4, 12, watermark=0.0, enable_prefix_caching=True)
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    a, b, c = (
        Sequence(i, p, 4)
        for i, p in enumerate(
            [shared + [11, 12, 13, 14, 15], shared + [21, 22, 23, 24, 25], [31, 32, 33, 34, 35, 36]]
        )
    )
    for s in (a, b, c):
        m.allocate_slots(s)
    queue, refs, cached = _manager_state(m)
    tables = [m.get_block_table(s) for s in (c, a, b)]
    got = ex.eviction_order(queue, refs, tables, cached)
    # C frees 7 then 6 (cached); A frees 3, 2 (cached), not 0 and 1 (B holds them); B frees 5, 4 (cached), 1, 0
    assert got == [6, 2, 4, 1, 0], (
        "least recently freed first, each sequence's tail before its head: the shared head is evicted last"
    )
    for s in (c, a, b):
        m.free(s)
    want = [x for x in m.gpu_allocator.free_queue() if x in m.prefix_cache]
    assert got == want, (
        "after C, A, B finish, the block manager's free queue (its cached blocks) is the predicted order"
    )


@pytest.mark.exercise("ch05.ex5", points=1)
def test_eviction_order_changes_none_of_its_arguments(impl):
    ex = impl("ex05_prefix_cache")
    queue, refs, tables, cached = [5, 4], [1, 2, 1, 1, 0, 0], [[1, 0], [3, 1, 2]], {0, 1, 2, 4}
    copies = (list(queue), list(refs), [list(t) for t in tables], set(cached))
    got = ex.eviction_order(queue, refs, tables, cached)
    assert got == [4, 0, 2, 1], (
        "free queue first (never-used or freed earlier), then each table tail first"
    )
    assert (queue, refs, tables, cached) == copies, "eviction_order must not change its arguments"


@pytest.mark.exercise("ch05.ex5", points=1)
@pytest.mark.parametrize("seed", range(5))
def test_eviction_order_predicts_the_block_manager(impl, seed):
    ex = impl("ex05_prefix_cache")
    rng = random.Random(seed)
    bs = rng.choice([2, 4])
    m = BlockSpaceManager(bs, 24, watermark=0.0, enable_prefix_caching=True)
    stems = [[rng.randrange(1, 4) for _ in range(4 * bs)] for _ in range(2)]
    seqs, ids = [], itertools.count()
    for _ in range(rng.randrange(4, 8)):  # admissions with shared heads, some decode, some fork
        prompt = rng.choice(stems)[: rng.randrange(bs, 4 * bs)] + [
            rng.randrange(4, 9) for _ in range(rng.randrange(3))
        ]
        seq = Sequence(next(ids), prompt, bs)
        if m.allocate_slots(seq) is None:
            break
        seqs.append(seq)
        for _ in range(rng.randrange(3)):
            seq.append_token_id(rng.randrange(4, 9))
            m.allocate_slots(seq, 1)
        if rng.random() < 0.3:
            child = seq.fork(next(ids))
            m.fork(seq, child)
            seqs.append(child)
    if rng.random() < 0.5:  # some blocks freed earlier: they sit in the queue already
        m.free(seqs.pop(0))
    rng.shuffle(seqs)
    finishing = seqs[: rng.randrange(1, len(seqs) + 1)]
    queue, refs, cached = _manager_state(m)
    got = ex.eviction_order(queue, refs, [m.get_block_table(s) for s in finishing], cached)
    for s in finishing:
        m.free(s)
    want = [b for b in m.gpu_allocator.free_queue() if b in m.prefix_cache]
    assert got == want, (
        f"seed {seed}: predicted eviction order {got}, the block manager's free queue gives {want}"
    )
    evicted = []  # new data takes blocks from the front of the queue: the cached ones go in that order
    while m.get_num_free_gpu_blocks():
        filler = Sequence(next(ids), [100 + len(evicted)] * bs, bs)
        before = {b for b in range(m.num_gpu_blocks) if b in m.prefix_cache}
        m.allocate_slots(filler)
        evicted += [b for b in m.get_block_table(filler) if b in before]
    assert evicted == want, (
        f"seed {seed}: new data takes cached blocks in free-queue order: evicted {evicted}, queue {want}"
    )


# ================================================================ ch05.ex6: copy-on-write
def _shared_table(bs, num_blocks, num_tokens, holders):
    alloc = BlockAllocator(16)
    ids = alloc.allocate_many(num_blocks + 3)[3:]  # not 0, 1, 2
    for b in ids:
        for _ in range(holders - 1):
            alloc.incref(b)
    return alloc, BlockTable(bs, ids, num_tokens)


def _no_allocate(case):
    """An ``allocate`` for a table that needs no copy: calling it fails the check, naming the case (the
    test's own assert after the call would never be reached)."""

    def allocate():
        raise AssertionError(f"{case}: no copy is needed, yet copy_on_write called allocate()")

    return allocate


@pytest.mark.exercise("ch05.ex6", points=1)
@pytest.mark.parametrize("bs", [4, 16])
def test_cow_copies_a_shared_partial_last_block(impl, bs):
    ex = impl("ex05_prefix_cache")
    alloc, table = _shared_table(bs, 2, bs + 2, holders=2)
    head, shared = table.block_ids
    new = alloc.allocate_many(1)[0]
    pairs = ex.copy_on_write(table, alloc, lambda: new)
    assert pairs == [(shared, new)], (
        "a shared, partially filled last block is copied: [(shared, private)]"
    )
    assert table.block_ids == [head, new], "the table now ends in its private block"
    assert alloc.ref_count(shared) == 1, (
        "the shared block loses exactly one holder (the sibling keeps it)"
    )
    assert alloc.ref_count(head) == 2, "full blocks stay shared"
    assert table.num_tokens == bs + 2, (
        f"copy-on-write swaps a block, not tokens: the table still holds {bs + 2} tokens (blocks of {bs})"
    )


@pytest.mark.exercise("ch05.ex6", points=2)
def test_cow_never_copies_a_full_or_private_block(impl):
    ex = impl("ex05_prefix_cache")
    for bs, blocks, tokens, holders in [
        (4, 2, 8, 2),
        (4, 2, 8, 3),
        (16, 1, 16, 2),
        (4, 2, 6, 1),
        (1, 3, 3, 2),
    ]:
        alloc, table = _shared_table(bs, blocks, tokens, holders)
        before = (list(table.block_ids), [alloc.ref_count(b) for b in table.block_ids])
        what = "full" if tokens % bs == 0 else "private"
        holding = f"{holders} holder" + "s" * (holders > 1)
        case = f"a {what} last block ({tokens} tokens in blocks of {bs}, {holding})"
        assert ex.copy_on_write(table, alloc, _no_allocate(case)) == [], f"{case}: no copy"
        assert (table.block_ids, [alloc.ref_count(b) for b in table.block_ids]) == before, (
            f"{case}: nothing changes (block ids and reference counts)"
        )
    case = "an empty table (no blocks)"
    assert ex.copy_on_write(BlockTable(4), BlockAllocator(4), _no_allocate(case)) == [], (
        f"{case}: nothing to copy"
    )


@pytest.mark.exercise("ch05.ex6", points=1)
@pytest.mark.parametrize("seed", [0, 1])
def test_cow_in_the_block_manager_agrees_with_the_reference(impl, seed):
    ex = impl("ex05_prefix_cache")
    _, forks, _ = lockstep(RefCache, ex.copy_on_write, seed + 3, 4, 14, strong, ops=160)
    assert forks > 0, "the trace must fork sequences"


@pytest.mark.exercise("ch05.ex6", points=2)
def test_cow_in_the_engine_keeps_forked_samples_apart(impl):
    ex = impl("ex05_prefix_cache")
    want = engine_run(RefCache, ref_copy_on_write, strong, seed=3)
    got = engine_run(RefCache, ex.copy_on_write, strong, seed=3)
    assert got == want, "parallel samples: same tokens as with the reference copy-on-write"
    assert want[2] > 0, "the run must copy shared partial blocks"
