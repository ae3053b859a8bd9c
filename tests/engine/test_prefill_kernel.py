"""The varlen paged prefill kernel, ``paged.kernels.launch_prefill`` (interpreter on CPU, tiny shapes).

Against a PyTorch reference written here (gather each sequence's blocks, causal mask offset by the cached
context, softmax in float64): chunks with and without cached context, a one-token chunk, chunks longer
than one query tile, shuffled block tables, NaN in every slot no token owns, GQA, a head dim that is not
a power of two, fp32 and fp16; and the engine path: a packed step whose chunks go through the kernel
gives the logits of the per-chunk PyTorch path.
"""

from __future__ import annotations

import math

import pytest
import torch

from paged import kernels

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

from paged.kernels import launch_prefill  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 3e-3}


def make_step(ctx_lens, q_lens, block_size, num_heads, num_kv_heads, head_dim, dtype, seed=0):
    """Pool with NaN in unowned slots, shuffled tables, packed queries: ``(q, k, v, tables, starts, lens)``."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(widths) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for w in widths:
        tables.append(ids[at : at + w])
        at += w
    k = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    v = torch.full_like(k, float("nan"))
    for table, ctx in zip(tables, ctx_lens):
        for pos in range(ctx):
            k[table[pos // block_size], pos % block_size] = torch.randn(
                num_kv_heads, head_dim, generator=gen
            )
            v[table[pos // block_size], pos % block_size] = torch.randn(
                num_kv_heads, head_dim, generator=gen
            )
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
    width = max(widths)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return (
        to(q.to(dtype)),
        to(k.to(dtype)),
        to(v.to(dtype)),
        to(bt),
        to(starts),
        to(torch.tensor(ctx_lens, dtype=torch.int32)),
    )


def reference(q, k, v, bt, starts, lens, scale):
    """Each chunk's tokens against its gathered context, causal from its first position, float64."""
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    group = q.shape[1] // k.shape[2]
    out = torch.zeros_like(q)
    for c in range(bt.shape[0]):
        first, last, ctx = int(starts[c]), int(starts[c + 1]), int(lens[c])
        rows = bt[c].cpu().long()
        keys = k[rows].flatten(0, 1)[:ctx].repeat_interleave(group, dim=1)  # [ctx, H, D]
        values = v[rows].flatten(0, 1)[:ctx].repeat_interleave(group, dim=1)
        pos = torch.arange(ctx - (last - first), ctx)
        scores = torch.einsum("qhd,khd->hqk", q[first:last], keys) * scale
        scores = scores.masked_fill(
            torch.arange(ctx)[None, None, :] > pos[None, :, None], float("-inf")
        )
        out[first:last] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "ctx_lens, q_lens, block_size, heads, kv_heads, head_dim",
    [
        (
            [7, 13, 20],
            [7, 5, 1],
            4,
            4,
            2,
            16,
        ),  # fresh prompt, a chunk after 8 cached tokens, a 1-token chunk
        (
            [37, 19],
            [21, 19],
            8,
            2,
            1,
            24,
        ),  # a chunk longer than one 16-token query tile; head dim 24 (padded to 32)
        ([18], [3], 16, 8, 2, 16),  # cached context spanning two blocks, group of 4
    ],
)
def test_prefill_matches_reference(ctx_lens, q_lens, block_size, heads, kv_heads, head_dim, dtype):
    q, k, v, bt, starts, lens = make_step(
        ctx_lens, q_lens, block_size, heads, kv_heads, head_dim, dtype
    )
    scale = 1 / math.sqrt(head_dim)
    out = launch_prefill(q, k, v, bt, starts, lens, max(q_lens))
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "NaN in slots no token owns leaked into the output"
    err = (out.double().cpu() - reference(q, k, v, bt, starts, lens, scale)).abs().max().item()
    assert err <= TOL[dtype], f"{dtype}: max error {err:.2e} > {TOL[dtype]}"


def test_scale_and_int64_tables():
    q, k, v, bt, starts, lens = make_step([9, 6], [4, 6], 4, 2, 2, 16, torch.float32, seed=3)
    out = launch_prefill(q, k, v, bt.long(), starts.long(), lens.long(), 6, scale=0.3)
    err = (out.double().cpu() - reference(q, k, v, bt, starts, lens, 0.3)).abs().max().item()
    assert err <= TOL[torch.float32], f"explicit scale / int64 tables: max error {err:.2e}"


@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32)])
def test_query_and_kv_tiles_of_different_sizes(monkeypatch, block_m, block_n):
    """sm_80 at head dim 128 runs 64 x 32 tiles (``launch_config.prefill_config``): the causal walk must
    not assume BLOCK_M == BLOCK_N. Here 32 x 16 and 16 x 32, chunks longer than a tile, a cached context."""
    from paged.kernels import prefill_attention

    config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 1}
    monkeypatch.setattr(prefill_attention, "prefill_config", lambda *args: config)
    q, k, v, bt, starts, lens = make_step([45, 70], [45, 37], 8, 4, 2, 16, torch.float32, seed=5)
    out = launch_prefill(q, k, v, bt, starts, lens, 45)
    err = (out.double().cpu() - reference(q, k, v, bt, starts, lens, 0.25)).abs().max().item()
    assert err <= TOL[torch.float32], f"{block_m} x {block_n} tiles: max error {err:.2e}"


def test_engine_chunks_through_the_kernel_match_the_torch_path():
    """A packed step (a fresh prompt, a chunk after cached context, two decodes) on a tiny Llama: the metadata
    with ``prefill=launch_prefill`` (one kernel call per layer) gives the per-chunk SDPA path's logits."""
    from paged.engine.parts import Parts
    from paged.worker.attention import AttentionMetadata, use_paged_attention
    from paged.worker.kv_cache import KVCache
    from paged.worker.model_runner import forward_logits
    from paged.worker.worker import kv_shape
    from tests.engine.tiny import tiny_model

    model = tiny_model("llama")
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, 120, (n,), generator=gen).tolist() for n in (9, 11, 6, 13)]
    tables, bs = [[7, 2, 30], [5, 9, 1], [3, 12], [20, 4, 8, 16]], 4
    history = [seqs[1][:6], seqs[2][:-1], seqs[3][:-1]]
    new = [seqs[0], seqs[1][6:], seqs[2][-1:], seqs[3][-1:]]
    results = []
    use_paged_attention(model)
    for prefill in (None, launch_prefill):
        layers, kv_heads, head_dim = kv_shape(model)
        cache = KVCache(layers, 32, bs, kv_heads, head_dim)
        with torch.inference_mode():
            attention = Parts(prefill_attention=prefill).attention(cache)
            lens = [len(h) for h in history]
            meta = AttentionMetadata.build(tables[1:], lens, lens, bs, token_ids=sum(history, []))
            forward_logits(model, meta, attention)
            meta = AttentionMetadata.build(
                tables, [len(s) for s in seqs], [len(n) for n in new], bs, token_ids=sum(new, [])
            )
            results.append(forward_logits(model, meta, attention))
    torch.testing.assert_close(
        results[1],
        results[0],
        atol=1e-4,
        rtol=1e-4,
        msg="chunks through the prefill kernel disagree with the per-chunk SDPA path",
    )
