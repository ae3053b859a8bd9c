"""``paged.worker.kv_cache.KVCache``: layout, copy-on-write copies, swapping, sizing; the checked write by slot
mapping of ``paged_course.reference.write_kv_checked``."""

from __future__ import annotations

import pytest
import torch

from paged.worker.kv_cache import KVCache, block_bytes
from paged_course.reference import kv_cache_from_budget, paged_attention_gather, write_kv_checked
from paged_course.reference.memory import KVSpec


def small_cache(**kw) -> KVCache:
    args = dict(
        num_layers=2, num_blocks=6, block_size=4, num_kv_heads=2, head_dim=8, num_cpu_blocks=3
    )
    args.update(kw)
    return KVCache(**args)


def signed(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_layout_and_views():
    cache = small_cache()
    assert cache.kv.shape == (2, 2, 6, 4, 2, 8)
    assert cache.key_cache[1].shape == (6, 4, 2, 8) and cache.value_cache[0].shape == (6, 4, 2, 8)
    assert cache.key_cache[1].data_ptr() == cache.kv[1, 0].data_ptr(), (
        "per-layer caches must be views of the pool"
    )
    assert cache.key_cache[0].is_contiguous() and cache.key_cache[0][3].is_contiguous(), (
        "one block of one layer must be one contiguous chunk"
    )
    assert cache.bytes == 2 * 2 * 6 * 4 * 2 * 8 * 4 == 6144
    assert (
        cache.bytes // cache.num_blocks == 1024
        and cache.cpu_kv.numel() * cache.cpu_kv.element_size() == 3 * 1024
    )


def test_write_by_slot_mapping_skips_minus_one():
    cache = small_cache()
    key, value = signed(5, 2, 8, seed=1), signed(5, 2, 8, seed=2)
    # table [5, 2], positions 0..4 -> slots 20, 21, 22, 23, 8; the 4th token is skipped (-1).
    slots = torch.tensor([20, 21, 22, -1, 8])
    write_kv_checked(cache, 1, key, value, slots)
    assert torch.equal(cache.key_cache[1][5, :3], key[:3]) and torch.equal(
        cache.value_cache[1][2, 0], value[4]
    )
    assert torch.equal(cache.key_cache[1][5, 3], torch.zeros(2, 8)), "slot -1 must not be written"
    assert cache.kv[0].abs().sum() == 0, "layer 0 must be untouched"
    written = cache.kv[1].abs().sum(dim=(-1, -2)).ne(0).sum().item()
    assert written == 2 * 4, f"exactly 4 slots of K and of V must change, got {written}"


def test_written_kv_feeds_the_attention_reference():
    cache = small_cache(num_layers=1, num_blocks=8)
    table, n = [6, 1, 3], 9
    key, value = signed(n, 2, 8, seed=3), signed(n, 2, 8, seed=4)
    slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in range(n)])
    write_kv_checked(cache, 0, key, value, slots)
    q = signed(1, 4, 8, seed=5)
    out = paged_attention_gather(
        q,
        cache.key_cache[0],
        cache.value_cache[0],
        torch.tensor([table], dtype=torch.int32),
        torch.tensor([n], dtype=torch.int32),
    )
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], key.transpose(0, 1)[None], value.transpose(0, 1)[None], enable_gqa=True
    )[:, :, 0]
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def _bad_writes():
    k, v, s = signed(3, 2, 8), signed(3, 2, 8), torch.tensor([0, 5, 9])
    return [
        ("layer", (2, k, v, s), r"layer must be in \[0, 2\), got 2"),
        ("dtype", (0, k.half(), v, s), "key dtype torch.float16 != pool dtype torch.float32"),
        ("device", (0, k, v.to("meta"), s), "value is on meta, the pool on cpu"),
        ("heads", (0, signed(3, 4, 8), v, s), r"key must be \[num_tokens, 2, 8\], got \[3, 4, 8\]"),
        ("tokens", (0, k, v[:2], s), "key has 3 tokens, value 2"),
        ("slots len", (0, k, v, s[:2]), r"slot_mapping must be \[num_tokens=3\], got \[2\]"),
        ("slots dtype", (0, k, v, s.float()), "slot_mapping must be int64 or int32"),
        ("slot high", (0, k, v, torch.tensor([0, 24, 1])), r"slot 24 outside \[-1, 24\)"),
        ("slot low", (0, k, v, torch.tensor([0, -2, 1])), r"slot -2 outside \[-1, 24\)"),
        ("repeat", (0, k, v, torch.tensor([7, 3, 7])), "writes a slot twice"),
    ]


@pytest.mark.parametrize("case", _bad_writes(), ids=lambda c: c[0])
def test_bad_write_raises_and_leaves_pool_unchanged(case):
    cache = small_cache()
    cache.kv.copy_(signed(*cache.kv.shape, seed=9))
    before = cache.kv.clone()
    _, args, message = case
    with pytest.raises(ValueError, match=message):
        write_kv_checked(cache, *args)
    assert torch.equal(cache.kv, before), "the pool changed although write() raised"


