"""The Triton kernels of ``paged.kernels`` (interpreter on CPU, tiny shapes) against PyTorch references.

Covers: random shapes with shuffled block tables and context lengths 1, block_size, block_size + 1;
garbage past the context, fp16 scores that overflow, the GQA head mapping, masked loads that need an
explicit fill; split-K equal to single pass, including splits with no
token; bf16; ``reshape_and_cache``; the softmax warm-ups; input validation. ``gpu`` tests run larger
shapes on CUDA only.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged import kernels
from paged.kernels import online_softmax, paged_attention_decode, reshape_and_cache, softmax
from paged_course.reference import paged_attention_gather

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # max abs error vs fp32 reference


def naive_decode(query, key_cache, value_cache, block_tables, context_lens, scale=None):
    """Token by token with the slot formula, softmax in float64 (shares no code with paged_course.reference)."""
    query, key_cache, value_cache, block_tables, context_lens = (
        t.cpu() for t in (query, key_cache, value_cache, block_tables, context_lens))
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = 1 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros(num_seqs, num_heads, head_dim, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(context_lens[s])
        if n == 0:
            continue
        table = block_tables[s].tolist()
        blocks = [table[p // block_size] for p in range(n)]
        offsets = [p % block_size for p in range(n)]
        for h in range(num_heads):
            k = key_cache[blocks, offsets, h // group].double()  # [n, D]
            v = value_cache[blocks, offsets, h // group].double()
            p = torch.softmax(k @ query[s, h].double() * scale, dim=0)
            out[s, h] = p @ v
    return out


def make_paged(context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype=torch.float32, seed=0,
               fill=float("nan"), spare_columns=1):
    """Signed random q/K/V; shuffled physical blocks; unused slots and spare table columns hold junk."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    width = max(need) + spare_columns
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    start = 0
    for s, k in enumerate(need):
        tables[s, :k] = perm[start:start + k].int()
        start += k
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for s, n in enumerate(context_lens):
        for p in range(n):
            used[tables[s, p // block_size], p % block_size] = True
    key_cache[~used] = fill
    value_cache[~used] = fill
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=gen)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return (query.to(dtype).to(DEVICE), key_cache.to(dtype).to(DEVICE), value_cache.to(dtype).to(DEVICE),
            tables.to(DEVICE), lens.to(DEVICE))


def max_err(out, ref):
    return (out.double().cpu() - ref.double().cpu()).abs().max().item()


# ---------------------------------------------------------------------------- decode vs references


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim,block_size", [
    (torch.float32, 4, 4, 16, 8),
    (torch.float32, 14, 2, 24, 16),  # group 7, head dim not a power of two
    (torch.float16, 8, 2, 40, 32),
    (torch.bfloat16, 6, 3, 16, 8),
    (torch.float16, 5, 1, 72, 8),  # MQA, group 5
    (torch.float32, 2, 1, 256, 16),  # the largest head dim
    (torch.bfloat16, 3, 3, 100, 32),  # head dim 100 padded to 128
])
def test_decode_matches_references(dtype, heads, kv_heads, head_dim, block_size):
    lens = [1, block_size, block_size + 1, 2 * block_size + 3]
    inputs = make_paged(lens, heads, kv_heads, head_dim, block_size, dtype=dtype, seed=heads * head_dim)
    out = paged_attention_decode(*inputs)
    assert out.shape == inputs[0].shape and out.dtype == dtype, "output must be [S, H, D] in the query dtype"
    assert torch.isfinite(out).all(), "junk in unused slots (NaN) leaked into the output"
    naive = naive_decode(*[t.cpu() for t in inputs])
    assert max_err(out, naive) < TOL[dtype], f"kernel differs from the float64 naive reference ({dtype})"
    gather = paged_attention_gather(*[t.cpu() for t in inputs]).double()
    assert max_err(out, gather) < TOL[dtype] * 2, "kernel differs from paged_course.reference.paged_attention_gather"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=3), group=st.sampled_from([1, 2, 3, 7]),
       kv_heads=st.integers(1, 2), head_dim=st.sampled_from([16, 20, 32]), block_size=st.sampled_from([8, 16]),
       num_splits=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_decode_property(lens, group, kv_heads, head_dim, block_size, num_splits, seed):
    lens = lens if max(lens) > 0 else lens + [1]
    inputs = make_paged(lens, group * kv_heads, kv_heads, head_dim, block_size, seed=seed)
    out = paged_attention_decode(*inputs, num_splits=num_splits)
    assert max_err(out, naive_decode(*[t.cpu() for t in inputs])) < 1e-5, "kernel != naive reference"


