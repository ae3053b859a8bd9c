"""The engine's tuned decode kernel, ``paged.kernels.paged_attention_decode`` (interpreter on CPU, tiny shapes).

Against an fp32 reference (``paged_course.reference.paged_attention_gather``) and a float64 token-by-token
loop: fp32 and fp16 (bf16 on a GPU only: the interpreter's bf16 ``tl.dot`` is wrong, Triton issue 11584),
ragged contexts, shuffled block tables, garbage past the context, fp16 scores that
overflow, the GQA head mapping (groups 1-8), masked loads that need an explicit fill; block sizes 8, 16
and 32 with KV tiles spanning several blocks or part of one; split-K forced (1, 2, 3 splits, empty
splits) and chosen (``num_splits=None``); context 0; every input error; the split heuristic; the launch
config's ``tl.dot`` dimensions; the size of ``kernels/``. ``gpu`` tests run larger shapes on CUDA only.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged import kernels
from paged.kernels import choose_num_splits, launch_config, launch_decode, paged_attention_decode
from paged_course.reference import paged_attention_gather

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 2e-2,
}  # max abs error vs fp32 reference
ROOT = Path(__file__).resolve().parents[2]


def naive_decode(query, key_cache, value_cache, block_tables, context_lens, scale=None):
    """Token by token with the slot formula, softmax in float64 (shares no code with paged_course.reference)."""
    query, key_cache, value_cache, block_tables, context_lens = (
        t.cpu() for t in (query, key_cache, value_cache, block_tables, context_lens)
    )
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


def make_paged(
    context_lens,
    num_heads,
    num_kv_heads,
    head_dim,
    block_size,
    dtype=torch.float32,
    seed=0,
    fill=float("nan"),
    spare_columns=1,
):
    """Signed random q/K/V; shuffled physical blocks; unused slots and spare table columns hold junk."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    width = max(need) + spare_columns
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(context_lens), width), -1, dtype=torch.int32)
    start = 0
    for s, k in enumerate(need):
        tables[s, :k] = perm[start : start + k].int()
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
    return (
        query.to(dtype).to(DEVICE),
        key_cache.to(dtype).to(DEVICE),
        value_cache.to(dtype).to(DEVICE),
        tables.to(DEVICE),
        lens.to(DEVICE),
    )


def max_err(out, ref):
    return (out.double().cpu() - ref.double().cpu()).abs().max().item()


def contiguous_copy(query, key_cache, value_cache, block_tables, context_lens):
    """The same values in a contiguous pool: sequence s's logical block j at block s * width + j (identity table)."""
    batch, width = block_tables.shape
    flat = block_tables.long().clamp(min=0).flatten()
    identity = torch.arange(batch * width, dtype=torch.int32, device=block_tables.device).view(
        batch, width
    )
    return (
        query,
        key_cache[flat].contiguous(),
        value_cache[flat].contiguous(),
        identity,
        context_lens,
    )


# ---------------------------------------------------------------------------- decode vs references


