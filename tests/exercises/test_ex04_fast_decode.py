"""Graded: chapter 04, part 3, make the decode kernel fast (exercises/ex04_fast_decode.py, ch04.ex3).

The starter is the teaching kernel's frame around the learner's ch04.ex2 walk: correct once ch04.ex2 is,
and slow. So every test of this region is all or nothing: the region scores only when the kernel is both
correct and built the fast way. What runs without a GPU:

- correctness in Triton's interpreter: tiles of ``CONFIG["BLOCK_N"]`` tokens (16, 32, 64: the tests set
  it) over blocks of 8, 16 and 32 tokens, so a tile spans several blocks, one block, or part of one; every
  context length around a block edge and a tile edge, each at every position of the batch; shuffled block
  tables whose unused entries hold -1 and stale ids pointing at NaN, NaN in every unused slot; GQA groups
  1, 3, 4 and 7 (padded to the 16 rows of ``tl.dot``) and head dim 24 (padded to 32); scores in the
  hundreds whose maximum arrives in the last tile; fp16; inputs left unmodified;
- how it compiles for an A100 (``triton.compile`` for sm_80 in a child process, the chapter's
  ``compile_lab``, at the engine's decode step of batch 64, context 4,096, fp16, head dim 128): no compile
  error, tensor-core instructions (``mma``), no register spill, every K/V tile load 16 bytes wide.
"""

from __future__ import annotations

import pytest
import torch
from test_ex04_online_softmax import _naive, _paged_inputs

pytestmark = pytest.mark.triton
SCALE = 0.3


def _kernel_or_skip(impl):
    from paged import kernels

    if not kernels.HAS_TRITON:
        pytest.skip(kernels.REASON)
    return impl("ex04_fast_decode")


def _decode(ex, inputs, block_n, scale=SCALE):
    """The learner's kernel with ``CONFIG["BLOCK_N"] = block_n``; the inputs must come back unchanged."""
    kept = [t.clone() for t in inputs]
    config = ex.CONFIG
    ex.CONFIG = {**config, "BLOCK_N": block_n}
    try:
        out = ex.learner_decode(*inputs, scale=scale)
    finally:
        ex.CONFIG = config
    names = ("query", "key_cache", "value_cache", "block_tables", "context_lens")
    for name, t, was in zip(names, inputs, kept):
        assert torch.equal(t.isnan(), was.isnan()) and torch.equal(
            t.nan_to_num(), was.nan_to_num()
        ), f"the kernel changed its input {name}: it writes the output only"
    return out


def _check(out, inputs, what, scale=SCALE, tol=1e-5):
    expected = _naive(*inputs, scale)[0]
    assert torch.isfinite(out).all(), (
        f"{what}: NaN or inf in the output (a masked load without other=, "
    )
    "or a position past the context, or a padded row, reached the softmax)"
    err = (out.double() - expected).abs().max().item()
    assert err < tol, f"{what}: off by {err:.3g} from a float64 softmax over each context"


@pytest.mark.exercise("ch04.ex3", points=2, all_or_nothing=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("block_size", "block_n"),
    [(8, 16), (8, 32), (16, 64), (32, 16), (16, 16)],
    ids=[
        f"blocks of {b}, tiles of {n}" for b, n in [(8, 16), (8, 32), (16, 64), (32, 16), (16, 16)]
    ],
)
def test_tiles_of_block_n_tokens_across_blocks(impl, block_size, block_n):
    # Contexts around both edges: 1, a block minus one, a block, a block plus one, a tile minus one, a
    # tile, a tile plus one, two tiles plus three, and 0 (the output of an empty context is 0).
    ex = _kernel_or_skip(impl)
    edges = {0, 1, block_size - 1, block_size, block_size + 1, block_n - 1, block_n, block_n + 1}
    lens = sorted(edges | {2 * block_n + 3})
    inputs = _paged_inputs(lens, 8, 2, 16, block_size, seed=block_size + block_n)
    out = _decode(ex, inputs, block_n)
    _check(out, inputs, f"block size {block_size}, BLOCK_N {block_n}, contexts {lens}")


@pytest.mark.exercise("ch04.ex3", points=2, all_or_nothing=True)
@pytest.mark.timeout(60)
def test_each_length_at_every_position(impl):
    # Each row reads its own table row and its own length: a tile edge, a block edge and a short context,
    # each at every position of the batch.
    ex = _kernel_or_skip(impl)
    lens = [33, 16, 1, 17]
    for k in range(len(lens)):
        rotated = lens[k:] + lens[:k]
        inputs = _paged_inputs(rotated, 4, 2, 16, 8, seed=60 + k)
        _check(_decode(ex, inputs, 16), inputs, f"block size 8, BLOCK_N 16, contexts {rotated}")