def test_scale_argument_and_context_zero():
    q, k, v, bt, cl = make_paged([0, 5, 9], 2, 1, 16, 8, seed=3)
    out = paged_attention_decode(q, k, v, bt, cl, scale=0.3)
    assert torch.equal(out[0].cpu(), torch.zeros(2, 16)), "context_len 0 must give a zero output"
    assert max_err(out, naive_decode(q, k, v, bt, cl, scale=0.3)) < 1e-5, "explicit scale ignored"


# ---------------------------------------------------------------------------- split-K


@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_split_k_equals_single_pass(num_splits):
    # 4 sequences; table width 6 blocks of 8; with 8 splits, 2 of them start past every context.
    inputs = make_paged([1, 8, 17, 37], 4, 2, 32, 8, seed=7, spare_columns=1)
    single = paged_attention_decode(*inputs, num_splits=1)
    split = paged_attention_decode(*inputs, num_splits=num_splits)
    assert torch.isfinite(split).all(), "an empty split (lse = -inf) produced NaN/inf in the merge"
    assert max_err(split, single) < 1e-6, f"split-K with {num_splits} splits != single pass"


def test_split_with_no_token_is_a_no_op():
    # context 3 in a 4-block-wide table of block size 4: with 4 splits, splits 1..3 hold no token.
    q, k, v, bt, cl = make_paged([3], 2, 2, 16, 4, seed=11, spare_columns=3)
    assert bt.shape[1] == 4
    out = paged_attention_decode(q, k, v, bt, cl, num_splits=4)
    assert max_err(out, naive_decode(q, k, v, bt, cl)) < 1e-6, "empty splits changed the merged output"
    zero = paged_attention_decode(q, k, v, bt, torch.zeros_like(cl), num_splits=4)
    assert torch.equal(zero.cpu(), torch.zeros_like(zero.cpu())), "all splits empty: output must be 0, not NaN"


# ---------------------------------------------------------------------------- corner cases


@pytest.mark.parametrize("context", [5, 4, 8])
@pytest.mark.parametrize("junk", [float("nan"), float("inf"), 1e4])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_case11_garbage_past_context(context, junk, num_splits):
    """CASES 11: 2 heads / 2 KV heads, head dim 16, bs 4, table [3, 1]; unused slots hold junk."""
    gen = torch.Generator().manual_seed(context)
    key_cache = torch.full((4, 4, 2, 16), junk)
    value_cache = torch.full((4, 4, 2, 16), junk)
    real_k, real_v = torch.randn(context, 2, 16, generator=gen), torch.randn(context, 2, 16, generator=gen)
    table = [3, 1]
    for p in range(context):
        key_cache[table[p // 4], p % 4], value_cache[table[p // 4], p % 4] = real_k[p], real_v[p]
    query = torch.randn(1, 2, 16, generator=gen)
    out = paged_attention_decode(query.to(DEVICE), key_cache.to(DEVICE), value_cache.to(DEVICE),
                                 torch.tensor([table], dtype=torch.int32, device=DEVICE),
                                 torch.tensor([context], dtype=torch.int32, device=DEVICE), num_splits=num_splits)
    expected = torch.stack([torch.softmax(real_k[:, h] @ query[0, h] / 4.0, 0) @ real_v[:, h] for h in range(2)])
    assert torch.isfinite(out).all(), f"junk {junk} past the context reached the output"
    assert max_err(out[0], expected) < 1e-5, "output differs from the fp32 reference over the real tokens"


@pytest.mark.parametrize("num_splits", [1, 2])
def test_case12_fp16_scores_do_not_overflow(num_splits):
    """CASES 12: q = k = 32.0, head dim 64 (raw dot 65536 > fp16 max 65504); values 1, 2, 3 -> 2.0."""
    key_cache = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16)
    value_cache = torch.zeros(2, 4, 1, 64, dtype=torch.float16)
    value_cache[0, :3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)[:, None, None]
    query = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
    out = paged_attention_decode(query.to(DEVICE), key_cache.to(DEVICE), value_cache.to(DEVICE),
                                 torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE),
                                 torch.tensor([3], dtype=torch.int32, device=DEVICE), num_splits=num_splits)
    assert out.dtype == torch.float16
    assert torch.equal(out.cpu(), torch.full((1, 1, 64), 2.0, dtype=torch.float16)), \
        "equal scores must average the values to 2.0 (scores must be accumulated in fp32)"