@pytest.mark.parametrize(
    "dtype,heads,kv_heads,head_dim,block_size",
    [
        (torch.float32, 4, 4, 16, 8),
        (torch.float32, 14, 2, 24, 16),  # group 7, head dim not a power of two
        (torch.float16, 8, 2, 40, 32),
        (torch.float16, 5, 1, 72, 8),  # MQA, group 5
        (torch.float32, 2, 1, 256, 16),  # the largest head dim
        (torch.float16, 3, 3, 8, 16),  # head dim 8 < 16: padded to the 16 tl.dot needs
    ],
)
def test_decode_matches_references(dtype, heads, kv_heads, head_dim, block_size):
    lens = [1, block_size, block_size + 1, 2 * block_size + 3, 70]  # 70: two 64-token tiles
    inputs = make_paged(
        lens, heads, kv_heads, head_dim, block_size, dtype=dtype, seed=heads * head_dim
    )
    out = paged_attention_decode(*inputs)
    assert out.shape == inputs[0].shape and out.dtype == dtype, (
        "output must be [S, H, D] in the query dtype"
    )
    assert torch.isfinite(out).all(), "junk in unused slots (NaN) leaked into the output"
    naive = naive_decode(*inputs)
    assert max_err(out, naive) < TOL[dtype], (
        f"kernel differs from the float64 naive reference ({dtype})"
    )
    gather = paged_attention_gather(*[t.float() if t.is_floating_point() else t for t in inputs])
    assert max_err(out, gather) < TOL[dtype], (
        "kernel differs from paged_course.reference.paged_attention_gather"
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lens=st.lists(st.integers(0, 150), min_size=1, max_size=3),
    group=st.sampled_from([1, 2, 3, 7]),
    kv_heads=st.integers(1, 2),
    head_dim=st.sampled_from([16, 20, 32]),
    block_size=st.sampled_from([8, 16]),
    num_splits=st.sampled_from([1, 2, 3, None]),
    block_n=st.sampled_from([16, 32, 64]),
    seed=st.integers(0, 10_000),
)
def test_decode_property(lens, group, kv_heads, head_dim, block_size, num_splits, block_n, seed):
    lens = lens if max(lens) > 0 else lens + [1]
    inputs = make_paged(lens, group * kv_heads, kv_heads, head_dim, block_size, seed=seed)
    out = launch_decode(*inputs, num_splits=num_splits, config={"BLOCK_N": block_n})
    assert max_err(out, naive_decode(*inputs)) < 1e-5, "kernel != naive reference"


@pytest.mark.parametrize("block_size,block_n", [(8, 64), (16, 64), (32, 16), (16, 16), (8, 128)])
def test_tiles_spanning_several_blocks_or_part_of_one(block_size, block_n):
    """BLOCK_N > block size: one tile gathers several physical blocks; BLOCK_N < block size: part of one."""
    inputs = make_paged([3, 40, 97], 4, 2, 32, block_size, seed=block_size + block_n)
    out = launch_decode(*inputs, num_splits=1, config={"BLOCK_N": block_n})
    assert max_err(out, naive_decode(*inputs)) < 1e-5, (
        f"block size {block_size}, tiles of {block_n} tokens"
    )


def test_scale_argument_and_context_zero():
    q, k, v, bt, cl = make_paged([0, 5, 9], 2, 1, 16, 8, seed=3)
    out = paged_attention_decode(q, k, v, bt, cl, scale=0.3)
    assert torch.equal(out[0].cpu(), torch.zeros(2, 16)), "context_len 0 must give a zero output"
    assert max_err(out, naive_decode(q, k, v, bt, cl, scale=0.3)) < 1e-5, "explicit scale ignored"


def test_paged_equals_contiguous_bit_for_bit():
    """Only the blocks' placement differs, so the arithmetic, and the result, is identical."""
    inputs = make_paged([5, 64, 100], 4, 2, 16, 8, seed=9, fill=0.0)
    paged = launch_decode(*inputs, num_splits=2)
    contiguous = launch_decode(*contiguous_copy(*inputs), num_splits=2)
    assert torch.equal(paged, contiguous), (
        "the same values through an identity table must give the same output"
    )


# ---------------------------------------------------------------------------- split-K


@pytest.mark.parametrize("num_splits", [2, 3])
def test_split_k_equals_single_pass(num_splits):
    # contexts of 1..3 tiles of 64: with 2 or 3 splits, the short sequences' later splits hold no token
    inputs = make_paged([1, 8, 70, 150], 4, 2, 32, 8, seed=7)
    single = paged_attention_decode(*inputs, num_splits=1)
    split = paged_attention_decode(*inputs, num_splits=num_splits)
    assert torch.isfinite(split).all(), "an empty split (lse = -inf) produced NaN/inf in the merge"
    assert max_err(split, single) < 1e-6, f"split-K with {num_splits} splits != single pass"


