"""Graded: chapter 04, the online softmax, the Triton decode kernel and the split-K merge
(exercises/ex04_online_softmax.py).

ch04.ex1 (``online_softmax_update``, PyTorch) is compared with a plain softmax over the whole row; inputs
are signed, large enough that skipping the max subtraction overflows, with ragged last blocks, masked slots
and whole masked blocks. ch04.ex2 (the loop of ``_decode_kernel``, Triton; the interpreter on CPU) writes
into outputs pre-filled with NaN, so an empty loop fails; it reads shuffled block tables of two block sizes
whose unused entries hold -1 and stale ids just past the pool (inside a NaN margin, so that a wrong read
shows as NaN instead of crashing the interpreter), NaN in every unused slot, GQA groups 1, 2, 4 and 7, an
explicit scale, fp16 and bf16, and split-K with empty splits and a context of 0. ch04.ex4 (``merge_splits``)
is compared with one softmax over all the splits' tokens, with log-sum-exps in the hundreds, empty splits
whose partial output is NaN, and rows whose splits are all empty. References are float64, in this file.
"""

from __future__ import annotations

import pytest
import torch

NEG_INF = float("-inf")
SCALE = 0.3  # not head_dim ** -0.5


def _empty_state(rows: int, dim: int):
    return torch.full((rows,), NEG_INF), torch.zeros(rows), torch.zeros(rows, dim)


def _fold(ex, scores, values, cuts):
    """Feed ``scores [N, L]`` / ``values [L, D]`` block by block (block edges at ``cuts``)."""
    m, l, acc = _empty_state(scores.shape[0], values.shape[1])  # noqa: E741
    edges = [0, *cuts, scores.shape[1]]
    for a, b in zip(edges[:-1], edges[1:]):
        m, l, acc = ex.online_softmax_update(m, l, acc, scores[:, a:b].clone(), values[a:b].clone())  # noqa: E741
    return m, l, acc


@pytest.mark.exercise("ch04.ex1", points=2)
@pytest.mark.timeout(
    60
)  # the first ch04 test imports Triton: 2.4 s on a cold 2-vCPU machine (0.3 s warm)
def test_update_single_block_from_empty_state(impl):
    ex = impl("ex04_online_softmax")
    gen = torch.Generator().manual_seed(0)
    scores, values = torch.randn(3, 5, generator=gen) * 4, torch.randn(5, 6, generator=gen)
    m, l, acc = ex.online_softmax_update(*_empty_state(3, 6), scores, values)  # noqa: E741
    expected_m = scores.max(dim=1).values
    p = torch.exp(scores - expected_m[:, None])
    assert torch.allclose(m, expected_m), "m must become the row max of the first block"
    assert torch.allclose(l, p.sum(1), atol=1e-5), "l = sum(exp(scores - m))"
    assert torch.allclose(acc, p @ values, atol=1e-5), "acc = exp(scores - m) @ values"


@pytest.mark.exercise("ch04.ex1", points=2)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_update_chained_equals_softmax(impl, seed):
    ex = impl("ex04_online_softmax")
    gen = torch.Generator().manual_seed(seed)
    length = 23 + seed
    scores = (
        torch.randn(4, length, generator=gen) * 150
    )  # exp(150) overflows float32: subtract the max
    scores[:, -1] += 400  # the max arrives in the last block: earlier blocks must be rescaled
    values = torch.randn(length, 7, generator=gen)
    m, l, acc = _fold(ex, scores, values, cuts=[5, 6, 13])  # noqa: E741 (ragged blocks: 5, 1, 7, rest)
    expected = torch.softmax(scores.double(), dim=1) @ values.double()
    out = acc / l[:, None]
    assert torch.isfinite(out).all(), (
        "overflow: scores must be shifted by the running max before exp"
    )
    assert torch.allclose(out.double(), expected, atol=1e-5), (
        "acc / l after all blocks must equal softmax @ V"
    )
    assert torch.equal(m, scores.max(dim=1).values), "m must end as the max over every block"