def test_copy_blocks_all_layers_one_call():
    cache = small_cache()
    cache.kv.copy_(signed(*cache.kv.shape, seed=6))
    before = cache.kv.clone()
    cache.copy_blocks([(1, 4), (3, 0)])
    assert torch.equal(cache.kv[:, :, 4], before[:, :, 1]) and torch.equal(
        cache.kv[:, :, 0], before[:, :, 3]
    )
    untouched = [1, 2, 3, 5]
    assert torch.equal(cache.kv[:, :, untouched], before[:, :, untouched]), (
        "only destination blocks may change"
    )
    cache.copy_blocks([])
    assert torch.equal(cache.kv[:, :, untouched], before[:, :, untouched])


@pytest.mark.parametrize(
    "pairs, message",
    [
        ([(1, 6)], r"destination block 6 outside \[0, 6\)"),
        ([(-1, 2)], r"source block -1 outside \[0, 6\)"),
        ([(1, 2), (3, 2)], "destination block appears twice"),
        ([(1, 2), (2, 3)], r"blocks \[2\] are both source and destination"),
    ],
)
def test_copy_blocks_bad_pairs(pairs, message):
    cache = small_cache()
    cache.kv.copy_(signed(*cache.kv.shape, seed=7))
    before = cache.kv.clone()
    with pytest.raises(ValueError, match=message):
        cache.copy_blocks(pairs)
    assert torch.equal(cache.kv, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swap_round_trip_restores_identical_bytes(dtype):
    cache = small_cache(dtype=dtype)
    cache.kv.copy_(signed(*cache.kv.shape, seed=8).to(dtype))
    original = cache.kv[:, :, [2, 5]].clone()
    cache.swap_out([(2, 0), (5, 2)])
    assert torch.equal(cache.cpu_kv[:, :, 0], original[:, :, 0])
    assert torch.equal(cache.cpu_kv[:, :, 2], original[:, :, 1])
    cache.kv[:, :, [2, 5]] = float("nan")  # the device blocks get reused by someone else
    cache.swap_in([(0, 1), (2, 4)])  # come back into other blocks
    got = torch.stack([cache.kv[:, :, 1], cache.kv[:, :, 4]], dim=2)
    assert got.contiguous().view(torch.uint8).equal(original.view(torch.uint8)), (
        "swap must restore identical bytes"
    )


def test_swap_errors():
    cache = small_cache()
    with pytest.raises(ValueError, match=r"swap_out: destination block 3 outside \[0, 3\)"):
        cache.swap_out([(0, 3)])
    with pytest.raises(ValueError, match=r"swap_in: source block 5 outside \[0, 3\)"):
        cache.swap_in([(5, 0)])
    no_cpu = small_cache(num_cpu_blocks=0)
    with pytest.raises(ValueError, match=r"destination block 0 outside \[0, 0\)"):
        no_cpu.swap_out([(1, 0)])


def test_sizing_from_budget_matches_kvspec():
    spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float16)
    per_block = spec.bytes_per_block(4)
    assert per_block == 2 * 2 * 2 * 8 * 4 * 2 == 512 == block_bytes(2, 2, 8, 4, torch.float16)
    cache = kv_cache_from_budget(10 * 512 + 511, 2, 4, 2, 8, torch.float16, cpu_budget_bytes=1100)
    assert (cache.num_blocks, cache.num_cpu_blocks) == (10, 2)
    assert cache.bytes == 10 * 512 and cache.bytes // cache.num_blocks == 512
    with pytest.raises(ValueError, match="budget_bytes=511 holds no block of 512 bytes"):
        kv_cache_from_budget(511, 2, 4, 2, 8, torch.float16)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"block_size": 0}, "block_size must be an integer >= 1, got 0"),
        ({"num_blocks": -3}, "num_blocks must be an integer >= 1, got -3"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks must be an integer >= 0, got -1"),
        ({"dtype": torch.int32}, "dtype must be a floating torch.dtype"),
    ],
)
def test_bad_sizes(kw, message):
    with pytest.raises(ValueError, match=message):
        small_cache(**kw)


@pytest.mark.gpu
def test_cuda_pool_uses_pinned_cpu_memory_and_round_trips():
    cache = small_cache(device="cuda")
    assert cache.cpu_kv.is_pinned()
    cache.kv.copy_(signed(*cache.kv.shape, seed=10).cuda())
    original = cache.kv[:, :, 3].clone()
    cache.swap_out([(3, 1)])
    cache.kv[:, :, 3] = 0
    cache.swap_in([(1, 3)])
    assert torch.equal(cache.kv[:, :, 3], original)
