"""The reference attentions in ``paged_course.reference`` against ``scaled_dot_product_attention``.

The naive reference here walks each sequence's tokens with the slot formula in Python and calls
SDPA (``enable_gqa=True``) on the clean K/V, so it shares no code with ``paged_course.reference``.
Three corner cases (garbage past the context, fp16 scores that overflow, the GQA head mapping)
are written out with their expected values.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_course.reference import (
    contiguous_attention,
    gather_kv,
    paged_attention,
    paged_attention_blockwise,
    paged_attention_gather,
    select_backend,
)

PAGED = {"gather": paged_attention_gather, "blockwise": paged_attention_blockwise}


def sdpa_reference(query, key_cache, value_cache, block_tables, context_lens, scale=None):
    """fp32 SDPA per sequence over the tokens found with ``table[p // bs] * bs + p % bs``."""
    block_size = key_cache.shape[1]
    flat_k = key_cache.float().flatten(0, 1)  # [num_blocks * bs, KVH, D]: row = slot
    flat_v = value_cache.float().flatten(0, 1)
    outs = []
    for s in range(query.shape[0]):
        table = block_tables[s].tolist()
        slots = [
            table[p // block_size] * block_size + p % block_size
            for p in range(int(context_lens[s]))
        ]
        k = flat_k[slots].transpose(0, 1)[None]  # [1, KVH, L, D]
        v = flat_v[slots].transpose(0, 1)[None]
        q = query[s].float()[None, :, None]  # [1, H, 1, D]
        outs.append(F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)[0, :, 0])
    return torch.stack(outs)


def make_batch(
    context_lens,
    num_heads,
    num_kv_heads,
    head_dim=16,
    block_size=4,
    num_blocks=None,
    dtype=torch.float32,
    seed=0,
    fill=float("nan"),
):
    """Signed random K/V in a pool whose unused slots hold ``fill``; shuffled block tables, -1 padded."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    width = max(need) + 1  # one spare column of -1 that must never be read
    num_blocks = num_blocks or sum(need) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), fill)
    value_cache = torch.full_like(key_cache, fill)
    for s, n in enumerate(context_lens):
        ids = [perm.pop() for _ in range(need[s])]
        tables[s, : need[s]] = torch.tensor(ids, dtype=torch.int32)
        for p in range(n):
            key_cache[ids[p // block_size], p % block_size] = torch.randn(
                num_kv_heads, head_dim, generator=gen
            )
            value_cache[ids[p // block_size], p % block_size] = torch.randn(
                num_kv_heads, head_dim, generator=gen
            )
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=gen)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return query.to(dtype), key_cache.to(dtype), value_cache.to(dtype), tables, lens


@pytest.mark.parametrize("group", [1, 2, 4, 7])
@pytest.mark.parametrize("name", list(PAGED))
def test_paged_references_match_sdpa(name, group):
    bs = 4
    lens = [1, bs, bs + 1, 11]  # one token, exactly one block, one past a block boundary, ragged
    q, kc, vc, bt, cl = make_batch(
        lens, num_heads=2 * group, num_kv_heads=2, block_size=bs, seed=group
    )
    out = PAGED[name](q, kc, vc, bt, cl)
    ref = sdpa_reference(q, kc, vc, bt, cl)
    assert out.shape == (4, 2 * group, 16) and out.dtype == torch.float32
    assert torch.isfinite(out).all(), "NaN from an unused slot leaked into the output"
    torch.testing.assert_close(
        out, ref, atol=2e-6, rtol=1e-5, msg=f"{name} disagrees with SDPA (group {group})"
    )


@pytest.mark.parametrize("group", [1, 2, 4, 7])
def test_contiguous_matches_sdpa(group):
    q, kc, vc, bt, cl = make_batch(
        [1, 4, 5, 11], num_heads=3 * group, num_kv_heads=3, seed=10 + group
    )
    key, value, _ = gather_kv(kc, vc, bt, cl)  # padded [S, L, KVH, D]; padding holds NaN
    assert torch.isnan(key[0, 1:4]).all(), (
        "the rest of sequence 0's only block should hold the pool's NaN"
    )
    out = contiguous_attention(q, key, value, cl)
    torch.testing.assert_close(out, sdpa_reference(q, kc, vc, bt, cl), atol=2e-6, rtol=1e-5)


def test_block_size_8_and_custom_scale():
    q, kc, vc, bt, cl = make_batch([3, 8, 9, 17], num_heads=4, num_kv_heads=2, block_size=8, seed=3)
    ref = sdpa_reference(q, kc, vc, bt, cl, scale=0.3)
    for name, fn in PAGED.items():
        torch.testing.assert_close(
            fn(q, kc, vc, bt, cl, scale=0.3),
            ref,
            atol=2e-6,
            rtol=1e-5,
            msg=f"{name} ignores scale or block size 8",
        )


@pytest.mark.parametrize("fill", [float("nan"), float("inf"), 1e4])
@pytest.mark.parametrize("context_len", [5, 4, 8])
@pytest.mark.parametrize("name", list(PAGED))
def test_case11_garbage_past_context_never_reaches_output(name, context_len, fill):
    # Garbage past the context: 2 heads / 2 KV heads, head dim 16, bs 4, table [3, 1]; every unused slot holds `fill`.
    gen = torch.Generator().manual_seed(11)
    kc = torch.full((4, 4, 2, 16), fill)
    vc = torch.full((4, 4, 2, 16), fill)
    table = [3, 1]
    clean_k = torch.randn(context_len, 2, 16, generator=gen)
    clean_v = torch.randn(context_len, 2, 16, generator=gen)
    for p in range(context_len):
        kc[table[p // 4], p % 4] = clean_k[p]
        vc[table[p // 4], p % 4] = clean_v[p]
    q = torch.randn(1, 2, 16, generator=gen)
    bt, cl = (
        torch.tensor([table], dtype=torch.int32),
        torch.tensor([context_len], dtype=torch.int32),
    )
    out = PAGED[name](q, kc, vc, bt, cl)
    ref = F.scaled_dot_product_attention(
        q[:, :, None], clean_k.transpose(0, 1)[None], clean_v.transpose(0, 1)[None]
    )
    assert torch.isfinite(out).all(), f"{fill} past the context leaked into the output"
    torch.testing.assert_close(out, ref[:, :, 0], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(PAGED))
def test_case12_fp16_scores_do_not_overflow(name):
    # fp16 overflow: q and keys all 32.0 in fp16, head dim 64: raw dot 65536 > fp16 max 65504.
    kc = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16)
    vc = torch.zeros((2, 4, 1, 64), dtype=torch.float16)
    for p, row in enumerate([1.0, 2.0, 3.0]):
        vc[1, p] = row
    q = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
    out = PAGED[name](
        q, kc, vc, torch.tensor([[1]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    )
    assert out.dtype == torch.float16
    assert torch.equal(out, torch.full_like(out, 2.0)), (
        f"expected 2.0 everywhere, got {out.unique().tolist()}"
    )


@pytest.mark.parametrize("group", [7, 1, 2, 5, 8])
@pytest.mark.parametrize("name", list(PAGED))
def test_case13_gqa_head_mapping(name, group):
    # GQA head mapping: 4 KV heads, head dim 16, bs 4, context 9, table [2, 0, 5]; V of KV head g is g + 1.
    gen = torch.Generator().manual_seed(13)
    kc = torch.randn(6, 4, 4, 16, generator=gen)
    vc = torch.empty(6, 4, 4, 16)
    for g in range(4):
        vc[:, :, g, :] = g + 1
    q = torch.randn(1, 4 * group, 16, generator=gen)
    out = PAGED[name](
        q,
        kc,
        vc,
        torch.tensor([[2, 0, 5]], dtype=torch.int32),
        torch.tensor([9], dtype=torch.int32),
    )
    expected = torch.tensor([h // group + 1.0 for h in range(4 * group)])
    torch.testing.assert_close(
        out[0],
        expected[:, None].expand(-1, 16),
        atol=1e-5,
        rtol=0,
        msg=f"query head h must read KV head h // {group}",
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(PAGED))
def test_half_inputs_accumulate_in_fp32(name, dtype):
    q, kc, vc, bt, cl = make_batch([5, 17, 30], num_heads=4, num_kv_heads=2, dtype=dtype, seed=7)
    out = PAGED[name](q, kc, vc, bt, cl)
    ref = sdpa_reference(q, kc, vc, bt, cl)  # fp32 math on the same (rounded) inputs
    assert out.dtype == dtype
    # Only the final rounding to the half type may differ: one unit in the last place.
    ulp = torch.finfo(dtype).eps
    err = ((out.float() - ref).abs() / ref.abs().clamp_min(1e-3)).max().item()
    assert err <= ulp, (
        f"{name}: relative error {err:.2e} > 1 ulp ({ulp:.2e}) in {dtype}: not fp32 accumulation"
    )


def test_zero_context_gives_zero_output():
    q, kc, vc, bt, _ = make_batch([4, 5], num_heads=2, num_kv_heads=2, seed=1)
    cl = torch.tensor([0, 5], dtype=torch.int32)
    for name, fn in PAGED.items():
        out = fn(q, kc, vc, bt, cl)
        assert torch.equal(out[0], torch.zeros_like(out[0])), (
            f"{name}: empty context must give zeros"
        )
        assert torch.isfinite(out).all()


def _bad_inputs():
    q, kc, vc, bt, cl = make_batch(
        [5, 3], num_heads=4, num_kv_heads=2, seed=4
    )  # width 3, bs 4, 6 blocks
    i32 = torch.int32
    return [
        (
            "GQA",
            (torch.randn(2, 6, 16), torch.randn(7, 4, 4, 16), torch.randn(7, 4, 4, 16), bt, cl),
            "num_heads=6, num_kv_heads=4",
        ),
        (
            "too long",
            (q, kc, vc, bt, torch.tensor([13, 3], dtype=i32)),
            "context_len 13 .* 3 x 4 = 12",
        ),
        (
            "negative",
            (q, kc, vc, bt, torch.tensor([-1, 3], dtype=i32)),
            "context_lens must be >= 0, got -1",
        ),
        (
            "dtype",
            (q.half(), kc, vc, bt, cl),
            "dtype mismatch: query torch.float16, key_cache torch.float32",
        ),
        ("device", (q, kc.to("meta"), vc.to("meta"), bt, cl), "key_cache is on meta, query on cpu"),
        (
            "value shape",
            (q, kc, vc[:, :2], bt, cl),
            r"value_cache shape \[6, 2, 2, 16\] != key_cache",
        ),
        ("head_dim", (q[..., :8], kc, vc, bt, cl), "head_dim mismatch: query 8, key_cache 16"),
        ("table dtype", (q, kc, vc, bt.float(), cl), "block_tables must be int32 or int64"),
        ("table rows", (q, kc, vc, bt[:1], cl), r"block_tables must be \[num_seqs=2"),
        (
            "block id",
            (q, kc, vc, torch.tensor([[0, 9, -1], [1, -1, -1]], dtype=i32), cl),
            r"block id 9 .* outside \[0, 6\)",
        ),
        (
            "used -1",
            (q, kc, vc, torch.tensor([[0, -1, -1], [1, -1, -1]], dtype=i32), cl),
            "block id -1",
        ),
    ]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: c[0])
@pytest.mark.parametrize("name", list(PAGED))
def test_bad_input_raises_value_error_with_numbers(name, case):
    _, args, message = case
    with pytest.raises(ValueError, match=message):
        PAGED[name](*args)


def test_contiguous_rejects_context_longer_than_padding():
    with pytest.raises(ValueError, match="context_len 6 .* exceeds key max_len = 5"):
        contiguous_attention(
            torch.randn(1, 2, 8),
            torch.randn(1, 5, 2, 8),
            torch.randn(1, 5, 2, 8),
            torch.tensor([6], dtype=torch.int32),
        )


def test_select_backend():
    assert select_backend("cpu") == "torch"
    assert select_backend(torch.device("cpu")) == "torch"
    has_triton = importlib.util.find_spec("triton") is not None
    assert select_backend("cuda") == ("triton" if has_triton else "torch")
    q, kc, vc, bt, cl = make_batch([3], num_heads=2, num_kv_heads=2, seed=5)
    assert torch.equal(
        paged_attention(q, kc, vc, bt, cl), paged_attention_gather(q, kc, vc, bt, cl)
    )
    with pytest.raises(ValueError, match="backend must be 'torch' or 'triton', got 'cuda'"):
        paged_attention(q, kc, vc, bt, cl, backend="cuda")


@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(st.integers(1, 20), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 3]),
    block_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_gather_and_blockwise_agree_property(lens, group, block_size, seed):
    q, kc, vc, bt, cl = make_batch(
        lens, num_heads=2 * group, num_kv_heads=2, head_dim=8, block_size=block_size, seed=seed
    )
    a = paged_attention_gather(q, kc, vc, bt, cl)
    b = paged_attention_blockwise(q, kc, vc, bt, cl)
    torch.testing.assert_close(
        a, b, atol=2e-6, rtol=1e-5, msg="online softmax differs from gather + softmax"
    )


@pytest.mark.triton
def test_triton_backend_dispatch_matches_gather():
    pytest.importorskip("triton")
    q, kc, vc, bt, cl = make_batch([5, 12], num_heads=4, num_kv_heads=2, seed=6, fill=7.0)
    out = paged_attention(q, kc, vc, bt, cl, backend="triton")
    torch.testing.assert_close(
        out,
        paged_attention_gather(q, kc, vc, bt, cl),
        atol=1e-5,
        rtol=1e-5,
        msg="paged.kernels.paged_attention_decode differs from the gather reference",
    )