def test_split_with_no_token_is_a_no_op():
    # context 3 is one tile: with 3 splits, splits 1 and 2 hold no token
    q, k, v, bt, cl = make_paged([3], 2, 2, 16, 4, seed=11, spare_columns=3)
    out = paged_attention_decode(q, k, v, bt, cl, num_splits=3)
    assert max_err(out, naive_decode(q, k, v, bt, cl)) < 1e-6, (
        "empty splits changed the merged output"
    )
    zero = paged_attention_decode(q, k, v, bt, torch.zeros_like(cl), num_splits=3)
    assert torch.equal(zero.cpu(), torch.zeros_like(zero.cpu())), (
        "all splits empty: output must be 0, not NaN"
    )


def test_num_splits_none_picks_and_matches():
    """None applies choose_num_splits (the interpreter pretends 4 program slots): 2 programs -> 2 splits."""
    inputs = make_paged([200], 4, 2, 16, 16, seed=13)
    assert choose_num_splits(1 * 2, 4, launch_config.INTERPRETER_SLOTS) == 2
    out = paged_attention_decode(*inputs, num_splits=None)
    assert max_err(out, naive_decode(*inputs)) < 1e-5, "num_splits=None gives a wrong result"
    assert torch.equal(launch_decode(*inputs), out), "launch_decode's default is num_splits=None"


@pytest.mark.parametrize(
    "programs,tiles,slots,expected",
    [
        (512, 64, 264, 1),  # batch 64 x 8 KV heads fills an H200's 264 slots: no split
        (220, 64, 264, 1),  # >= 80% of the slots: no split
        (8, 128, 264, 32),  # batch 1, context 8192 in tiles of 64: as many splits as the cap allows
        (32, 128, 264, 7),  # batch 4: 7 splits fill 224 of 264 slots, within 85% of the best (256)
        (8, 3, 264, 3),  # a short context: no more splits than tiles
        (8, 1, 264, 1),  # one tile: nothing to split
        (2, 8, 4, 2),  # the interpreter's pretend 4 slots
        (100, 64, 132, 5),  # 100 of 132 slots (76%): 2-4 splits stay at 76% per wave, 5 reach 95%
    ],
)
def test_choose_num_splits(programs, tiles, slots, expected):
    assert choose_num_splits(programs, tiles, slots) == expected


def test_choose_num_splits_skips_counts_that_do_not_shorten_the_longest_split():
    for tiles in range(1, 70):
        for programs in (1, 3, 8):
            s = choose_num_splits(programs, tiles, 132)
            assert 1 <= s <= min(tiles, launch_config.MAX_SPLITS)
            if s > 1:
                assert -(-tiles // s) < -(-tiles // (s - 1)), (
                    f"{s} splits of {tiles} tiles: no shorter than {s - 1}"
                )


# ---------------------------------------------------------------------------- corner cases of a decode kernel