@pytest.mark.parametrize("group", [7, 1, 2, 5, 8])
def test_case13_gqa_head_mapping(group):
    """CASES 13: 4 KV heads, head dim 16, bs 4, context 9, table [2, 0, 5]; V of KV head g is g + 1."""
    num_kv_heads, num_heads = 4, 4 * group
    gen = torch.Generator().manual_seed(group)
    key_cache = torch.randn(6, 4, num_kv_heads, 16, generator=gen)
    value_cache = torch.empty(6, 4, num_kv_heads, 16)
    for g in range(num_kv_heads):
        value_cache[:, :, g] = g + 1.0
    query = torch.randn(1, num_heads, 16, generator=gen)
    out = paged_attention_decode(query.to(DEVICE), key_cache.to(DEVICE), value_cache.to(DEVICE),
                                 torch.tensor([[2, 0, 5]], dtype=torch.int32, device=DEVICE),
                                 torch.tensor([9], dtype=torch.int32, device=DEVICE))
    expected = (torch.arange(num_heads) // group + 1.0)[:, None].expand(num_heads, 16)
    assert max_err(out[0], expected) < 1e-5, f"query head h must read KV head h // {group}"


def test_case14_output_independent_of_masked_slots():
    """CASES 14: what sits past the context (7.0, NaN, 0) gives bit-identical outputs."""
    outs = []
    for fill in (7.0, float("nan"), 0.0):
        inputs = make_paged([5, 12, 3], 6, 2, 24, 8, seed=5, fill=fill)
        outs.append(paged_attention_decode(*inputs).cpu())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), \
        "decode output depends on what is stored past the context (a masked load without other=?)"


def test_case14_every_masked_load_names_its_fill():
    """CASES 14, statically: the interpreter happens to fill masked lanes with 0, a GPU does not."""
    import ast
    from pathlib import Path

    root = Path(kernels.__file__).parent
    files = sorted(root.glob("*.py")) + [root.parent / "solutions" / "ex04_online_softmax.py"]
    checked = 0
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" \
                    and getattr(node.func.value, "id", None) == "tl":
                names = {k.arg for k in node.keywords}
                checked += "mask" in names
                assert "mask" not in names or "other" in names, \
                    f"{path.name}:{node.lineno}: masked tl.load without other="
    assert checked >= 10, f"expected the kernels' masked loads, found {checked}"


# ---------------------------------------------------------------------------- validation


def test_bad_inputs_raise_value_error_with_numbers():
    q, k, v, bt, cl = make_paged([5, 9], 4, 2, 16, 8)
    cases = [
        (dict(query=q[0]), "query must be"),
        (dict(query=q[:, :3]), "3 % 2"),
        (dict(context_lens=torch.tensor([5, 25], dtype=torch.int32, device=DEVICE)), "25 exceeds .* = 24"),
        (dict(context_lens=torch.tensor([5, -1], dtype=torch.int32, device=DEVICE)), ">= 0"),
        (dict(block_tables=torch.tensor([[0, -1], [1, 99]], dtype=torch.int32, device=DEVICE)), "99"),
        (dict(block_tables=bt.float()), "int32"),
        (dict(value_cache=v.half()), "dtypes differ"),
        (dict(context_lens=cl[:1]), "num_seqs differs"),
        (dict(num_splits=0), "num_splits"),
        (dict(key_cache=k[:, :6], value_cache=v[:, :6]), "power of two"),
    ]
    for change, message in cases:
        args = dict(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl)
        args.update(change)
        with pytest.raises(ValueError, match=message):
            paged_attention_decode(**args)


def test_missing_triton_raises_runtime_error(monkeypatch):
    from paged.kernels import _triton

    monkeypatch.setattr(_triton, "HAS_TRITON", False)
    monkeypatch.setattr(_triton, "REASON", "Triton is not installed (test)")
    q, k, v, bt, cl = make_paged([3], 1, 1, 16, 8)
    for call in (lambda: paged_attention_decode(q, k, v, bt, cl), lambda: softmax(q[0]),
                 lambda: reshape_and_cache(k[0], v[0], k, v, torch.zeros(8, dtype=torch.long))):
        with pytest.raises(RuntimeError, match="not installed"):
            call()