@pytest.mark.exercise("ch04.ex3", points=2, all_or_nothing=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"),
    [(2, 2, 16), (6, 2, 24), (8, 2, 16), (14, 2, 16)],
    ids=["group 1", "group 3, head dim 24", "group 4", "group 7"],
)
def test_gqa_groups_padded_to_tensor_core_rows(impl, heads, kv_heads, head_dim):
    # Groups 1, 3, 4 and 7: the rows past the group are padding (masked on load and store); head dim 24
    # is padded to 32 columns.
    ex = _kernel_or_skip(impl)
    inputs = _paged_inputs([5, 40, 17], heads, kv_heads, head_dim, 8, seed=heads + head_dim)
    _check(
        _decode(ex, inputs, 32),
        inputs,
        f"{heads} query heads over {kv_heads} KV heads, head dim {head_dim}",
    )


@pytest.mark.exercise("ch04.ex3", points=2, all_or_nothing=True)
@pytest.mark.timeout(60)
def test_large_scores_with_the_maximum_in_the_last_tile(impl):
    # Scores in the hundreds: exp overflows without the running max, and the max arrives in the last of
    # four tiles, so the earlier tiles' sums must be rescaled.
    ex = _kernel_or_skip(impl)
    inputs = _paged_inputs([64, 61], 4, 2, 16, 8, seed=7, scale_q=20.0)
    query, key_cache = inputs[0], inputs[1]
    last = int(inputs[3][0, 7])  # sequence 0's block of positions 56..63
    key_cache[last, 7] = query[0, :2].sign().mean(0) * 3.0  # a key aligned with both heads' queries
    _check(
        _decode(ex, inputs, 16),
        inputs,
        "scores in the hundreds, the max in the last tile",
        tol=1e-4,
    )


@pytest.mark.exercise("ch04.ex3", points=1, all_or_nothing=True)
@pytest.mark.timeout(60)
def test_half_precision(impl):
    ex = _kernel_or_skip(impl)
    inputs = _paged_inputs([3, 64, 130], 8, 2, 32, 16, seed=4, dtype=torch.float16)
    out = _decode(ex, inputs, 64)
    assert out.dtype == torch.float16, f"the output has the query's dtype, got {out.dtype}"
    _check(out.float(), inputs, "fp16, block size 16, BLOCK_N 64", tol=3e-3)


@pytest.mark.exercise("ch04.ex3", points=3, all_or_nothing=True)
@pytest.mark.timeout(
    240
)  # a cold compile of four kernels in a child process: 10-60 s on 2 busy cores
def test_compiles_for_an_a100_with_tensor_cores_no_spill_and_wide_loads(pytestconfig):
    from paged import kernels

    if not kernels.HAS_TRITON:
        pytest.skip(kernels.REASON)
    from paged_course.bench.kernel_compile import compile_lab
    from paged_course.bench.kernel_compile_report import kv_loads

    try:  # a kernel whose build takes minutes (a large broadcast in place of tl.dot) fails here
        rows = compile_lab(
            pytestconfig.getoption("--impl"), gpus=("A100",), prefill=False, timeout=150
        )
    except RuntimeError as exc:
        pytest.fail(f"_learner_kernel could not be compiled for sm_80: {exc}")
    row = next(r for r in rows if r["kernel"] not in ("teaching", "tuned", "tuned, no hints"))
    assert "error" not in row, f"_learner_kernel does not compile for sm_80: {row['error'][:600]}"
    assert row["mma"] > 0, (
        "no tensor-core instruction (mma) in the A100 build: Q K^T and P V must be tl.dot of the group "
        "padded to BLOCK_M >= 16 rows"
    )
    assert row["stack_bytes"] == 0, (
        f"{row['registers']} registers and {row['stack_bytes']} bytes of stack per thread: the build spills"
    )
    loads = kv_loads(row)
    assert loads["wide"] > 0 and loads["narrow"] == 0, (
        f"K/V tile loads: {loads['wide']} of 16 bytes, {loads['narrow']} narrower: build each row's address "
        "from the integer strides so that Triton can prove 16-byte alignment"
    )
