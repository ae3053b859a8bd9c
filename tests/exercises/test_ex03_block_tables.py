"""Graded: chapter 03, slot mapping and gather-based paged attention (exercises/ex03_block_tables.py).

References are written here in plain Python (the slot formula, one token at a time) and with
``scaled_dot_product_attention`` on the clean K/V. Inputs are signed and random, the pool's unused
slots hold NaN (or inf, or 1e4), block tables are shuffled and padded with -1, context lengths are
ragged (1, a full block, one past a block, random), and two block sizes are used. The ch03.ex3 tests
replace ``gather_kv`` by the test's own (padding filled with NaN), so ex3 is graded independently of ex2.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

BLOCK_SIZES = (4, 16)


def _slot(table: list[int], p: int, block_size: int) -> int:
    return table[p // block_size] * block_size + p % block_size


def _pool(context_lens, num_kv_heads, head_dim, block_size, seed, fill=float("nan")):
    """A NaN-filled pool holding each sequence's signed random K/V in shuffled blocks; tables padded with -1."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(need) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(need) + 2
    tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
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
        clean.append((k, v))
    return key_cache, value_cache, tables, torch.tensor(context_lens, dtype=torch.int32), clean


def _lens(block_size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [1, block_size, block_size + 1, rng.randint(2, 3 * block_size), rng.randint(2, 3 * block_size)]


def _reference_gather(key_cache, value_cache, block_tables, context_lens):
    """Token by token with the slot formula; padding past each context is NaN (ch03.ex3 must mask it)."""
    block_size = key_cache.shape[1]
    lens = [int(n) for n in context_lens]
    width = max(lens)
    key = torch.full((len(lens), width, *key_cache.shape[2:]), float("nan"), dtype=key_cache.dtype)
    value = key.clone()
    for s, n in enumerate(lens):
        table = block_tables[s].tolist()
        for p in range(n):
            key[s, p] = key_cache[table[p // block_size], p % block_size]
            value[s, p] = value_cache[table[p // block_size], p % block_size]
    valid = torch.arange(width)[None, :] < torch.tensor(lens)[:, None]
    return key, value, valid


@pytest.fixture
def ex3(impl, monkeypatch):
    """The exercise module with ``gather_kv`` replaced by the test's own: ch03.ex3 is graded on its own."""
    ex = impl("ex03_block_tables")
    monkeypatch.setattr(ex, "gather_kv", _reference_gather)
    return ex


def _sdpa(query, clean):
    outs = []
    for s, (k, v) in enumerate(clean):
        q = query[s].float()[None, :, None]
        outs.append(F.scaled_dot_product_attention(q, k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                   enable_gqa=True)[0, :, 0])
    return torch.stack(outs)


# ---------------------------------------------------------------------------------------- ch03.ex1
@pytest.mark.exercise("ch03.ex1", points=2)
def test_slot_mapping_at_block_boundaries(impl):
    # The exact block boundary: bs 4, table [10, 11, 12]; the last token of a length-L sequence.
    ex = impl("ex03_block_tables")
    table = [10, 11, 12]
    for length in range(1, 10):
        got = ex.slot_mapping([table], [length - 1], [1], 4)
        expected = table[(length - 1) // 4] * 4 + (length - 1) % 4
        assert got.tolist() == [expected], f"length {length}: last slot should be {expected}, got {got.tolist()}"
    assert ex.slot_mapping([table], [7], [1], 4).tolist() == [47], "position 7 is offset 3 of block 11: slot 47"


@pytest.mark.exercise("ch03.ex1", points=3)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_slot_mapping_for_a_packed_batch(impl, block_size):
    ex = impl("ex03_block_tables")
    rng = random.Random(block_size)
    pool = list(range(64))
    rng.shuffle(pool)
    tables, starts, counts = [], [], []
    for kind in ["prefill", "decode", "chunk", "decode", "prefill", "empty"]:
        length = rng.randint(1, 3 * block_size)
        table = [pool.pop() for _ in range(-(-length // block_size))]
        start, n = {"prefill": (0, length), "decode": (length - 1, 1), "empty": (length, 0),
                    "chunk": (length // 2, length - length // 2)}[kind]
        tables.append(table)
        starts.append(start)
        counts.append(n)
    got = ex.slot_mapping(tables, starts, counts, block_size)
    expected = [_slot(t, p, block_size) for t, s, n in zip(tables, starts, counts) for p in range(s, s + n)]
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, "slot mapping is an int64 tensor"
    assert got.tolist() == expected, "slot = table[p // block_size] * block_size + p % block_size, sequences in order"
    with pytest.raises(ValueError):
        ex.slot_mapping([[3]], [block_size], [1], block_size)  # position past the table's only block


# ---------------------------------------------------------------------------------------- ch03.ex2
@pytest.mark.exercise("ch03.ex2", points=3)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_gather_kv_through_shuffled_tables(impl, block_size):
    ex = impl("ex03_block_tables")
    lens = _lens(block_size, seed=20 + block_size)
    key_cache, value_cache, tables, context_lens, clean = _pool(lens, 2, 8, block_size, seed=block_size)
    key, value, valid = ex.gather_kv(key_cache, value_cache, tables, context_lens)
    assert key.shape[0] == len(lens) and key.shape[1] >= max(lens) and key.shape[2:] == (2, 8), \
        f"key must be [num_seqs, L >= {max(lens)}, kv_heads, head_dim], got {list(key.shape)}"
    assert value.shape == key.shape and valid.shape == key.shape[:2] and valid.dtype == torch.bool
    for s, n in enumerate(lens):
        assert torch.equal(key[s, :n], clean[s][0]), f"sequence {s}: keys of positions 0..{n - 1} differ"
        assert torch.equal(value[s, :n], clean[s][1]), f"sequence {s}: values of positions 0..{n - 1} differ"
        assert valid[s, :n].all() and not valid[s, n:].any(), f"sequence {s}: valid must be p < {n}"


# ---------------------------------------------------------------------------------------- ch03.ex3
@pytest.mark.exercise("ch03.ex3", points=4)
@pytest.mark.timeout(60)  # the first SDPA call warms torch up: 5.3 s on a cold 2-vCPU machine (0.5 s warm)
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_attention_matches_sdpa(ex3, block_size, group):
    lens = _lens(block_size, seed=block_size * group)
    key_cache, value_cache, tables, context_lens, clean = _pool(lens, 2, 16, block_size, seed=group)
    query = torch.randn(len(lens), 2 * group, 16, generator=torch.Generator().manual_seed(99))
    out = ex3.paged_attention_decode(query, key_cache, value_cache, tables, context_lens)
    assert out.shape == query.shape and out.dtype == torch.float32
    assert torch.isfinite(out).all(), "NaN stored past a context leaked into the output"
    torch.testing.assert_close(out, _sdpa(query, clean), atol=2e-6, rtol=1e-5,
                               msg=f"decode attention differs from SDPA (GQA group {group}, block size {block_size})")


@pytest.mark.exercise("ch03.ex3", points=2)
@pytest.mark.parametrize("fill", [float("inf"), 1e4])
def test_paged_attention_ignores_garbage_past_the_context(ex3, fill):
    # Garbage past the context must never reach the output: context 5 over table [3, 1] (bs 4): slots 5..7 of
    # block 1 hold garbage.
    gen = torch.Generator().manual_seed(11)
    key_cache = torch.full((4, 4, 2, 16), fill)
    value_cache = key_cache.clone()
    k, v = torch.randn(5, 2, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    for p in range(5):
        key_cache[[3, 1][p // 4], p % 4], value_cache[[3, 1][p // 4], p % 4] = k[p], v[p]
    query = torch.randn(1, 2, 16, generator=gen)
    out = ex3.paged_attention_decode(query, key_cache, value_cache, torch.tensor([[3, 1]], dtype=torch.int32),
                                    torch.tensor([5], dtype=torch.int32))
    assert torch.isfinite(out).all(), f"{fill} stored past the context reached the output"
    torch.testing.assert_close(out, _sdpa(query, [(k, v)]), atol=2e-6, rtol=1e-5)


@pytest.mark.exercise("ch03.ex3", points=2)
def test_paged_attention_fp16_accumulates_in_fp32(ex3):
    # fp16 scores must not overflow: raw dot products of 65536 exceed fp16's range; the output must be 2.0
    # everywhere, in fp16.
    key_cache = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16)
    value_cache = torch.full((2, 4, 1, 64), float("nan"), dtype=torch.float16)
    for p in range(3):
        value_cache[1, p] = p + 1.0
    query = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
    out = ex3.paged_attention_decode(query, key_cache, value_cache, torch.tensor([[1, -1]], dtype=torch.int32),
                                    torch.tensor([3], dtype=torch.int32))
    assert out.dtype == torch.float16, f"return the query dtype, got {out.dtype}"
    assert torch.equal(out, torch.full_like(out, 2.0)), f"expected 2.0 everywhere, got {out.unique().tolist()}"