# ---------------------------------------------------------------------------- reshape_and_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_writes_slots_and_skips_minus_one(dtype):
    gen = torch.Generator().manual_seed(0)
    key_cache = torch.full((5, 4, 3, 20), float("nan")).to(dtype)
    value_cache = key_cache.clone()
    key, value = torch.randn(7, 3, 20, generator=gen).to(dtype), torch.randn(7, 3, 20, generator=gen).to(dtype)
    slots = torch.tensor([17, 0, -1, 3, 4, 19, -1])  # block 4 offset 1, block 0 offset 0, ...
    reshape_and_cache(key.to(DEVICE), value.to(DEVICE), key_cache := key_cache.to(DEVICE),
                      value_cache := value_cache.to(DEVICE), slots.to(DEVICE))
    flat_k, flat_v = key_cache.cpu().flatten(0, 1), value_cache.cpu().flatten(0, 1)
    written = slots >= 0
    assert torch.equal(flat_k[slots[written]], key[written]), "key not at block_table[p // bs] * bs + p % bs"
    assert torch.equal(flat_v[slots[written]], value[written]), "value not at its slot"
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[slots[written]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all(), "a slot -1 token was written"


def test_reshape_and_cache_rejects_bad_slots_and_leaves_cache_unchanged():
    key_cache, value_cache = torch.zeros(2, 4, 1, 16, device=DEVICE), torch.zeros(2, 4, 1, 16, device=DEVICE)
    key = value = torch.ones(2, 1, 16, device=DEVICE)
    for slots, message in (([1, 8], r"\[-1, 8\)"), ([3, 3], "2 tokens to only 1"), ([-2, 0], "min -2")):
        with pytest.raises(ValueError, match=message):
            reshape_and_cache(key, value, key_cache, value_cache, torch.tensor(slots, device=DEVICE))
    with pytest.raises(ValueError, match="dtypes"):
        reshape_and_cache(key.half(), value.half(), key_cache, value_cache, torch.tensor([0, 1], device=DEVICE))
    assert not key_cache.any() and not value_cache.any(), "a rejected call modified the cache"


def test_reshape_and_cache_then_decode_equals_reference():
    """Write a prompt token by token through slot mapping, then decode: the pool round-trips."""
    gen = torch.Generator().manual_seed(1)
    block_size, table, n = 4, [3, 0, 2], 10
    key_cache, value_cache = torch.zeros(4, block_size, 2, 16), torch.zeros(4, block_size, 2, 16)
    keys, values = torch.randn(n, 2, 16, generator=gen), torch.randn(n, 2, 16, generator=gen)
    slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(n)])
    key_cache, value_cache = key_cache.to(DEVICE), value_cache.to(DEVICE)
    reshape_and_cache(keys.to(DEVICE), values.to(DEVICE), key_cache, value_cache, slots.to(DEVICE))
    query = torch.randn(1, 4, 16, generator=gen)
    out = paged_attention_decode(query.to(DEVICE), key_cache, value_cache,
                                 torch.tensor([table], dtype=torch.int32, device=DEVICE),
                                 torch.tensor([n], dtype=torch.int32, device=DEVICE))
    k, v = keys.repeat_interleave(2, dim=1), values.repeat_interleave(2, dim=1)  # head h reads KV head h // 2
    expected = torch.stack([torch.softmax(k[:, h] @ query[0, h] / 4.0, 0) @ v[:, h] for h in range(4)])
    assert max_err(out[0], expected) < 1e-5, "decode over the cache written by reshape_and_cache is wrong"


# ---------------------------------------------------------------------------- softmax warm-ups


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax_kernels(dtype):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(4, 37, generator=gen) * 5).to(dtype)
    x[1, 3] = 1e4 if dtype == torch.float32 else 6e4 if dtype == torch.float16 else 1e30  # huge but finite
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


# ---------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_gpu_decode_large(dtype, num_splits):
    inputs = make_paged([1, 16, 17, 1000, 2049, 4096], 32, 8, 128, 16, dtype=dtype, seed=0)
    out = paged_attention_decode(*inputs, num_splits=num_splits)
    ref = paged_attention_gather(*inputs).float()
    assert max_err(out, ref) < TOL[dtype] * (1 + ref.abs().max().item()), "GPU kernel differs from the gather reference"


@pytest.mark.gpu
def test_gpu_decode_head_dims_and_block_sizes():
    for head_dim, block_size in ((64, 8), (80, 16), (96, 32), (256, 16)):
        inputs = make_paged([33, 300], 8, 2, head_dim, block_size, dtype=torch.float16, seed=head_dim)
        out = paged_attention_decode(*inputs)
        ref = paged_attention_gather(*inputs).float()
        assert max_err(out, ref) < 2e-3 * (1 + ref.abs().max().item()), (head_dim, block_size)


@pytest.mark.gpu
def test_gpu_fp16_speed_sanity():
    """Runs the bench-sized case once (no timing assert: speed is the benchmark's job)."""
    q, k, v, bt, cl = make_paged([4096] * 8, 32, 8, 128, 16, dtype=torch.float16, seed=0)
    for splits in (1, 8):
        out = paged_attention_decode(q, k, v, bt, cl, num_splits=splits)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