@pytest.mark.exercise("ch04.ex1", points=2)
def test_update_masked_slots_and_masked_blocks(impl):
    ex = impl("ex04_online_softmax")
    gen = torch.Generator().manual_seed(4)
    scores, values = torch.randn(2, 12, generator=gen) * 3, torch.randn(12, 4, generator=gen)
    scores[0, :4] = NEG_INF  # row 0: its whole first block is masked (state stays empty)
    scores[:, 9:] = NEG_INF  # the last block is partly masked for both rows
    scores[1, 4:8] = NEG_INF  # row 1: a masked block in the middle
    m, l, acc = _fold(ex, scores, values, cuts=[4, 8])  # noqa: E741
    out = acc / l[:, None]
    keep = torch.isfinite(scores)
    for r in range(2):
        expected = torch.softmax(scores[r, keep[r]].double(), 0) @ values[keep[r]].double()
        assert torch.isfinite(out[r]).all(), (
            f"row {r}: a fully masked block gave NaN (exp(-inf - -inf))"
        )
        assert torch.allclose(out[r].double(), expected, atol=1e-5), (
            f"row {r}: masked slots must weigh 0"
        )
    m0, l0, acc0 = ex.online_softmax_update(
        *_empty_state(1, 4), torch.full((1, 3), NEG_INF), values[:3]
    )
    assert m0.item() == NEG_INF and l0.item() == 0 and not acc0.any(), (
        "an all-masked block on an empty state is a no-op"
    )


# ------------------------------------------------------------------------------- ch04.ex2: the Triton kernel


