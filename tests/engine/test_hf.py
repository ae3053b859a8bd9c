"""paged.worker.attention: the attention function registered with transformers, on packed batches over the KV pool."""

from __future__ import annotations

import copy

import pytest
import torch

from paged.engine.parts import Parts
from paged.kernels import launch_decode
from paged.worker.attention import (
    AttentionMetadata,
    prefill_attention,
    use_attention,
    use_paged_attention,
)
from paged.worker.kv_cache import KVCache
from paged.worker.model_runner import forward_logits
from paged.worker.worker import kv_shape
from tests.engine.tiny import TINY_ARCHS, tiny_model


def _pool(model, num_blocks=32, block_size=4, fill=1e4):
    layers, kv_heads, head_dim = kv_shape(model)
    cache = KVCache(layers, num_blocks, block_size, kv_heads, head_dim)
    cache.kv.fill_(fill)  # stale garbage: must never reach the output
    return cache


@torch.inference_mode()
def _contiguous_logits(ref, tokens):
    use_attention(ref, "sdpa")
    return ref(torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_packed_prefill_prefix_hit_and_decode_match_contiguous_forward(arch):
    """One packed batch: a fresh prefill, a prefill after a cached prefix, and two decodes."""
    model = tiny_model(arch)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, 120, (n,), generator=gen).tolist() for n in (9, 11, 6, 13)]
    tables = [[7, 2, 30], [5, 9, 1], [3, 12], [20, 4, 8, 16]]  # shuffled physical blocks, bs 4
    cache, bs = _pool(model), 4
    use_paged_attention(model)
    with torch.inference_mode():
        # step 1: write the history of sequences 1-3 (all but their last token / last 5 tokens)
        history = [None, seqs[1][:6], seqs[2][:-1], seqs[3][:-1]]
        attention = Parts().attention(cache)
        lens = [len(h) for h in history[1:]]
        meta = AttentionMetadata.build(tables[1:], lens, lens, bs, token_ids=sum(history[1:], []))
        forward_logits(model, meta, attention)
        # step 2: seq 0 fresh prefill, seq 1 prefill of 5 tokens after 6 cached, seqs 2-3 decode
        new = [seqs[0], seqs[1][6:], seqs[2][-1:], seqs[3][-1:]]
        meta = AttentionMetadata.build(
            tables, [len(s) for s in seqs], [len(n) for n in new], bs, token_ids=sum(new, [])
        )
        logits = forward_logits(model, meta, attention)
    assert logits.shape == (4, model.config.vocab_size)
    for row, tokens in enumerate(seqs):
        torch.testing.assert_close(
            logits[row],
            _contiguous_logits(ref, tokens),
            atol=2e-5,
            rtol=1e-4,
            msg=f"{arch}: sequence {row} logits differ from a contiguous forward",
        )
    assert (
        ref.config._attn_implementation == "sdpa" and model.config._attn_implementation == "paged"
    ), "the deep-copied reference must keep its own attention (config trap)"


def test_metadata_slot_mapping_positions_and_boundaries():
    meta = AttentionMetadata.build(
        [[10, 11, 12], [2, 9], [3, 1]], [8, 7, 5], [8, 3, 1], 4, keep=[0, 2]
    )
    assert meta.positions.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 4]
    # case 5: bs 4, table [10, 11, 12], L = 8: the last token's slot is 11 * 4 + 3 = 47, not 43
    assert meta.slot_mapping.tolist() == [40, 41, 42, 43, 44, 45, 46, 47, 36, 37, 38, 4]
    assert meta.keep.tolist() == [7, 11], "logits only for the kept sequences' last tokens"
    assert meta.decode_start == 11
    assert meta.decode_block_tables.dtype == torch.int32
    assert meta.decode_block_tables.tolist() == [[3, 1]], "decodes only"
    assert meta.decode_context_lens.tolist() == [5]
    assert meta.num_chunks == 2 and meta.max_query_len == 8
    assert meta.query_start.tolist() == [0, 8, 11, 12]
    assert meta.context_lens.tolist() == [8, 7, 5]
    assert meta.block_tables[:2].tolist() == [[10, 11, 12], [2, 9, 0]], "zero-padded tables"