@pytest.mark.parametrize("context", [5, 4, 8])
@pytest.mark.parametrize("junk", [float("nan"), float("inf"), 1e4])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_case11_garbage_past_context(context, junk, num_splits):
    """Garbage past the context: 2 heads / 2 KV heads, head dim 16, bs 4, table [3, 1]; unused slots hold junk."""
    gen = torch.Generator().manual_seed(context)
    key_cache = torch.full((4, 4, 2, 16), junk)
    value_cache = torch.full((4, 4, 2, 16), junk)
    real_k, real_v = (
        torch.randn(context, 2, 16, generator=gen),
        torch.randn(context, 2, 16, generator=gen),
    )
    table = [3, 1]
    for p in range(context):
        key_cache[table[p // 4], p % 4], value_cache[table[p // 4], p % 4] = real_k[p], real_v[p]
    query = torch.randn(1, 2, 16, generator=gen)
    out = launch_decode(
        query.to(DEVICE),
        key_cache.to(DEVICE),
        value_cache.to(DEVICE),
        torch.tensor([table], dtype=torch.int32, device=DEVICE),
        torch.tensor([context], dtype=torch.int32, device=DEVICE),
        num_splits=num_splits,
        config={"BLOCK_N": 16 if num_splits == 1 else 64},
    )  # 16: a tile past the 2-block table
    expected = torch.stack(
        [torch.softmax(real_k[:, h] @ query[0, h] / 4.0, 0) @ real_v[:, h] for h in range(2)]
    )
    assert torch.isfinite(out).all(), f"junk {junk} past the context reached the output"
    assert max_err(out[0], expected) < 1e-5, (
        "output differs from the fp32 reference over the real tokens"
    )


@pytest.mark.parametrize("num_splits", [1, 2])
def test_case12_fp16_scores_do_not_overflow(num_splits):
    """fp16 scores must not overflow: q = k = 32.0, head dim 64 (raw dot 65536 > fp16 max 65504); values 1, 2, 3
    give 2.0."""
    key_cache = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16)
    value_cache = torch.zeros(2, 4, 1, 64, dtype=torch.float16)
    value_cache[0, :3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)[:, None, None]
    query = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
    out = paged_attention_decode(
        query.to(DEVICE),
        key_cache.to(DEVICE),
        value_cache.to(DEVICE),
        torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE),
        torch.tensor([3], dtype=torch.int32, device=DEVICE),
        num_splits=num_splits,
    )
    assert out.dtype == torch.float16
    assert torch.equal(out.cpu(), torch.full((1, 1, 64), 2.0, dtype=torch.float16)), (
        "equal scores must average the values to 2.0 (scores must be accumulated in fp32)"
    )


@pytest.mark.parametrize("group", [1, 2, 4, 5, 7, 8])
def test_case13_gqa_head_mapping(group):
    """GQA head mapping: 4 KV heads, head dim 16, bs 4, context 9, table [2, 0, 5]; V of KV head g is g + 1."""
    num_kv_heads, num_heads = 4, 4 * group
    gen = torch.Generator().manual_seed(group)
    key_cache = torch.randn(6, 4, num_kv_heads, 16, generator=gen)
    value_cache = torch.empty(6, 4, num_kv_heads, 16)
    for g in range(num_kv_heads):
        value_cache[:, :, g] = g + 1.0
    query = torch.randn(1, num_heads, 16, generator=gen)
    out = paged_attention_decode(
        query.to(DEVICE),
        key_cache.to(DEVICE),
        value_cache.to(DEVICE),
        torch.tensor([[2, 0, 5]], dtype=torch.int32, device=DEVICE),
        torch.tensor([9], dtype=torch.int32, device=DEVICE),
    )
    expected = (torch.arange(num_heads) // group + 1.0)[:, None].expand(num_heads, 16)
    assert max_err(out[0], expected) < 1e-5, f"query head h must read KV head h // {group}"


def test_case13_group_wider_than_16_rows():
    """32 query heads over 1 KV head: the tile's M dimension grows to 32 rows."""
    inputs = make_paged([20, 33], 32, 1, 16, 8, seed=17)
    assert max_err(paged_attention_decode(*inputs), naive_decode(*inputs)) < 1e-5


def test_case14_output_independent_of_masked_slots():
    """Masked loads need an explicit fill: what sits past the context (7.0, NaN, 0) gives bit-identical outputs."""
    outs = []
    for fill in (7.0, float("nan"), 0.0):
        inputs = make_paged([5, 12, 3], 6, 2, 24, 8, seed=5, fill=fill)
        outs.append(paged_attention_decode(*inputs, num_splits=2).cpu())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), (
        "decode output depends on what is stored past the context (a masked load without other=?)"
    )