def _triton_or_skip():
    from paged import kernels

    if not kernels.HAS_TRITON:
        pytest.skip(kernels.REASON)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _paged_inputs(
    lens, num_heads, num_kv_heads, head_dim, block_size, seed, scale_q=1.0, dtype=torch.float32
):
    """Signed random q/K/V; the pool is a view into a NaN-filled buffer one block larger on each side (plus one),
    so that the -1 and the stale ids (num_blocks, num_blocks + 1) in unused table entries point at NaN."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(need) + 2
    junk = torch.tensor([-1, num_blocks, num_blocks + 1], dtype=torch.int32)
    tables = junk[
        (torch.arange(len(lens))[:, None] + torch.arange(width)[None, :]) % 3
    ].contiguous()
    start = 0
    for s, k in enumerate(need):
        tables[s, :k] = perm[start : start + k].int()
        start += k
    storage = torch.full((num_blocks + 3, block_size, num_kv_heads, head_dim), float("nan"))
    for s, n in enumerate(lens):
        for p in range(n):
            blk, off = 1 + tables[s, p // block_size], p % block_size
            storage[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen)
    values = torch.full_like(storage, float("nan"))
    values[~torch.isnan(storage)] = torch.randn(int((~torch.isnan(storage)).sum()), generator=gen)
    storage, values = storage.to(dtype), values.to(dtype)
    key_cache, value_cache = storage[1 : 1 + num_blocks], values[1 : 1 + num_blocks]
    query = (torch.randn(len(lens), num_heads, head_dim, generator=gen) * scale_q).to(dtype)
    return query, key_cache, value_cache, tables, torch.tensor(lens, dtype=torch.int32)


def _naive(query, key_cache, value_cache, tables, lens, scale, positions=None):
    """float64 softmax over each sequence's tokens (``positions(s, n)`` picks a subset); returns (out, lse)."""
    num_seqs, num_heads, head_dim = query.shape
    block_size, group = key_cache.shape[1], num_heads // key_cache.shape[2]
    out = torch.zeros(num_seqs, num_heads, head_dim, dtype=torch.float64)
    lse = torch.full((num_seqs, num_heads), NEG_INF, dtype=torch.float64)
    for s in range(num_seqs):
        pos = list(range(int(lens[s]))) if positions is None else positions(s, int(lens[s]))
        if not pos:
            continue
        blocks = [int(tables[s, p // block_size]) for p in pos]
        offs = [p % block_size for p in pos]
        for h in range(num_heads):
            k, v = (
                key_cache[blocks, offs, h // group].double(),
                value_cache[blocks, offs, h // group].double(),
            )
            x = k @ query[s, h].double() * scale
            out[s, h] = torch.softmax(x, 0) @ v
            lse[s, h] = torch.logsumexp(x, 0)
    return out, lse


def _run(ex, inputs, scale, device):
    out = torch.full_like(inputs[0], float("nan")).to(device)
    ex.paged_decode(*[t.to(device) for t in inputs], scale=scale, out=out)
    return out.cpu()


@pytest.mark.triton
@pytest.mark.exercise("ch04.ex2", points=1)
@pytest.mark.parametrize("group", [1, 2, 4, 7])
@pytest.mark.parametrize("block_size", [4, 8])
def test_kernel_matches_reference(impl, block_size, group):
    device = _triton_or_skip()
    ex = impl("ex04_online_softmax")
    inputs = _paged_inputs(
        [1, block_size, block_size + 1, 3 * block_size + 2],
        2 * group,
        2,
        16,
        block_size,
        seed=block_size + group,
    )
    out = _run(ex, inputs, SCALE, device)
    assert torch.isfinite(out).all(), "the output holds NaN: something past a context leaked in"
    assert out.abs().sum() > 0, (
        "the output is all zeros: the loop never folds a block into m, l and acc"
    )
    err = (out.double() - _naive(*inputs, SCALE)[0]).abs().max().item()
    assert err < 1e-5, (
        f"kernel output differs from the reference by {err:.3g} (GQA group {group}, block size "
        f"{block_size}, scale {SCALE})"
    )


@pytest.mark.triton
@pytest.mark.exercise("ch04.ex2", points=2)
def test_kernel_large_scores_and_head_dim_24(impl):
    device = _triton_or_skip()
    ex = impl("ex04_online_softmax")
    # q scaled by 60: scores reach a few hundred, so exp() without the running max overflows float32
    inputs = _paged_inputs([7, 2, 13], 6, 2, 24, 4, seed=9, scale_q=60.0)
    out = _run(ex, inputs, 24**-0.5, device)
    assert torch.isfinite(out).all(), (
        "NaN/inf in the output: subtract the running max and rescale l and acc"
    )
    err = (out.double() - _naive(*inputs, 24**-0.5)[0]).abs().max().item()
    assert err < 1e-4, (
        f"kernel output differs from the reference by {err:.3g} (scores in the hundreds)"
    )


@pytest.mark.triton
@pytest.mark.exercise("ch04.ex2", points=1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_half_precision(impl, dtype):
    device = _triton_or_skip()
    ex = impl("ex04_online_softmax")
    inputs = _paged_inputs([3, 8, 9], 4, 2, 16, 8, seed=2, dtype=dtype)
    out = _run(ex, inputs, SCALE, device)
    assert out.dtype == dtype and torch.isfinite(out).all(), (
        f"a finite {dtype} output, got {out.dtype}"
    )
    err = (out.double() - _naive(*inputs, SCALE)[0]).abs().max().item()
    tol = {torch.float16: 3e-3, torch.bfloat16: 2.5e-2}[dtype]
    assert err < tol, (
        f"{dtype}: kernel output differs from the reference by {err:.3g} (accumulate in float32)"
    )


@pytest.mark.triton
@pytest.mark.exercise("ch04.ex2", points=1)
@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_kernel_splits_write_each_partial_and_its_lse(impl, num_splits):
    # Split i owns logical blocks [i * per, (i + 1) * per) of the table width W, per = ceil(W / num_splits):
    # a split past its context holds no token (partial 0, lse -inf), and so does every split of a context of 0.
    device = _triton_or_skip()
    ex = impl("ex04_online_softmax")
    lens = [0, 3, 4, 17, 29]
    inputs = _paged_inputs(lens, 4, 2, 16, 4, seed=num_splits)
    width = inputs[3].shape[1]
    per = -(-width // num_splits)
    shape = (len(lens), 4, num_splits)
    partial = torch.full((*shape, 16), float("nan"), device=device)
    lse = torch.full(shape, float("nan"), device=device)
    ex.decode_splits(
        *[t.to(device) for t in inputs],
        scale=SCALE,
        num_splits=num_splits,
        partial=partial,
        lse=lse,
    )
    partial, lse = partial.cpu(), lse.cpu()
    for i in range(num_splits):
        owned = lambda s, n, i=i: [p for p in range(i * per * 4, (i + 1) * per * 4) if p < n]  # noqa: E731
        want_out, want_lse = _naive(*inputs, SCALE, positions=owned)
        empty = torch.isinf(want_lse)
        assert torch.equal(partial[:, :, i][empty], torch.zeros_like(partial[:, :, i][empty])), (
            f"split {i}: a split with no token must write a partial output of 0 (NaN or garbage found)"
        )
        assert torch.equal(lse[:, :, i][empty], want_lse[empty].float()), (
            f"split {i}: a split with no token must write lse = -inf"
        )
        if empty.all():
            continue
        err_out = (partial[:, :, i][~empty].double() - want_out[~empty]).abs().max().item()
        err_lse = (lse[:, :, i][~empty].double() - want_lse[~empty]).abs().max().item()
        assert err_out < 1e-5 and err_lse < 1e-4, (
            f"split {i} of {num_splits}: partial off by {err_out:.3g}, lse off by {err_lse:.3g} (it owns blocks "
            f"{i * per}..{(i + 1) * per - 1} of each table, only those inside the context)"
        )


# ----------------------------------------------------------------------------- ch04.ex4: the split-K merge


def _split_case(seed, scale=100.0):
    """Rows [3, 2] of 40 scores in the hundreds over values [40, 5], cut into 5 splits; split 4 is empty and
    its partial output is NaN. Returns (partial, lse, scores, values) with the true softmax computed from them."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, 2, 40, generator=gen, dtype=torch.float64) * scale
    values = torch.randn(40, 5, generator=gen, dtype=torch.float64)
    cuts = [(0, 7), (7, 8), (8, 25), (25, 40), (40, 40)]
    partial = torch.full((3, 2, len(cuts), 5), float("nan"), dtype=torch.float64)
    lse = torch.full((3, 2, len(cuts)), NEG_INF, dtype=torch.float64)
    for i, (a, b) in enumerate(cuts):
        if a < b:
            partial[:, :, i] = torch.softmax(scores[..., a:b], -1) @ values[a:b]
            lse[:, :, i] = torch.logsumexp(scores[..., a:b], -1)
    return partial.float(), lse.float(), scores, values


@pytest.mark.exercise("ch04.ex4", points=2, all_or_nothing=True)
@pytest.mark.parametrize("seed", [1, 2])
def test_merge_equals_one_softmax_over_all_splits(impl, seed):
    ex = impl("ex04_online_softmax")
    partial, lse, scores, values = _split_case(seed)
    out, lse_total = ex.merge_splits(partial.clone(), lse.clone())
    assert out.shape == (3, 2, 5) and lse_total.shape == (3, 2), (
        f"merge_splits gives out [..., D] and lse [...], got {list(out.shape)} and {list(lse_total.shape)}"
    )
    assert torch.isfinite(out).all(), (
        "NaN/inf in the merged output: shift by the largest lse, and an empty split (lse -inf, partial NaN) weighs 0"
    )
    expected = torch.softmax(scores, -1) @ values
    err = (out.double() - expected).abs().max().item()
    assert err < 1e-5, f"merged output differs from one softmax over all 40 tokens by {err:.3g}"
    err_lse = (lse_total.double() - torch.logsumexp(scores, -1)).abs().max().item()
    assert err_lse < 1e-3, (
        f"merged lse must be the log-sum-exp of all the tokens: off by {err_lse:.3g}"
    )


@pytest.mark.exercise("ch04.ex4", points=2, all_or_nothing=True)
def test_merge_rows_with_only_empty_splits(impl):
    ex = impl("ex04_online_softmax")
    partial, lse, scores, values = _split_case(3, scale=3.0)
    partial[1] = float("nan")  # sequence 1 has a context of 0: every split empty
    lse[1] = NEG_INF
    out, lse_total = ex.merge_splits(partial.clone(), lse.clone())
    assert torch.equal(out[1], torch.zeros_like(out[1])), (
        "a row whose splits are all empty merges to 0, not NaN"
    )
    assert torch.isinf(lse_total[1]).all() and (lse_total[1] < 0).all(), "and its lse is -inf"
    expected = torch.softmax(scores[[0, 2]], -1) @ values
    err = (out[[0, 2]].double() - expected).abs().max().item()
    assert err < 1e-5, f"the other rows must still merge exactly: off by {err:.3g}"
    single, single_lse = ex.merge_splits(partial[:, :, 2:3].clone(), lse[:, :, 2:3].clone())
    assert torch.allclose(single[[0, 2]], partial[[0, 2], :, 2]), "one split merges to itself"


@pytest.mark.triton
@pytest.mark.exercise("ch04.ex4", points=1, uses=("ch04.ex2",), all_or_nothing=True)
@pytest.mark.parametrize("num_splits", [3, 8])
def test_split_k_decode_equals_one_pass(impl, num_splits):
    device = _triton_or_skip()
    ex = impl("ex04_online_softmax")
    inputs = _paged_inputs([1, 9, 30], 6, 2, 16, 4, seed=11)
    out = torch.full_like(inputs[0], float("nan")).to(device)
    ex.paged_decode(*[t.to(device) for t in inputs], scale=SCALE, num_splits=num_splits, out=out)
    assert torch.isfinite(out.cpu()).all(), (
        "split-K output holds NaN (an empty split must merge as a no-op)"
    )
    err = (out.cpu().double() - _naive(*inputs, SCALE)[0]).abs().max().item()
    assert err < 1e-5, (
        f"paged_decode with {num_splits} splits differs from the reference by {err:.3g}"
    )


# --------------------------------------------------- every case at every position of a batch; inputs left alone


@pytest.mark.exercise("ch04.ex1", points=2)
@pytest.mark.parametrize("pos", [0, 1, 2, 3])
def test_update_masked_row_at_every_position_leaves_its_inputs_alone(impl, pos):
    # Four rows whose scores differ in size by hundreds (one shift per row, not one for the batch); row `pos`
    # has its whole first block masked, so it is still empty after it. Every call's inputs must come back as
    # they went in: the caller keeps (m, l, acc) and the block it folded.
    ex = impl("ex04_online_softmax")
    gen = torch.Generator().manual_seed(40 + pos)
    sizes = torch.tensor([300.0, 1.0, 60.0, 0.5]).roll(pos)
    scores = torch.randn(4, 12, generator=gen) * sizes[:, None]
    values = torch.randn(12, 3, generator=gen)
    scores[pos, :4] = NEG_INF
    m, l, acc = _empty_state(4, 3)  # noqa: E741
    for a, b in ((0, 4), (4, 9), (9, 12)):
        inputs = (m, l, acc, scores[:, a:b].clone(), values[a:b].clone())
        kept = [t.clone() for t in inputs]
        m, l, acc = ex.online_softmax_update(*inputs)  # noqa: E741
        for name, t, was in zip(("m", "l", "acc", "scores", "values"), inputs, kept):
            assert torch.equal(t, was), (
                f"online_softmax_update changed its input {name} (block {a}..{b - 1}): return new "
                "tensors; the caller still holds the old state"
            )
        if a == 0:
            assert m[pos].item() == NEG_INF and l[pos].item() == 0 and not acc[pos].any(), (
                f"row {pos} of 4: an all-masked block on an empty state leaves it empty (m -inf, l 0, acc 0)"
            )
    out = acc / l[:, None]
    keep = torch.isfinite(scores)
    for r in range(4):
        expected = torch.softmax(scores[r, keep[r]].double(), 0) @ values[keep[r]].double()
        assert torch.isfinite(out[r]).all(), (
            f"row {r} of 4 (masked row at position {pos}, scores up to {sizes[r]:g}): NaN or inf; each row "
            "is shifted by its own max"
        )
        err = (out[r].double() - expected).abs().max().item()
        assert err < 1e-4, f"row {r} of 4 (masked row at position {pos}): off by {err:.3g}"


@pytest.mark.triton
@pytest.mark.exercise("ch04.ex2", points=1)
def test_kernel_each_length_at_every_position(impl):
    # A context of one token, one that fills its last block exactly, one a token past it and a short one,
    # each at every position of the batch (each row reads its own table row and its own length).
    device = _triton_or_skip()
    ex = impl("ex04_online_softmax")
    lens = [1, 8, 9, 5]
    for k in range(len(lens)):
        rotated = lens[k:] + lens[:k]
        inputs = _paged_inputs(rotated, 4, 2, 16, 4, seed=30 + k)
        out = _run(ex, inputs, SCALE, device)
        assert torch.isfinite(out).all(), f"context lengths {rotated}: NaN in the output"
        err = (out.double() - _naive(*inputs, SCALE)[0]).abs().max().item()
        assert err < 1e-5, f"context lengths {rotated}: kernel output off by {err:.3g}"


@pytest.mark.exercise("ch04.ex4", points=2, all_or_nothing=True)
def test_merge_an_empty_split_at_every_position_leaves_its_inputs_alone(impl):
    ex = impl("ex04_online_softmax")
    partial, lse, scores, values = _split_case(5)
    cuts = [(0, 7), (7, 8), (8, 25), (25, 40), (40, 40)]
    for empty in range(4):  # split `empty` loses its tokens (and split 4 holds none)
        p, s = partial.clone(), lse.clone()
        p[:, :, empty], s[:, :, empty] = float("nan"), NEG_INF
        p[:, :, 4] = float("nan")
        kept = p.clone(), s.clone()
        out, lse_total = ex.merge_splits(p, s)
        assert torch.equal(p.isnan(), kept[0].isnan()) and torch.equal(
            p.nan_to_num(), kept[0].nan_to_num()
        ), "merge_splits changed its input partial (a NaN of an empty split belongs to the caller)"
        assert torch.equal(s, kept[1]), "merge_splits changed its input lse"
        a, b = cuts[empty]
        keep = [t for t in range(40) if not a <= t < b]
        expected = torch.softmax(scores[..., keep], -1) @ values[keep]
        assert torch.isfinite(out).all(), (
            f"empty split at position {empty} of 5: NaN or inf in the output"
        )
        err = (out.double() - expected).abs().max().item()
        assert err < 1e-5, f"empty split at position {empty} of 5: off by {err:.3g}"
        err_lse = (lse_total.double() - torch.logsumexp(scores[..., keep], -1)).abs().max().item()
        assert err_lse < 1e-3, (
            f"empty split at position {empty} of 5: merged lse off by {err_lse:.3g}"
        )