def test_prefill_attention_attends_cached_prefix_plus_itself_causally():
    """Chunk c's row i sits at position context_lens[c] - chunk_len + i and sees positions 0 .. that one,
    read from the pool (GQA: 4 query heads over 2 KV heads); checked against one softmax per row."""
    gen = torch.Generator().manual_seed(3)
    bs, heads, kv_heads, dim = 4, 4, 2, 8
    key_cache = torch.randn(16, bs, kv_heads, dim, generator=gen)
    value_cache = torch.randn(16, bs, kv_heads, dim, generator=gen)
    tables = [[5, 2, 9], [7, 1]]
    ctx, chunk = [10, 6], [3, 6]  # chunk 0: 7 cached tokens + 3 new; chunk 1: a fresh prompt
    query = torch.randn(sum(chunk), heads, dim, generator=gen)
    out = prefill_attention(
        query,
        key_cache,
        value_cache,
        torch.tensor([tables[0], tables[1] + [0]]),
        torch.tensor([0, 3, 9]),
        torch.tensor(ctx),
        max(chunk),
        0.5,
    )
    row = 0
    for c in range(2):
        slots = [tables[c][p // bs] * bs + p % bs for p in range(ctx[c])]
        keys = key_cache.flatten(0, 1)[slots].repeat_interleave(heads // kv_heads, 1)
        values = value_cache.flatten(0, 1)[slots].repeat_interleave(heads // kv_heads, 1)
        for i in range(chunk[c]):
            position = ctx[c] - chunk[c] + i
            scores = torch.einsum("hd,khd->hk", query[row], keys[: position + 1]) * 0.5
            want = torch.einsum("hk,khd->hd", scores.softmax(-1), values[: position + 1])
            torch.testing.assert_close(out[row], want, rtol=1e-5, atol=1e-5)
            row += 1


@pytest.mark.parametrize(
    "tables, ctx, q, match",
    [
        ([[1]], [5], [5], "block table of 1 blocks"),
        ([[1, 2]], [3], [4], "query 4 tokens, context 3"),
        ([[1], [2]], [1], [1, 1], "one block table"),
        ([[1], [2]], [1, 3], [1, 3], "sequences .chunks. before the one-token decodes"),
    ],
)
def test_metadata_bad_input(tables, ctx, q, match):
    with pytest.raises(ValueError, match=match):
        AttentionMetadata.build(tables, ctx, q, 4)


def test_switched_model_without_metadata_raises_clearly():
    model = tiny_model("llama")
    use_paged_attention(model)
    with pytest.raises(RuntimeError, match="paged_metadata"):
        model(torch.tensor([[1, 2, 3]]))
    use_attention(model, "sdpa")
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 128), (
        "switching back restores transformers"
    )


@pytest.mark.triton
def test_triton_decode_backend_matches_torch_backend():
    """The chapter 04 kernel serves the decode tokens (interpreter on CPU): same logits as the torch path."""
    pytest.importorskip("triton")
    model = tiny_model("llama")
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(1, 120, (n,), generator=gen).tolist() for n in (7, 10)]
    tables = [[6, 1], [2, 9, 4]]
    results = []
    for backend in ("torch", "triton"):
        cache = _pool(model, num_blocks=12, fill=0.0)
        use_paged_attention(model)
        with torch.inference_mode():
            lens, history = [len(s) - 1 for s in seqs], sum((s[:-1] for s in seqs), [])
            meta = AttentionMetadata.build(tables, lens, lens, 4, token_ids=history)
            forward_logits(model, meta, Parts().attention(cache))
            decode = None if backend == "torch" else launch_decode
            attention = Parts(decode_attention=decode).attention(cache)
            meta = AttentionMetadata.build(
                tables, [len(s) for s in seqs], [1, 1], 4, token_ids=[s[-1] for s in seqs]
            )
            results.append(forward_logits(model, meta, attention))
    torch.testing.assert_close(
        results[1],
        results[0],
        atol=1e-4,
        rtol=1e-4,
        msg="Triton decode kernel and torch gather path disagree",
    )
