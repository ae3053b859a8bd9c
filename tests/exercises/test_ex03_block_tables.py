"""Graded: chapter 03, three engine parts on the paged KV pool (exercises/ex03_block_tables.py).

References are written here in plain Python: the slot formula one token at a time, and attention one
sequence and one head at a time in float64. Inputs are signed and random; every pool slot that no
sequence uses holds NaN (or inf, or 1e4); block tables are shuffled, and their unused entries hold -1
padding and stale ids of blocks beyond the pool; context lengths are ragged (1, a full block, one past a
block, random); two block sizes; GQA groups 1, 2, 4 and 7; an explicit softmax scale that is not
``head_dim ** -0.5``; float32, float16 and bfloat16. The ch03.ex4 tests (the attention) replace
``gather_kv`` by the test's own, whose padding is NaN, so that ch03.ex4 is graded on its own; one more
test runs the whole part with your ``gather_kv``.
"""

from __future__ import annotations

import random

import pytest
import torch

BLOCK_SIZES = (4, 16)
SCALE = 0.37  # deliberately not head_dim ** -0.5 (= 0.25 for head_dim 16)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


def _slot(table: list[int], p: int, block_size: int) -> int:
    return table[p // block_size] * block_size + p % block_size


def _pool(
    context_lens, num_kv_heads, head_dim, block_size, seed, fill=float("nan"), dtype=torch.float32
):
    """A pool filled with ``fill`` holding each sequence's signed random K/V in shuffled blocks.

    Unused table entries hold -1, a stale id just past the pool, or one far past it."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(need) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(need) + 2
    junk = [-1, num_blocks + 2, 10**6]
    tables = torch.tensor(
        [[junk[(s + j) % 3] for j in range(width)] for s in range(len(context_lens))],
        dtype=torch.int32,
    )
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), fill)
    value_cache = key_cache.clone()
    clean = []
    for s, n in enumerate(context_lens):
        table = [ids.pop() for _ in range(need[s])]
        tables[s, : need[s]] = torch.tensor(table, dtype=torch.int32)
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        for p in range(n):
            key_cache[table[p // block_size], p % block_size] = k[p]
            value_cache[table[p // block_size], p % block_size] = v[p]
        clean.append((k.to(dtype), v.to(dtype)))
    return (
        key_cache.to(dtype),
        value_cache.to(dtype),
        tables,
        torch.tensor(context_lens, dtype=torch.int32),
        clean,
    )


def _lens(block_size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [
        1,
        block_size,
        block_size + 1,
        rng.randint(2, 3 * block_size),
        rng.randint(2, 3 * block_size),
    ]


def _reference_gather(key_cache, value_cache, block_tables, context_lens):
    """Token by token with the slot formula; every position past a context is NaN (ch03.ex4 must mask it)."""
    block_size = key_cache.shape[1]
    lens = [int(n) for n in context_lens]
    width = max(lens) + 3  # not W * block_size: use the shapes you are given
    key = torch.full((len(lens), width, *key_cache.shape[2:]), float("nan"), dtype=key_cache.dtype)
    value = key.clone()
    for s, n in enumerate(lens):
        table = block_tables[s].tolist()
        for p in range(n):
            key[s, p] = key_cache[table[p // block_size], p % block_size]
            value[s, p] = value_cache[table[p // block_size], p % block_size]
    valid = torch.arange(width)[None, :] < torch.tensor(lens)[:, None]
    return key, value, valid


def _naive(query, clean, scale, num_kv_heads):
    """float64, one sequence and one query head at a time; query head h reads KV head h // group."""
    num_seqs, num_heads, head_dim = query.shape
    group = num_heads // num_kv_heads
    out = torch.zeros(num_seqs, num_heads, head_dim, dtype=torch.float64)
    for s, (k, v) in enumerate(clean):
        for h in range(num_heads):
            kh, vh = k[:, h // group].double(), v[:, h // group].double()
            out[s, h] = torch.softmax(kh @ query[s, h].double() * scale, 0) @ vh
    return out


def _assert_close(out, expected, dtype, what):
    err = (out.double() - expected).abs().max().item()
    assert err < TOL[dtype], (
        f"{what}: max |out - reference| = {err:.3g} (tolerance {TOL[dtype]:g} in {dtype})"
    )


@pytest.fixture
def ex4(impl, monkeypatch):
    """The exercise module with ``gather_kv`` replaced by the test's own: ch03.ex4 is graded on its own."""
    ex = impl("ex03_block_tables")
    monkeypatch.setattr(ex, "gather_kv", _reference_gather)
    return ex


# ---------------------------------------------------------------------------------------- ch03.ex1
@pytest.mark.exercise("ch03.ex1", points=2)
def test_slot_mapping_at_block_boundaries(impl):
    # The exact block boundary: bs 4, table [10, 11, 12]; the last token of a length-L sequence.
    ex = impl("ex03_block_tables")
    table = [10, 11, 12]
    for length in range(1, 13):
        got = ex.slot_mapping([table], [length - 1], [1], 4)
        expected = table[(length - 1) // 4] * 4 + (length - 1) % 4
        assert list(got) == [expected], (
            f"length {length}: the last token's slot should be {expected}, got {got}"
        )
    assert ex.slot_mapping([table], [7], [2], 4) == [47, 48], (
        "positions 7, 8: offset 3 of block 11, offset 0 of 12"
    )


@pytest.mark.exercise("ch03.ex1", points=2)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_slot_mapping_for_a_packed_batch(impl, block_size):
    # A packed step: whole prompts, decodes, prompt chunks that start mid-block and at a block edge, an idle row.
    ex = impl("ex03_block_tables")
    rng = random.Random(block_size)
    pool = list(range(80))
    rng.shuffle(pool)
    tables, starts, counts = [], [], []
    for kind in ["prefill", "decode", "chunk", "decode", "edge", "prefill", "empty"]:
        length = rng.randint(block_size + 2, 3 * block_size)
        table = [pool.pop() for _ in range(-(-length // block_size))]
        start, n = {
            "prefill": (0, length),
            "decode": (length - 1, 1),
            "empty": (length, 0),
            "chunk": (length // 2 - 1, length - length // 2 + 1),
            "edge": (block_size, length - block_size),
        }[kind]
        tables.append(table)
        starts.append(start)
        counts.append(n)
    got = ex.slot_mapping(tables, starts, counts, block_size)
    expected = [
        _slot(t, p, block_size) for t, s, n in zip(tables, starts, counts) for p in range(s, s + n)
    ]
    assert isinstance(got, list), (
        f"the engine's slot_mapping part returns a list of ints, got {type(got).__name__}"
    )
    assert got == expected, (
        "slot = table[p // block_size] * block_size + p % block_size, sequences in batch order"
    )
    with pytest.raises(ValueError):
        ex.slot_mapping(
            [[3]], [block_size], [1], block_size
        )  # position past the table's only block


# ---------------------------------------------------------------------------------------- ch03.ex2
def _write_case(block_size, seed, dtype=torch.float32, num_kv_heads=2, head_dim=8):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 6
    num_slots = num_blocks * block_size
    key_cache = torch.full(
        (num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype
    )
    value_cache = key_cache.clone()
    slots = torch.randperm(num_slots - 1, generator=gen)[
        : num_slots // 2
    ]  # shuffled; never the pool's last slot
    slots[[1, 4, 5]] = -1  # padding tokens: store nothing (and not at row -1, the last slot)
    key = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen)
    value = torch.randn(len(slots), num_kv_heads, head_dim, generator=gen)
    return key_cache, value_cache, key, value, slots.long()


@pytest.mark.exercise("ch03.ex2", points=2, all_or_nothing=True)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_write_kv_stores_each_token_at_its_slot(impl, block_size):
    ex = impl("ex03_block_tables")
    key_cache, value_cache, key, value, slots = _write_case(block_size, seed=block_size)
    assert ex.write_kv(key_cache, value_cache, key, value, slots) is None, (
        f"block size {block_size}: write_kv writes into the caches in place and returns None"
    )
    written = set()
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        written.add(slot)
        block, offset = slot // block_size, slot % block_size
        assert torch.equal(key_cache[block, offset], key[i]), (
            f"token {i}: its key must sit at slot {slot} = block {block}, offset {offset}"
        )
        assert torch.equal(value_cache[block, offset], value[i]), (
            f"token {i}: its value must sit at slot {slot} = block {block}, offset {offset}"
        )
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        untouched = [
            x
            for x in range(cache.shape[0] * block_size)
            if x not in written and not torch.isnan(cache[x // block_size, x % block_size]).all()
        ]
        assert not untouched, (
            f"{name}: slots {untouched[:5]} were not in the slot mapping but changed "
            "(a slot of -1 stores nothing)"
        )
    with pytest.raises(ValueError):
        ex.write_kv(
            key_cache,
            value_cache,
            key,
            value,
            torch.full_like(slots, key_cache.shape[0] * block_size),
        )


@pytest.mark.exercise("ch03.ex2", points=1, all_or_nothing=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_write_kv_into_one_layer_of_an_engine_pool(impl, dtype):
    # The engine's pool is one tensor [layers, 2, blocks, bs, KVH, D]; a layer's caches are views of it, and the
    # model's K/V may arrive in float32: they are stored in the pool's dtype, in that layer only.
    ex = impl("ex03_block_tables")
    from paged.worker.kv_cache import KVCache

    pool = KVCache(3, 6, 4, 2, 8, dtype=dtype)
    pool.kv.fill_(float("nan"))
    _, _, key, value, slots = _write_case(4, seed=7)
    ex.write_kv(pool.key_cache[1], pool.value_cache[1], key, value, slots)
    keep = slots >= 0
    flat_k = pool.kv[1, 0].reshape(-1, 2, 8)
    flat_v = pool.kv[1, 1].reshape(-1, 2, 8)
    assert torch.equal(flat_k[slots[keep]], key[keep].to(dtype)), (
        "layer 1's keys must be in the pool, in its dtype"
    )
    assert torch.equal(flat_v[slots[keep]], value[keep].to(dtype)), (
        "layer 1's values must be in the pool"
    )
    assert torch.isnan(pool.kv[0]).all() and torch.isnan(pool.kv[2]).all(), (
        "layers 0 and 2 must be untouched"
    )


# ---------------------------------------------------------------------------------------- ch03.ex3
@pytest.mark.exercise("ch03.ex3", points=2)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_gather_kv_through_shuffled_tables(impl, block_size):
    ex = impl("ex03_block_tables")
    lens = _lens(block_size, seed=20 + block_size)
    key_cache, value_cache, tables, context_lens, clean = _pool(
        lens, 2, 8, block_size, seed=block_size
    )
    key, value, valid = ex.gather_kv(key_cache, value_cache, tables, context_lens)
    assert key.shape[0] == len(lens) and key.shape[1] >= max(lens) and key.shape[2:] == (2, 8), (
        f"key must be [num_seqs, L >= {max(lens)}, kv_heads, head_dim], got {list(key.shape)}"
    )
    assert (
        value.shape == key.shape and valid.shape == key.shape[:2] and valid.dtype == torch.bool
    ), "value has key's shape; valid is bool [num_seqs, L]"
    for s, n in enumerate(lens):
        assert torch.equal(key[s, :n], clean[s][0]), (
            f"sequence {s}: keys of positions 0..{n - 1} differ"
        )
        assert torch.equal(value[s, :n], clean[s][1]), (
            f"sequence {s}: values of positions 0..{n - 1} differ"
        )
        assert valid[s, :n].all() and not valid[s, n:].any(), (
            f"sequence {s}: valid must be exactly p < {n}"
        )


@pytest.mark.exercise("ch03.ex3", points=1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gather_kv_ignores_unused_table_entries(impl, dtype):
    # Every row ends in -1 padding and stale ids beyond the pool (pool of 9 blocks; ids 11 and 1000000).
    ex = impl("ex03_block_tables")
    key_cache, value_cache, tables, context_lens, clean = _pool(
        [3, 9, 1], 2, 8, 4, seed=5, dtype=dtype
    )
    assert (tables >= key_cache.shape[0]).any() and (tables < 0).any(), "test set-up: stale entries"
    key, value, valid = ex.gather_kv(key_cache, value_cache, tables, context_lens)
    assert key.dtype == dtype and value.dtype == dtype, f"gathered K/V keep the cache dtype {dtype}"
    for s, n in enumerate([3, 9, 1]):
        assert torch.equal(key[s, :n], clean[s][0]) and torch.equal(value[s, :n], clean[s][1]), (
            f"sequence {s}: K/V of positions 0..{n - 1} differ"
        )


# ---------------------------------------------------------------------------------------- ch03.ex4
@pytest.mark.exercise("ch03.ex4", points=1)
@pytest.mark.parametrize("group", [1, 2, 4, 7])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_decode_attention_matches_reference(ex4, block_size, group):
    lens = _lens(block_size, seed=block_size * group)
    key_cache, value_cache, tables, context_lens, clean = _pool(lens, 2, 16, block_size, seed=group)
    query = torch.randn(len(lens), 2 * group, 16, generator=torch.Generator().manual_seed(99))
    out = ex4.decode_attention(query, key_cache, value_cache, tables, context_lens, SCALE)
    assert out.shape == query.shape and out.dtype == torch.float32, (
        f"output must be [num_seqs, num_heads, head_dim] {list(query.shape)} float32, got {list(out.shape)} {out.dtype}"
    )
    assert torch.isfinite(out).all(), "NaN stored past a context leaked into the output"
    _assert_close(
        out,
        _naive(query, clean, SCALE, 2),
        torch.float32,
        f"GQA group {group} (query head h reads KV head h // {group}), block size {block_size}, "
        f"scale {SCALE}",
    )


@pytest.mark.exercise("ch03.ex4", points=1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_attention_in_half_precision(ex4, dtype):
    lens = [1, 8, 9, 21]
    key_cache, value_cache, tables, context_lens, clean = _pool(lens, 2, 16, 8, seed=3, dtype=dtype)
    query = torch.randn(len(lens), 4, 16, generator=torch.Generator().manual_seed(5)).to(dtype)
    out = ex4.decode_attention(query, key_cache, value_cache, tables, context_lens, 0.3)
    assert out.dtype == dtype, f"return the query dtype {dtype}, got {out.dtype}"
    assert torch.isfinite(out).all(), "NaN stored past a context leaked into the output"
    _assert_close(
        out, _naive(query, clean, 0.3, 2), dtype, f"{dtype} inputs, scale 0.3 (softmax in float32)"
    )


@pytest.mark.exercise("ch03.ex4", points=1)
@pytest.mark.parametrize("fill", [float("inf"), 1e4])
def test_decode_attention_ignores_garbage_past_the_context(ex4, fill):
    # Context 5 over table [3, 1] (bs 4): slots 5..7 of block 1, and every other slot, hold `fill`.
    gen = torch.Generator().manual_seed(11)
    key_cache = torch.full((4, 4, 2, 16), fill)
    value_cache = key_cache.clone()
    k, v = torch.randn(5, 2, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    for p in range(5):
        key_cache[[3, 1][p // 4], p % 4], value_cache[[3, 1][p // 4], p % 4] = k[p], v[p]
    query = torch.randn(1, 2, 16, generator=gen)
    out = ex4.decode_attention(
        query,
        key_cache,
        value_cache,
        torch.tensor([[3, 1, -1]], dtype=torch.int32),
        torch.tensor([5], dtype=torch.int32),
        SCALE,
    )
    assert torch.isfinite(out).all(), f"{fill} stored past the context reached the output"
    _assert_close(
        out, _naive(query, [(k, v)], SCALE, 2), torch.float32, f"{fill} stored past the context"
    )


@pytest.mark.exercise("ch03.ex4", points=2)
def test_decode_attention_fp16_scores_in_fp32(ex4):
    # fp16 scores must not overflow: raw dot products of 65536 exceed fp16's range. All three scores are
    # equal, so the output is the mean of the value rows 1, 2 and 3: 2.0 everywhere, in fp16.
    key_cache = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16)
    value_cache = torch.full((2, 4, 1, 64), float("nan"), dtype=torch.float16)
    for p in range(3):
        value_cache[1, p] = p + 1.0
    query = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
    out = ex4.decode_attention(
        query,
        key_cache,
        value_cache,
        torch.tensor([[1, -1]], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32),
        0.125,
    )
    assert out.dtype == torch.float16, f"return the query dtype, got {out.dtype}"
    assert torch.equal(out, torch.full_like(out, 2.0)), (
        f"expected 2.0 everywhere (equal scores, values 1, 2, 3), got {out.unique().tolist()}"
    )


@pytest.mark.exercise("ch03.ex4", points=1, uses=("ch03.ex3",))
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_decode_attention_part_with_your_gather(impl, block_size):
    # The engine's part as a whole: your gather_kv, then your attention; stale ids and -1 in every table.
    ex = impl("ex03_block_tables")
    lens = _lens(block_size, seed=7 * block_size)
    key_cache, value_cache, tables, context_lens, clean = _pool(
        lens, 2, 16, block_size, seed=block_size + 1
    )
    query = torch.randn(len(lens), 8, 16, generator=torch.Generator().manual_seed(block_size))
    out = ex.decode_attention(query, key_cache, value_cache, tables, context_lens, SCALE)
    assert torch.isfinite(out).all(), "NaN stored past a context leaked into the output"
    _assert_close(
        out,
        _naive(query, clean, SCALE, 2),
        torch.float32,
        f"decode_attention with your gather_kv, GQA group 4, block size {block_size}",
    )
    with pytest.raises(ValueError):
        ex.decode_attention(
            query[:, :3], key_cache, value_cache, tables, context_lens, SCALE
        )  # 3 % 2 heads


# ------------------------------------------- every case at every position of a batch; the inputs left alone
def _rotations(items):
    return [items[k:] + items[:k] for k in range(len(items))]


@pytest.mark.exercise("ch03.ex1", points=2)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_slot_mapping_every_kind_at_every_position(impl, block_size):
    # A chunk across a block edge, a decode on the first slot of a block, an idle row (0 tokens), a whole
    # prompt of exactly two blocks, a decode on the last slot of a block: each at every position of the batch.
    ex = impl("ex03_block_tables")
    bs = block_size
    kinds = [
        ([7, 3, 9], bs - 1, bs + 2),
        ([4, 12], bs, 1),
        ([5, 6], bs + 1, 0),
        ([11, 2], 0, 2 * bs),
        ([8, 0, 10], 2 * bs - 1, 1),
    ]
    for batch in _rotations(kinds):
        tables = [list(t) for t, _, _ in batch]
        starts = [s for _, s, _ in batch]
        counts = [n for _, _, n in batch]
        kept = ([list(t) for t in tables], list(starts), list(counts))
        got = ex.slot_mapping(tables, starts, counts, bs)
        assert (tables, starts, counts) == kept, (
            "slot_mapping changed its inputs (block_tables, start_positions or num_tokens): the "
            "scheduler still reads them after this call"
        )
        expected = [
            _slot(t, p, bs) for t, s, n in zip(tables, starts, counts) for p in range(s, s + n)
        ]
        assert got == expected, (
            f"batch of (start, tokens) {list(zip(starts, counts))}, block size {bs}: slots {got}, "
            f"expected {expected}"
        )


@pytest.mark.exercise("ch03.ex2", points=2, all_or_nothing=True)
def test_write_kv_padding_at_every_position_leaves_its_inputs_alone(impl):
    ex = impl("ex03_block_tables")
    block_size, num_tokens = 4, 6
    for pads in [[p] for p in range(num_tokens)] + [[0, num_tokens - 1], [1, 2, 3]]:
        key_cache, value_cache, key, value, slots = _write_case(block_size, seed=3)
        key, value, slots = key[:num_tokens], value[:num_tokens], slots[:num_tokens].clone()
        slots[slots < 0] = torch.tensor([20, 9, 2])[: int((slots < 0).sum())]
        slots[pads] = -1
        kept = key.clone(), value.clone(), slots.clone()
        ex.write_kv(key_cache, value_cache, key, value, slots)
        for name, t, was in zip(("key", "value", "slot_mapping"), (key, value, slots), kept):
            assert torch.equal(t, was), f"write_kv changed its input {name}"
        flat_k = key_cache.view(-1, *key_cache.shape[2:])
        flat_v = value_cache.view(-1, *value_cache.shape[2:])
        for i, slot in enumerate(slots.tolist()):
            if slot >= 0:
                assert torch.equal(flat_k[slot], key[i]) and torch.equal(flat_v[slot], value[i]), (
                    f"padding at positions {pads}: token {i} must be stored at slot {slot}"
                )
        real = {s for s in slots.tolist() if s >= 0}
        changed = [
            x
            for x in range(flat_k.shape[0])
            if x not in real and not (torch.isnan(flat_k[x]).all() and torch.isnan(flat_v[x]).all())
        ]
        assert not changed, (
            f"padding (-1) at positions {pads} of the batch: slots {changed} changed, but no token "
            "maps to them"
        )


@pytest.mark.exercise("ch03.ex3", points=2)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_gather_kv_long_sequence_at_every_position_leaves_its_inputs_alone(impl, block_size):
    ex = impl("ex03_block_tables")
    for lens in _rotations([1, 3 * block_size + 1, block_size, block_size + 1]):
        key_cache, value_cache, tables, context_lens, clean = _pool(
            lens, 2, 4, block_size, seed=sum(lens) + lens[0]
        )
        kept = [t.clone() for t in (key_cache, value_cache, tables, context_lens)]
        key, value, valid = ex.gather_kv(key_cache, value_cache, tables, context_lens)
        for name, t, was in zip(
            ("key_cache", "value_cache", "block_tables", "context_lens"),
            (key_cache, value_cache, tables, context_lens),
            kept,
        ):
            assert (
                torch.equal(t, was)
                or (t.isnan() == was.isnan()).all()
                and torch.equal(t.nan_to_num(), was.nan_to_num())
            ), f"gather_kv changed its input {name} (context lengths {lens})"
        for s, n in enumerate(lens):
            assert torch.equal(key[s, :n], clean[s][0]) and torch.equal(
                value[s, :n], clean[s][1]
            ), f"context lengths {lens}: sequence {s} (length {n}) gathers the wrong K/V"
            assert valid[s, :n].all() and not valid[s, n:].any(), (
                f"context lengths {lens}: valid of sequence {s} must be exactly p < {n}"
            )


@pytest.mark.exercise("ch03.ex4", points=2)
def test_decode_attention_large_scores_leave_its_inputs_alone(ex4):
    # Scores in the hundreds (exp overflows float32 unless the row max is subtracted), a float32 query
    # (``query.float()`` is the query itself, not a copy), each length at every position of the batch.
    for lens in _rotations([1, 5, 8, 13]):
        key_cache, value_cache, tables, context_lens, clean = _pool(lens, 2, 16, 4, seed=lens[0])
        query = torch.randn(len(lens), 4, 16, generator=torch.Generator().manual_seed(2)) * 60
        kept = [t.clone() for t in (query, tables, context_lens)]
        out = ex4.decode_attention(query, key_cache, value_cache, tables, context_lens, SCALE)
        for name, t, was in zip(
            ("query", "block_tables", "context_lens"), (query, tables, context_lens), kept
        ):
            assert torch.equal(t, was), (
                f"decode_attention changed its input {name} (scale a copy, not the caller's query)"
            )
        assert torch.isfinite(out).all(), (
            f"context lengths {lens}, scores in the hundreds: NaN/inf in the output (subtract the row max "
            "before exp, as torch.softmax does)"
        )
        err = (out.double() - _naive(query, clean, SCALE, 2)).abs().max().item()
        assert err < 1e-3, f"context lengths {lens}, scores in the hundreds: off by {err:.3g}"
