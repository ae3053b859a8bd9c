"""Prefix caching: chained keys, exact hits, eviction order, hit rate; a hash collision, keys that chain
their parent and a fully cached prompt at the block-manager level (the engine-level versions with
outputs live with the engine tests)."""

from __future__ import annotations

import pytest

from paged.core.block_manager import BlockSpaceManager
from paged.core.prefix_cache import ROOT_KEY, PrefixCache, default_hash, hash_blocks
from paged.core.sequence import Sequence
from paged_course.engine_views import reset_prefix_cache


def weak_hash(parent, tokens):
    return (parent * 7 + sum(tokens)) % 5


def run_to_completion(
    m: BlockSpaceManager, seq_id: int, prompt: list[int], new_tokens: list[int]
) -> Sequence:
    seq = Sequence(seq_id, prompt, m.block_size)
    m.allocate_slots(seq)
    for t in new_tokens:
        seq.append_token_id(t)
        m.allocate_slots(seq)
    m.free(seq)
    return seq


def test_keys_chain_their_parent_and_skip_the_partial_block():
    keys = hash_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, [])
    assert len(keys) == 2, "9 tokens with block 4: two full blocks, the partial one gets no key"
    assert keys[0] == default_hash(ROOT_KEY, (1, 2, 3, 4)) and keys[1] == default_hash(
        keys[0], (5, 6, 7, 8)
    )
    assert hash_blocks([9, 9, 9, 9, 5, 6, 7, 8], 4, [])[1] != keys[1], (
        "same tokens, other parent: other key"
    )
    more = hash_blocks([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4, list(keys))
    assert more[:2] == keys and more[2] == default_hash(keys[1], (9, 10, 11, 12)), (
        "extending keeps the old keys"
    )


def test_case1_weak_hash_collision_is_a_miss():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True, hash_fn=weak_hash)
    assert weak_hash(ROOT_KEY, (1, 2, 3, 4)) == weak_hash(ROOT_KEY, (4, 3, 2, 1)), "keys collide"
    run_to_completion(m, 0, [1, 2, 3, 4, 9], [])
    second = Sequence(1, [4, 3, 2, 1, 9], 4)
    m.allocate_slots(second)
    assert second.num_cached_tokens == 0 and second.num_computed_tokens == 0, (
        "a collision must be a miss"
    )
    m.free(second)
    third = Sequence(2, [1, 2, 3, 4, 9], 4)
    m.allocate_slots(third)
    assert third.num_cached_tokens == 4, (
        "both colliding blocks stay cached and the right one is found"
    )


def test_case2_keys_chain_the_parent():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True)
    run_to_completion(m, 0, [1, 2, 3, 4, 5, 6, 7, 8], [20, 21])
    other_parent = Sequence(1, [9, 9, 9, 9, 5, 6, 7, 8], 4)
    m.allocate_slots(other_parent)
    assert other_parent.num_cached_tokens == 0, (
        "equal tokens after a different parent: 0 blocks hit"
    )
    m.free(other_parent)
    repeat_head = Sequence(2, [1, 2, 3, 4, 1, 2, 3, 4], 4)
    m.allocate_slots(repeat_head)
    assert repeat_head.num_cached_tokens == 4, "exactly 1 block hits"


def test_case4_a_fully_cached_prompt_still_computes_its_last_token():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True)
    first = run_to_completion(m, 0, list(range(1, 9)), [30, 31, 32])
    again = Sequence(1, list(range(1, 9)), 4)
    m.allocate_slots(again)
    assert len(again) - again.num_computed_tokens >= 1, "at least 1 token is computed"
    assert again.num_cached_tokens == 4 and again.num_cached_tokens <= 7, (
        "at most 7 from cache (here 1 block)"
    )
    assert m.get_block_table(again)[0] == 0, "the cached first block of the first run is reused"
    m.free(again)
    control = Sequence(2, list(range(1, 8)), 4)  # 7 tokens: 1 full block + 3
    m.allocate_slots(control)
    assert control.num_cached_tokens == 4 and control.num_computed_tokens == 4
    assert first.output_token_ids == [30, 31, 32]


def test_hits_on_in_use_blocks_cost_no_free_block_and_free_hits_leave_the_queue():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True)
    a = Sequence(0, list(range(1, 10)), 4)  # 3 blocks, 2 full cached
    m.allocate_slots(a)
    assert m.get_num_free_gpu_blocks() == 5
    b = Sequence(1, list(range(1, 10)), 4)
    m.allocate_slots(b)
    assert m.get_block_table(b)[:2] == [0, 1] and m.gpu_allocator.ref_count(0) == 2
    assert m.get_num_free_gpu_blocks() == 4, (
        "two in-use hits cost nothing; only the tail block is new"
    )
    m.free(a)
    m.free(b)
    assert m.gpu_allocator.free_queue() == [4, 5, 6, 7, 2, 3, 1, 0], (
        "each sequence tail first; shared head last"
    )
    c = Sequence(2, list(range(1, 10)), 4)
    m.allocate_slots(c)
    assert m.get_block_table(c) == [0, 1, 4] and 0 not in m.gpu_allocator.free_queue(), (
        "hits taken from queue"
    )
    assert m.prefix_cache_hit_rate == (0 + 8 + 8) / 27


