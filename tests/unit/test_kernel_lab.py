"""The teaching kernels of chapter 04 in ``paged_course.kernel_lab`` (interpreter on CPU, tiny shapes).

``reshape_and_cache``; the row-softmax warm-ups; a missing Triton. The teaching decode kernel has its own
file, ``test_teaching_kernel.py``.
"""

from __future__ import annotations

import pytest
import torch
from test_kernels import DEVICE, TOL, make_paged, max_err

from paged import kernels
from paged.kernels import paged_attention_decode
from paged_course.kernel_lab import online_softmax, reshape_and_cache, softmax, teaching_decode

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

pytestmark = pytest.mark.triton


# ---------------------------------------------------------------------------- reshape_and_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_writes_slots_and_skips_minus_one(dtype):
    gen = torch.Generator().manual_seed(0)
    key_cache = torch.full((5, 4, 3, 20), float("nan")).to(dtype)
    value_cache = key_cache.clone()
    key, value = (
        torch.randn(7, 3, 20, generator=gen).to(dtype),
        torch.randn(7, 3, 20, generator=gen).to(dtype),
    )
    slots = torch.tensor([17, 0, -1, 3, 4, 19, -1])  # block 4 offset 1, block 0 offset 0, ...
    reshape_and_cache(
        key.to(DEVICE),
        value.to(DEVICE),
        key_cache := key_cache.to(DEVICE),
        value_cache := value_cache.to(DEVICE),
        slots.to(DEVICE),
    )
    flat_k, flat_v = key_cache.cpu().flatten(0, 1), value_cache.cpu().flatten(0, 1)
    written = slots >= 0
    assert torch.equal(flat_k[slots[written]], key[written]), (
        "key not at block_table[p // bs] * bs + p % bs"
    )
    assert torch.equal(flat_v[slots[written]], value[written]), "value not at its slot"
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[slots[written]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all(), (
        "a slot -1 token was written"
    )


def test_reshape_and_cache_rejects_bad_slots_and_leaves_cache_unchanged():
    key_cache, value_cache = (
        torch.zeros(2, 4, 1, 16, device=DEVICE),
        torch.zeros(2, 4, 1, 16, device=DEVICE),
    )
    key = value = torch.ones(2, 1, 16, device=DEVICE)
    for slots, message in (
        ([1, 8], r"\[-1, 8\)"),
        ([3, 3], "2 tokens to only 1"),
        ([-2, 0], "min -2"),
    ):
        with pytest.raises(ValueError, match=message):
            reshape_and_cache(
                key, value, key_cache, value_cache, torch.tensor(slots, device=DEVICE)
            )
    with pytest.raises(ValueError, match="dtypes"):
        reshape_and_cache(
            key.half(), value.half(), key_cache, value_cache, torch.tensor([0, 1], device=DEVICE)
        )
    assert not key_cache.any() and not value_cache.any(), "a rejected call modified the cache"


def test_reshape_and_cache_then_decode_equals_reference():
    """Write a prompt token by token through slot mapping, then decode with the tuned kernel: the pool round-trips."""
    gen = torch.Generator().manual_seed(1)
    block_size, table, n = 4, [3, 0, 2], 10
    key_cache, value_cache = torch.zeros(4, block_size, 2, 16), torch.zeros(4, block_size, 2, 16)
    keys, values = torch.randn(n, 2, 16, generator=gen), torch.randn(n, 2, 16, generator=gen)
    slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(n)])
    key_cache, value_cache = key_cache.to(DEVICE), value_cache.to(DEVICE)
    reshape_and_cache(keys.to(DEVICE), values.to(DEVICE), key_cache, value_cache, slots.to(DEVICE))
    query = torch.randn(1, 4, 16, generator=gen)
    out = paged_attention_decode(
        query.to(DEVICE),
        key_cache,
        value_cache,
        torch.tensor([table], dtype=torch.int32, device=DEVICE),
        torch.tensor([n], dtype=torch.int32, device=DEVICE),
    )
    k, v = (
        keys.repeat_interleave(2, dim=1),
        values.repeat_interleave(2, dim=1),
    )  # head h reads KV head h // 2
    expected = torch.stack(
        [torch.softmax(k[:, h] @ query[0, h] / 4.0, 0) @ v[:, h] for h in range(4)]
    )
    assert max_err(out[0], expected) < 1e-5, (
        "decode over the cache written by reshape_and_cache is wrong"
    )


# ---------------------------------------------------------------------------- softmax warm-ups


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax_kernels(dtype):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 37, generator=gen) * 5).to(dtype)
    x[1, 3] = (
        1e4 if dtype == torch.float32 else 6e4 if dtype == torch.float16 else 1e30
    )  # huge but finite
    expected = torch.softmax(x.double(), dim=-1)
    for y in (softmax(x.to(DEVICE)), online_softmax(x.to(DEVICE), block=8)):
        assert y.dtype == dtype
        assert max_err(y, expected) < TOL[dtype], "row softmax differs from torch.softmax"
        assert max_err(y.double().sum(-1), torch.ones(4)) < 4 * TOL[dtype], "rows must sum to 1"


def test_online_softmax_long_row_and_errors():
    x = torch.linspace(-30, 30, 3 * 1000).reshape(3, 1000).to(DEVICE)
    assert max_err(online_softmax(x, block=64), torch.softmax(x.double(), -1)) < 1e-6
    with pytest.raises(ValueError, match="exceeds one tile"):
        softmax(x, max_cols=512)
    with pytest.raises(ValueError, match="power of two"):
        online_softmax(x, block=48)


def test_missing_triton_raises_runtime_error(monkeypatch):
    from paged.kernels import _triton

    monkeypatch.setattr(_triton, "HAS_TRITON", False)
    monkeypatch.setattr(_triton, "REASON", "Triton is not installed (test)")
    q, k, v, bt, cl = make_paged([3], 1, 1, 16, 8)
    for call in (
        lambda: teaching_decode(q, k, v, bt, cl),
        lambda: softmax(q[0]),
        lambda: reshape_and_cache(k[0], v[0], k, v, torch.zeros(8, dtype=torch.long)),
    ):
        with pytest.raises(RuntimeError, match="not installed"):
            call()
