"""Graded: chapter 05, block keys, exact lookup and the copy-on-write decision (exercises/ex05_prefix_cache.py).

References are written here. Lookups run against caches built with a deliberately weak hash, so that
keys collide and only the token and parent checks separate hits from misses.
"""

from __future__ import annotations

import random

import pytest


def strong(parent, tokens, extra):
    return hash((parent, tokens, extra))


def weak(parent, tokens, extra):
    return (parent * 7 + sum(tokens)) % 5


def ref_keys(tokens, bs, hash_fn, extra=None):
    keys, parent = [], 0
    for i in range(len(tokens) // bs):
        parent = hash_fn(parent, tuple(tokens[i * bs:(i + 1) * bs]), extra)
        keys.append(parent)
    return keys


def ref_lookup(cache, tokens, bs, hash_fn):
    hits, parent = [], 0
    for i in range((len(tokens) - 1) // bs):
        block = tuple(tokens[i * bs:(i + 1) * bs])
        parent = hash_fn(parent, block, None)
        found = [e.block_id for e in cache.get(parent, [])
                 if e.token_ids == block and e.parent_block == (hits[-1] if hits else None)]
        if not found:
            break
        hits.append(found[0])
    return hits


def build_cache(ex, prompts, bs, hash_fn, rng):
    """Cache every full block of each prompt, chained, under shuffled physical ids."""
    cache, ids = {}, list(range(1000))
    rng.shuffle(ids)
    for prompt in prompts:
        parent = None
        for i, key in enumerate(ref_keys(prompt, bs, hash_fn)):
            block_id = ids.pop()
            cache.setdefault(key, []).append(ex.Entry(block_id, parent, tuple(prompt[i * bs:(i + 1) * bs])))
            parent = block_id
    return cache


@pytest.mark.exercise("ch05.ex1", points=2)
@pytest.mark.parametrize("bs", [4, 16])
def test_block_keys_chain_and_skip_partial_blocks(impl, bs):
    ex = impl("ex05_prefix_cache")
    rng = random.Random(bs)
    for n in (0, 1, bs - 1, bs, bs + 1, 3 * bs, 3 * bs + 2):
        tokens = [rng.randrange(-50, 50) for _ in range(n)]
        for hash_fn in (strong, weak):
            assert ex.block_keys(tokens, bs, hash_fn) == ref_keys(tokens, bs, hash_fn), \
                f"{n} tokens, block {bs}: keys of the full blocks, each chaining the previous key"
    tokens = list(range(2 * bs))
    assert ex.block_keys(tokens, bs, strong, extra="adapter") == ref_keys(tokens, bs, strong, "adapter"), \
        "the extra key is part of every block's hash"


@pytest.mark.exercise("ch05.ex2", points=2)
def test_lookup_corner_cases(impl):
    ex = impl("ex05_prefix_cache")
    rng = random.Random(0)
    cache = build_cache(ex, [[1, 2, 3, 4, 5, 6, 7, 8, 9]], 4, weak, rng)
    first, second = [e.block_id for v in cache.values() for e in v][:2]
    assert ex.lookup(cache, [4, 3, 2, 1, 9], 4, weak) == [], "hash collision: colliding key, other tokens: miss"
    assert ex.lookup(cache, [9, 9, 9, 9, 5, 6, 7, 8, 0], 4, weak) == [], "chained keys: same tokens, other parent: miss"
    got = ex.lookup(cache, [1, 2, 3, 4, 1, 2, 3, 4, 0], 4, weak)
    assert len(got) == 1, "chained keys: [1,2,3,4,1,2,3,4] hits exactly one block"
    assert ex.lookup(cache, [1, 2, 3, 4, 5, 6, 7, 8], 4, weak) == ref_lookup(cache, [1, 2, 3, 4, 5, 6, 7, 8], 4, weak)
    assert len(ex.lookup(cache, [1, 2, 3, 4, 5, 6, 7, 8], 4, weak)) == 1, \
        "fully cached prompt: its last token is computed"
    assert len(ex.lookup(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 4, weak)) == 2
    assert {first, second} >= set(ex.lookup(cache, [1, 2, 3, 4, 5, 6, 7, 8, 1], 4, weak))


@pytest.mark.exercise("ch05.ex2", points=3)
@pytest.mark.parametrize("seed", range(6))
def test_lookup_matches_reference_on_random_shared_prefixes(impl, seed):
    ex = impl("ex05_prefix_cache")
    rng = random.Random(seed)
    bs = rng.choice([2, 4])
    hash_fn = weak if seed % 2 else strong
    stems = [[rng.randrange(1, 6) for _ in range(rng.randrange(bs, 5 * bs))] for _ in range(4)]
    prompts = [rng.choice(stems)[: rng.randrange(1, 5 * bs)] + [rng.randrange(1, 6) for _ in range(rng.randrange(4))]
               for _ in range(8)]
    cache = build_cache(ex, prompts, bs, hash_fn, rng)
    hits_seen = 0
    for _ in range(40):
        query = rng.choice(stems)[: rng.randrange(1, 5 * bs)] + [rng.randrange(1, 6) for _ in range(rng.randrange(3))]
        want = ref_lookup(cache, query, bs, hash_fn)
        hits_seen += len(want)
        got = ex.lookup(cache, query, bs, hash_fn)
        assert len(got) == len(want), f"query {query}: {len(got)} blocks hit, expected {len(want)}"
        for i, b in enumerate(got):
            entry = next(e for v in cache.values() for e in v if e.block_id == b)
            assert entry.token_ids == tuple(query[i * bs:(i + 1) * bs]), "a hit returned a block with other tokens"
            assert entry.parent_block == (got[i - 1] if i else None), "a hit after the wrong parent block"
    assert hits_seen > 0, "test data must contain hits"


@pytest.mark.exercise("ch05.ex3", points=2)
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_slot_action(impl, bs):
    ex = impl("ex05_prefix_cache")
    for num_tokens in range(0, 3 * bs + 2):
        for ref in (1, 2, 3):
            want = "new block" if num_tokens % bs == 0 else ("copy" if ref > 1 else "in place")
            assert ex.slot_action(num_tokens, bs, ref) == want, \
                f"{num_tokens} tokens in blocks of {bs}, last block held {ref}x: expected {want!r}"
