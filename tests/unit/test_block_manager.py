"""BlockSpaceManager: watermark, allocate_slots (admit / grow, blocks or None) / fork / COW / free / swap,
bad input, and a property test that replays random operations against a shadow KV pool (every slot
holds the prefix it was computed for), with and without prefix caching, with a strong and a
deliberately weak block hash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.core.block_manager import AllocStatus, BlockSpaceManager, NewBlocks
from paged.core.sequence import Sequence
from paged_course.engine_views import reset_prefix_cache, slot


def weak_hash(parent, tokens):
    return (parent * 7 + sum(tokens)) % 5


def snapshot(m: BlockSpaceManager):
    cache = m.prefix_cache
    return (
        m.gpu_allocator.free_queue(),
        list(m.gpu_allocator._ref_counts),
        m.swap.allocator.free_queue(),
        list(m.swap.allocator._ref_counts),
        {k: (list(t.block_ids), t.num_tokens) for k, t in m.block_tables.items()},
        {k: (list(t.block_ids), t.num_tokens) for k, t in m.cpu_block_tables.items()},
        dict(cache._by_block) if cache else None,
    )


def test_watermark_applies_to_admissions_only():
    m = BlockSpaceManager(4, num_gpu_blocks=100, watermark=0.05)  # watermark_blocks = 5
    assert m.watermark_blocks == 5
    assert not m.can_ever_fit(4 * 96), "96 blocks > 100 - 5"
    assert m.can_ever_fit(4 * 95) and m.can_ever_fit(4 * 95 - 3), "95 blocks leave exactly 5"
    running = Sequence(1, [1] * 4 * 90, 4)
    assert m.allocate_slots(running) == NewBlocks(list(range(90)))  # 10 free
    before = snapshot(m)
    assert m.allocate_slots(Sequence(2, [1] * 4 * 6, 4)) is None, "10 - 6 < 5: not now"
    assert snapshot(m) == before, "None changes nothing"
    assert m.allocate_slots(Sequence(2, [1] * 4 * 5, 4)) is not None, "10 - 5 >= 5"
    running.token_ids.extend([1] * 4 * 5)
    assert m.allocate_slots(running) is not None, "growth may take the last 5 blocks"
    assert m.get_num_free_gpu_blocks() == 0
    assert not AllocStatus.LATER and not AllocStatus.NEVER and AllocStatus.OK, "truthy only when OK"


def test_allocate_append_and_free_count_blocks():
    m = BlockSpaceManager(4, 8)
    s = Sequence(0, [1, 2, 3, 4, 5], 4)
    assert m.allocate_slots(s) == NewBlocks([0, 1])
    assert m.get_block_table(s) == [0, 1] and m.get_num_free_gpu_blocks() == 6
    for t, expected_blocks in ((6, 2), (7, 2), (8, 2), (9, 3)):
        s.append_token_id(t)
        new = m.allocate_slots(s, 1)
        assert new.copies == [], "no copy for an unshared sequence"
        assert new.block_ids == ([2] if t == 9 else []), (
            "a new block only when the last one is full"
        )
        assert len(m.get_block_table(s)) == expected_blocks, (
            f"{len(s)} tokens need {expected_blocks} blocks"
        )
    m.free(s)
    assert m.get_num_free_gpu_blocks() == 8
    assert m.gpu_allocator.free_queue()[-3:] == [2, 1, 0], "freed tail first"
    m.free(s)  # freeing again is a no-op, as in vLLM


def test_case3_partial_tail_block_is_copied_on_write():
    m = BlockSpaceManager(4, 8)
    parent = Sequence(0, [10, 11, 12, 13, 14, 15], 4)
    m.allocate_slots(parent)
    child = parent.fork(1)
    m.fork(parent, child)
    full, tail = m.get_block_table(parent)
    assert m.gpu_allocator.ref_count(full) == 2 and m.gpu_allocator.ref_count(tail) == 2, (
        "all blocks shared"
    )
    parent.append_token_id(100)
    child.append_token_id(200)
    assert m.allocate_slots(parent) == NewBlocks([], [(tail, 2)]), (
        "the first writer copies the shared partial block"
    )
    assert m.allocate_slots(child) == NewBlocks(), "the last holder writes in place"
    assert m.get_block_table(parent) == [full, 2] and m.get_block_table(child) == [full, tail]
    assert m.gpu_allocator.ref_count(full) == 2, "the full block stays shared"
    assert m.gpu_allocator.ref_count(tail) == 1 and m.gpu_allocator.ref_count(2) == 1
    m.free(parent)
    m.free(child)
    assert all(m.gpu_allocator.ref_count(b) == 0 for b in range(8)), "every ref count back to 0"


def test_no_copy_when_the_shared_last_block_is_full():
    m = BlockSpaceManager(4, 8)
    parent = Sequence(0, [1, 2, 3, 4], 4)
    m.allocate_slots(parent)
    child = parent.fork(1)
    m.fork(parent, child)
    child.append_token_id(9)
    assert m.allocate_slots(child) == NewBlocks([1]) and m.get_block_table(child) == [0, 1]


def test_swap_out_and_in_copy_shared_blocks_once():
    m = BlockSpaceManager(4, 8, num_cpu_blocks=4)
    a = Sequence(0, [1, 2, 3, 4, 5, 6], 4)
    m.allocate_slots(a)
    b = a.fork(1)
    m.fork(a, b)
    assert m.swap_out(a) == [(0, 0), (1, 1)]
    assert m.swap_out(b) == [], "the sibling reuses the CPU copies"
    assert m.get_num_free_gpu_blocks() == 8 and m.get_num_free_cpu_blocks() == 2
    assert m.swap_in(a) == [(0, 2), (1, 3)]
    assert m.swap_in(b) == [] and m.get_block_table(b) == [2, 3]
    assert m.gpu_allocator.ref_count(2) == 2 and m.get_num_free_cpu_blocks() == 4
    m.free(a)
    m.free(b)
    assert m.get_num_free_gpu_blocks() == 8


def test_swap_copy_is_not_reused_after_the_block_was_written():
    m = BlockSpaceManager(4, 8, num_cpu_blocks=4)
    a = Sequence(0, [1, 2], 4)
    m.allocate_slots(a)
    b = a.fork(1)
    m.fork(a, b)
    assert m.swap_out(a) == [(0, 0)]
    b.append_token_id(7)
    assert m.allocate_slots(b) == NewBlocks(), "b is the only GPU holder now: written in place"
    assert m.swap_out(b) == [(0, 1)], "the old CPU copy is stale: copy again"


def test_bad_input_raises_and_changes_nothing():
    for kwargs, msg in (
        ({"block_size": 0, "num_gpu_blocks": 4}, "block_size"),
        ({"block_size": 4, "num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"block_size": 4, "num_gpu_blocks": 4, "num_cpu_blocks": -1}, "num_cpu_blocks"),
        ({"block_size": 4, "num_gpu_blocks": 4, "watermark": 1.0}, "watermark"),
    ):
        with pytest.raises(ValueError, match=msg):
            BlockSpaceManager(**kwargs)
    m = BlockSpaceManager(4, 4)
    s = Sequence(0, [1] * 5, 4)
    m.allocate_slots(s)
    before = snapshot(m)
    with pytest.raises(
        ValueError, match="sequence 0 has blocks: computed blocks are for admission"
    ):
        m.allocate_slots(s, 0, computed=[3])
    assert m.allocate_slots(Sequence(1, [1] * 9, 4)) is None, "3 blocks needed, 2 free"
    with pytest.raises(ValueError, match="fork: child sequence 0 already has blocks"):
        m.fork(s, s)
    with pytest.raises(ValueError, match="fork: parent sequence 7 has no GPU blocks"):
        m.fork(Sequence(7, [1], 4), Sequence(8, [1], 4))
    assert m.swap_out(s) is None, "no CPU swap space"
    with pytest.raises(ValueError, match="slots for 6 tokens asked; it has 5 tokens and 5 slots"):
        m.allocate_slots(s, 1)
    s.token_ids.extend([1] * 12)  # 17 tokens: 3 more blocks than s has, 2 free
    assert m.allocate_slots(s) is None
    assert snapshot(m) == before, "state unchanged after every None and every error"
    s.token_ids[13:] = []  # 13 tokens: 2 more blocks
    assert m.allocate_slots(s) == NewBlocks([2, 3])
    m.free(s)
    with pytest.raises(ValueError, match="not swapped out"):
        m.swap_in(s)


def test_one_prefix_lookup_per_admission():
    m = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True)
    calls = []
    lookup = m.prefix_cache.lookup
    m.prefix_cache.lookup = lambda *args: calls.append(args) or lookup(*args)
    m.allocate_slots(Sequence(0, list(range(1, 10)), 4))
    assert len(calls) == 1, "allocate_slots without computed blocks looks the prefix up once"
    seq = Sequence(1, list(range(1, 12)), 4)
    computed = m.get_computed_blocks(seq)
    assert computed == [0, 1] and len(calls) == 2
    assert m.allocate_slots(seq, 3, computed) == NewBlocks([0, 1, 3])
    assert len(calls) == 2, "the computed blocks passed in are not looked up again"
    assert seq.num_cached_tokens == seq.num_computed_tokens == 8


# ---- property test: random operations against a shadow KV pool -------------------------------------

PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [4, 3, 2, 1, 5, 6, 7, 8], [6]]


class Shadow:
    """Slot contents as the engine would write them: the slot of position p holds tuple(tokens[:p + 1])."""

    def __init__(self, m: BlockSpaceManager):
        self.m, self.gpu, self.cpu = m, {}, {}

    def copy(self, pairs, src_pool, dst_pool):
        bs = self.m.block_size
        for src, dst in pairs:
            for off in range(bs):
                dst_pool[dst * bs + off] = src_pool.get(src * bs + off)

    def write(self, seq, start):
        table = self.m.block_tables[seq.seq_id]
        for p in range(start, len(seq)):
            self.gpu[slot(table, p)] = tuple(seq.token_ids[: p + 1])

    def check(self, seqs, upto=None):
        for seq in seqs:
            table = self.m.block_tables.get(seq.seq_id)
            for p in range(upto if upto is not None else table.num_tokens if table else 0):
                assert self.gpu.get(slot(table, p)) == tuple(seq.token_ids[: p + 1]), (
                    f"seq {seq.seq_id} position {p}: its slot holds another sequence's K/V"
                )


def check_invariants(m: BlockSpaceManager, seqs):
    for alloc, tables in (
        (m.gpu_allocator, m.block_tables),
        (m.swap.allocator, m.cpu_block_tables),
    ):
        holders = [0] * alloc.num_blocks
        for table in tables.values():
            for b in table:
                holders[b] += 1
        assert [alloc.ref_count(b) for b in range(alloc.num_blocks)] == holders, (
            "ref count = number of tables holding the block"
        )
        used = sum(1 for h in holders if h)
        assert alloc.num_free_blocks + used == alloc.num_blocks, "free + used = total"
    assert set(m.block_tables) | set(m.cpu_block_tables) <= {s.seq_id for s in seqs}


def run_random(data, m: BlockSpaceManager, steps: int):
    shadow, seqs, next_id = Shadow(m), [], 0
    for _ in range(steps):
        on_gpu = [s for s in seqs if s.seq_id in m.block_tables]
        swapped = [s for s in seqs if s.seq_id in m.cpu_block_tables]
        op = data.draw(
            st.sampled_from(
                ["new", "new", "append", "append", "fork", "free", "swap_out", "swap_in"]
            )
        )
        if op == "new":
            prompt = data.draw(st.sampled_from(PREFIXES)) + data.draw(
                st.lists(st.integers(1, 3), max_size=6)
            )
            seq = Sequence(next_id, prompt, m.block_size)
            next_id += 1
            before = snapshot(m)
            if m.allocate_slots(seq) is None:
                assert snapshot(m) == before, "an admission that returned None changed state"
                continue
            assert seq.num_computed_tokens < len(seq), "the last prompt token is always computed"
            assert seq.num_cached_tokens % m.block_size == 0
            shadow.check(
                [seq], upto=seq.num_computed_tokens
            )  # cached blocks must hold exactly this prefix
            shadow.write(seq, seq.num_computed_tokens)
            seqs.append(seq)
        elif op == "append" and on_gpu:
            seq = data.draw(st.sampled_from(on_gpu))
            seq.append_token_id(data.draw(st.integers(1, 3)))
            old = m.block_tables[seq.seq_id].num_tokens
            before = snapshot(m)
            new = m.allocate_slots(seq)
            if new is not None:
                shadow.copy(new.copies, shadow.gpu, shadow.gpu)
                shadow.write(seq, old)
            else:
                assert snapshot(m) == before, "a growth that returned None changed state"
                seq.token_ids.pop()
        elif op == "fork" and on_gpu:
            child = data.draw(st.sampled_from(on_gpu)).fork(next_id)
            next_id += 1
            m.fork(
                next(
                    s
                    for s in on_gpu
                    if s.seq_id in m.block_tables
                    and s.token_ids == child.token_ids
                    and m.block_tables[s.seq_id].num_tokens == len(child)
                ),
                child,
            )
            seqs.append(child)
        elif op == "free" and seqs:
            seq = data.draw(st.sampled_from(seqs))
            m.free(seq)
            seqs.remove(seq)
        elif op == "swap_out" and on_gpu:
            seq = data.draw(st.sampled_from(on_gpu))
            before = snapshot(m)
            pairs = m.swap_out(seq)
            if pairs is None:
                assert snapshot(m) == before, "a swap-out that returned None changed state"
            else:
                shadow.copy(pairs, shadow.gpu, shadow.cpu)
        elif op == "swap_in" and swapped:
            seq = data.draw(st.sampled_from(swapped))
            pairs = m.swap_in(seq)
            if pairs is not None:
                shadow.copy(pairs, shadow.cpu, shadow.gpu)
        check_invariants(m, seqs)
        shadow.check(seqs)
        for seq in seqs:  # swapped-out sequences: their CPU copies hold their tokens too
            table = m.cpu_block_tables.get(seq.seq_id)
            for p in range(table.num_tokens if table else 0):
                assert shadow.cpu.get(slot(table, p)) == tuple(seq.token_ids[: p + 1]), (
                    "swap copy is stale"
                )
    for seq in seqs:
        m.free(seq)
    assert m.get_num_free_gpu_blocks() == m.num_gpu_blocks, (
        "after all frees every GPU block is free (or cached)"
    )
    assert m.get_num_free_cpu_blocks() == m.num_cpu_blocks, (
        "after all frees every CPU block is free"
    )
    if m.prefix_cache is not None:
        assert set(m.prefix_cache._by_block) <= set(m.gpu_allocator.free_queue()), (
            "cached = evictable"
        )
        assert reset_prefix_cache(m) and len(m.prefix_cache) == 0


@pytest.mark.parametrize(
    "caching,hash_fn",
    [(False, None), (True, None), (True, weak_hash)],
    ids=["no-cache", "cache", "cache-weak-hash"],
)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_operations_keep_invariants(caching, hash_fn, data):
    m = BlockSpaceManager(
        4,
        num_gpu_blocks=12,
        num_cpu_blocks=6,
        watermark=0.0,
        enable_prefix_caching=caching,
        hash_fn=hash_fn,
    )
    run_random(data, m, steps=40)