def test_eviction_takes_never_used_blocks_first_then_least_recently_freed_tail_first():
    m = BlockSpaceManager(2, 6, watermark=0.0, enable_prefix_caching=True)
    run_to_completion(m, 0, [1, 2, 3, 4, 5], [])  # blocks 0, 1 cached, 2 partial
    run_to_completion(m, 1, [7, 7, 8, 8, 9], [])  # blocks 3, 4 cached, 5 partial
    assert [b for b in m.gpu_allocator.free_queue() if b in m.prefix_cache] == [1, 0, 4, 3]
    filler = Sequence(
        2, [5, 5, 5], 2
    )  # needs 2 blocks: evicts 2 (partial, uncached) then 1 (tail of seq 0)
    m.allocate_slots(filler)
    assert m.get_block_table(filler) == [2, 1]
    assert 1 not in m.prefix_cache and 0 in m.prefix_cache, "the tail is evicted before the head"
    m.free(filler)
    again = Sequence(3, [1, 2, 3, 4, 5], 2)
    m.allocate_slots(again)
    assert again.num_cached_tokens == 2, "the head block survived; its evicted child is a miss"


def test_reset_prefix_cache_only_when_nothing_is_in_use():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True)
    s = Sequence(0, list(range(1, 10)), 4)
    m.allocate_slots(s)
    assert reset_prefix_cache(m) is False and len(m.prefix_cache) == 2, "in use: nothing changes"
    m.free(s)
    assert reset_prefix_cache(m) is True and len(m.prefix_cache) == 0
    again = Sequence(1, list(range(1, 10)), 4)
    m.allocate_slots(again)
    assert again.num_cached_tokens == 0


def test_decode_blocks_are_cached_when_they_fill():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True)
    run_to_completion(m, 0, [1, 2, 3, 4, 5, 6], [7, 8, 9])  # decode filled block 1: [5, 6, 7, 8]
    s = Sequence(1, [1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    m.allocate_slots(s)
    assert s.num_cached_tokens == 8, "a block completed by decode tokens is a hit"


def test_prefix_cache_insert_rules():
    cache = PrefixCache(4)
    partial = Sequence(0, [1, 2, 3], 4)
    with pytest.raises(ValueError, match="only 0 are full"):
        cache.insert(partial, [0], 0, 1)  # partial blocks are never cached
    two = Sequence(1, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert cache.insert(two, [0, 1], 1, 2) == 0, "a block whose parent is not cached is not cached"
    assert cache.insert(two, [0, 1], 0, 1) == 1 and 0 in cache
    assert cache.insert(Sequence(2, [1, 2, 3, 4], 4), [5], 0, 1) == 1, (
        "a duplicate block is kept as well"
    )
    probe = Sequence(3, [1, 2, 3, 4, 9], 4)
    assert cache.lookup(probe, 1) in ([0], [5])
    assert cache.evict(0) and not cache.evict(0)
    assert cache.lookup(probe, 1) == [5]
    assert cache.lookup(probe, 0) == [], "max_blocks bounds the hit"


def test_each_full_block_is_hashed_once_across_lookups_allocation_and_decode():
    calls = []

    def counting_hash(parent, tokens):
        calls.append(tokens)
        return hash((parent, tokens))

    m = BlockSpaceManager(4, 16, watermark=0.0, enable_prefix_caching=True, hash_fn=counting_hash)
    seq = Sequence(0, list(range(1, 11)), 4)  # 10 tokens: 2 full blocks
    m.prefix_cache.update_hashes(seq)  # the first lookup
    assert len(calls) == 2, "the prompt's 2 full blocks are hashed once each"
    m.allocate_slots(seq, None, m.get_computed_blocks(seq))
    assert len(calls) == 2, "get_computed_blocks and allocate_slots reuse the keys: no hashing"
    for t in (11, 12, 13, 14, 15, 16):  # block 2 fills at token 12, block 3 at token 16
        seq.append_token_id(t)
        m.allocate_slots(seq)
    assert calls[2:] == [(9, 10, 11, 12), (13, 14, 15, 16)], (
        "each decode block is hashed once, when it fills"
    )
    assert len(m.prefix_cache) == 4, "all 4 full blocks are cached"
    again = Sequence(1, list(range(1, 17)) + [99], 4)
    m.allocate_slots(again)
    assert again.num_cached_tokens == 16, "the 4 cached blocks hit with the keys hashed once"


def test_fork_copies_the_keys_and_the_child_extends_its_own():
    m = BlockSpaceManager(4, 16, watermark=0.0, enable_prefix_caching=True)
    parent = Sequence(0, [1, 2, 3, 4, 5, 6], 4)
    m.allocate_slots(parent)
    child = parent.fork(1)
    m.fork(parent, child)
    assert (
        child.block_hashes is not parent.block_hashes and child.block_hashes == parent.block_hashes
    )
    for seq, t in ((parent, 7), (child, 70)):
        seq.append_token_id(t)
        m.allocate_slots(seq)
        seq.append_token_id(8)
        m.allocate_slots(seq)
    assert parent.block_hashes[1] != child.block_hashes[1], (
        "diverged second blocks get their own keys"
    )
    assert child.block_hashes == hash_blocks(child.token_ids, 4, []), (
        "the child's keys are its tokens' keys"
    )
    reused = Sequence(2, [1, 2, 3, 4, 5, 6, 70, 8, 0], 4)
    m.allocate_slots(reused)
    assert reused.num_cached_tokens == 8, "the child's own second block is cached under its key"