def test_case14_every_masked_load_names_its_fill():
    """Masked loads need an explicit fill, statically: the interpreter happens to fill masked lanes with 0, a GPU
    does not."""
    files = [
        *sorted((ROOT / "kernels").glob("*.py")),
        *sorted((ROOT / "paged_course" / "kernel_lab").glob("*.py")),
        ROOT / "solutions" / "ex04_online_softmax.py",
        ROOT / "solutions" / "ex04_fast_decode.py",
    ]
    checked = 0
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "load"
                and getattr(node.func.value, "id", None) == "tl"
            ):
                names = {k.arg for k in node.keywords}
                checked += "mask" in names
                assert "mask" not in names or "other" in names, (
                    f"{path.name}:{node.lineno}: masked tl.load without other="
                )
    assert checked >= 15, f"expected the kernels' masked loads, found {checked}"


# ---------------------------------------------------------------------------- launch config and size


@pytest.mark.parametrize("head_dim", [1, 8, 16, 64, 80, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_config_keeps_every_dot_dimension_at_least_16(head_dim, dtype):
    """The interpreter accepts tl.dot tiles under 16 that the GPU rejects: check the GPU's config here."""
    for spec in launch_config.GPUS.values():
        cfg = launch_config.decode_config(head_dim, dtype, spec)
        stage = 2 * cfg["BLOCK_N"] * max(16, 1 << (head_dim - 1).bit_length()) * dtype.itemsize
        assert 16 <= cfg["BLOCK_N"] <= 64 and cfg["BLOCK_N"] & (cfg["BLOCK_N"] - 1) == 0
        assert cfg["num_stages"] in (2, 3) and cfg["num_stages"] * stage <= 128 * 1024, (
            "K/V stages must fit in SMEM"
        )
        pre = launch_config.prefill_config(head_dim, dtype, spec)
        assert min(pre["BLOCK_M"], pre["BLOCK_N"]) >= 16, pre
    # the kernels' other dot dimensions (BLOCK_M, HEAD_DIM_P2) are compiled for sm_80 and sm_90 by
    # tests/unit/test_kernel_compile.py and .ci/run (python -m paged bench kernel --compile)


# ---------------------------------------------------------------------------- validation


def test_bad_inputs_raise_value_error_with_numbers():
    q, k, v, bt, cl = make_paged([5, 9], 4, 2, 16, 8)
    cases = [
        (dict(query=q[0]), "query must be"),
        (dict(query=q[:, :3]), "3 % 2"),
        (
            dict(context_lens=torch.tensor([5, 25], dtype=torch.int32, device=DEVICE)),
            "25 exceeds .* = 24",
        ),
        (dict(context_lens=torch.tensor([5, -1], dtype=torch.int32, device=DEVICE)), ">= 0"),
        (
            dict(block_tables=torch.tensor([[0, -1], [1, 99]], dtype=torch.int32, device=DEVICE)),
            "99",
        ),
        (dict(block_tables=bt.float()), "int32"),
        (dict(context_lens=cl.float()), "int32"),
        (dict(value_cache=v.half()), "dtypes differ"),
        (dict(query=q.int()), "float16, bfloat16 or float32"),
        (dict(context_lens=cl[:1]), "num_seqs differs"),
        (dict(num_splits=0), "num_splits"),
        (dict(num_splits=2.0), "num_splits"),
        (dict(num_splits=True), "num_splits"),
        (dict(scale=float("inf")), "scale must be finite"),
        (dict(key_cache=k[:, :6], value_cache=v[:, :6]), "power of two"),
        (dict(value_cache=v[:, :4]), "value_cache shape"),
        (dict(key_cache=k[0], value_cache=v[0]), "key_cache must be"),
        (dict(key_cache=k[..., :8], value_cache=v[..., :8]), "head_dim differs"),
        (
            dict(key_cache=k.transpose(2, 3).contiguous().transpose(2, 3), value_cache=v),
            "contiguous in head_dim",
        ),
    ]
    for change, message in cases:
        args = dict(query=q, key_cache=k, value_cache=v, block_tables=bt, context_lens=cl)
        args.update(change)
        with pytest.raises(ValueError, match=message):
            paged_attention_decode(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's device rule")
def test_device_errors():
    q, k, v, bt, cl = make_paged([5, 9], 4, 2, 16, 8)
    with pytest.raises(ValueError, match="interpreter mode here, so tensors must be on the CPU"):
        paged_attention_decode(
            q.to("meta"), k.to("meta"), v.to("meta"), bt.to("meta"), cl.to("meta")
        )
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        paged_attention_decode(q, k.to("meta"), v.to("meta"), bt, cl)


def test_missing_triton_raises_runtime_error(monkeypatch):
    from paged.kernels import _triton

    monkeypatch.setattr(_triton, "HAS_TRITON", False)
    monkeypatch.setattr(_triton, "REASON", "Triton is not installed (test)")
    q, k, v, bt, cl = make_paged([3], 1, 1, 16, 8)
    with pytest.raises(kernels.TritonUnavailableError, match="not installed"):
        paged_attention_decode(q, k, v, bt, cl)


# ---------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4, None])
def test_gpu_decode_large(dtype, num_splits):
    inputs = make_paged([1, 16, 17, 1000, 2049, 4096], 32, 8, 128, 16, dtype=dtype, seed=0)
    out = paged_attention_decode(*inputs, num_splits=num_splits)
    ref = paged_attention_gather(*inputs).float()
    assert max_err(out, ref) < TOL[dtype] * (1 + ref.abs().max().item()), (
        "GPU kernel differs from the gather reference"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_decode_head_dims_block_sizes_groups(dtype):
    shapes = (
        (64, 8, 8, 2),
        (80, 16, 28, 4),
        (96, 32, 8, 8),
        (256, 16, 8, 2),
        (128, 64, 32, 1),
        (8, 16, 4, 2),
    )
    for head_dim, block_size, heads, kv_heads in shapes if dtype != torch.float32 else shapes[3:5]:
        inputs = make_paged(
            [33, 300, 0], heads, kv_heads, head_dim, block_size, dtype=dtype, seed=head_dim
        )
        for num_splits in (1, 3):
            out = paged_attention_decode(*inputs, num_splits=num_splits)
            ref = naive_decode(*inputs)
            assert max_err(out, ref) < TOL[dtype] * 2, (
                dtype,
                head_dim,
                block_size,
                heads,
                kv_heads,
                num_splits,
            )


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        {"BLOCK_N": 16, "num_stages": 1},
        {"BLOCK_N": 32, "num_stages": 2},
        {"BLOCK_N": 64, "num_stages": 3},
        {"BLOCK_N": 128, "num_stages": 2},
    ],
)
def test_gpu_launch_configs(config):
    inputs = make_paged(
        [1, 100, 1000], 32, 8, 128, 16, dtype=torch.float16, seed=1, fill=float("nan")
    )
    out = launch_decode(*inputs, num_splits=2, config=config)
    assert max_err(out, naive_decode(*inputs)) < 2e-3, f"config {config}"


@pytest.mark.gpu
def test_gpu_cases_11_12_and_paged_equals_contiguous():
    inputs = make_paged([5, 64, 700], 8, 2, 64, 16, dtype=torch.float16, seed=9, fill=float("inf"))
    out = paged_attention_decode(*inputs, num_splits=None)
    assert torch.isfinite(out).all() and max_err(out, naive_decode(*inputs)) < 2e-3
    clean = make_paged([5, 64, 700], 8, 2, 64, 16, dtype=torch.float16, seed=9, fill=0.0)
    assert torch.equal(
        launch_decode(*clean, num_splits=1), launch_decode(*contiguous_copy(*clean), num_splits=1)
    )
    test_case12_fp16_scores_do_not_overflow(1)
