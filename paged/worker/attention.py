"""The engine's attention backend: any transformers decoder on the paged KV cache, through public hooks.

Nothing in transformers is patched. ``use_paged_attention(model)`` registers two functions under ``"paged"``:

- an attention function (``transformers.AttentionInterface``): it receives one layer's
  ``query [1, H, T, D]`` and ``key``/``value [1, KVH, T, D]`` (rotary already applied) for a *packed*
  batch of ``T`` new tokens from many sequences, writes the new K/V into the pool at their slots, then
  attends each token to its own sequence's context, and returns ``[1, T, H, D]``;
- a mask function (``transformers.masking_utils.AttentionMaskInterface``) that returns ``None``, so
  transformers never builds a ``T x T`` mask: the metadata knows each sequence's extent.

The model runner calls ``model(input_ids [1, T], position_ids [1, T], use_cache=False,
logits_to_keep=<last token of each sampling sequence>, paged_metadata=AttentionMetadata(...))``; the
extra keyword reaches the attention function unchanged (no globals), the layer is ``module.layer_idx``.

A step packs **chunks** first (sequences computing several tokens: a prompt, a prompt chunk, a
recomputed sequence) and **decodes** last (one token each). A chunk attends causally to itself and to its
already computed context, read from the pool through its block table (vLLM v1's chunked prefill); a
chunk with no computed context runs a causal SDPA on its own new K/V without touching the pool. All
decodes go through one call of the decode part (``paged.engine.parts``): the vectorized PyTorch
``decode_attention`` here on CPU, the Triton kernel on CUDA. The idea is vLLM's backend split
(``vllm/v1/attention/backends/``): metadata built once per step, read by every layer.

Trap: ``set_attn_implementation`` writes into the model's config object, shared by every module and by
any other model built from the same object. Deep-copy a config before building a reference model from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from paged.core.block_table import slot_mapping as compute_slot_mapping

ATTN_NAME = "paged"


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store ``key[i]`` / ``value[i]`` ``[T, KVH, D]`` at slot ``slot_mapping[i]`` (int64 ``[T]``) of one
    layer's caches ``[num_blocks, block_size, KVH, D]``: one ``index_copy_`` on the flat
    ``[num_blocks * block_size, KVH, D]`` view (vLLM's ``reshape_and_cache_flash``). Unchecked: the engine
    built the slots from its block tables."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(key_cache.dtype))
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, value.to(value_cache.dtype))


def decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence over its paged context, vectorized over sequences: ``[S, H, D]``.

    query ``[S, H, D]``; caches ``[num_blocks, block_size, KVH, D]``; block_tables int32 ``[S, W]`` whose
    width covers every context (entries past a context hold any valid block id); context_lens int32 ``[S]``.
    One ``index_select`` of whole blocks per cache gives ``[S, W * block_size, KVH, D]``; positions past a
    context get ``-inf`` scores. Then per KV head (a loop over ``KVH``, not over sequences) two batched
    matmuls serve the ``H / KVH`` query heads that share it (GQA). Unchecked (the engine's inputs): the
    pool's unused slots hold finite stale K/V, so masking the scores suffices.
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    index = block_tables.long().flatten()
    keys = key_cache.index_select(0, index).view(num_seqs, -1, num_kv_heads, head_dim)  # [S, C, KVH, D]
    values = value_cache.index_select(0, index).view(num_seqs, -1, num_kv_heads, head_dim)
    hidden = torch.arange(keys.shape[1], device=query.device)[None, :] >= context_lens[:, None]
    bias = torch.zeros(hidden.shape, dtype=query.dtype, device=query.device).masked_fill_(hidden, float("-inf"))
    q = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = torch.empty_like(q)
    for h in range(num_kv_heads):  # scores = bias + scale * q k^T in one op: [S, group, C]
        scores = torch.baddbmm(bias[:, None, :], q[:, h], keys[:, :, h].transpose(1, 2), alpha=scale)
        out[:, h] = torch.bmm(scores.softmax(dim=-1), values[:, :, h])
    return out.view(num_seqs, num_heads, head_dim)


@dataclass
class _Chunk:
    """Packed tokens ``start:end`` of one sequence computing several tokens. With computed context before
    them, ``block_index`` [B] lists the blocks to gather and ``bias`` [1, 1, q, B * block_size] is causal."""

    start: int
    end: int
    block_index: torch.Tensor | None = None
    bias: torch.Tensor | None = None


@dataclass
class AttentionMetadata:
    """What every layer needs for one engine step over a packed batch of ``T`` tokens (chunks, then decodes).

    Fields (on the model's device):
        kv_cache: the ``KVCache`` pool; layer ``l`` uses ``key_cache[l]`` / ``value_cache[l]``.
        positions [T] int64: each token's position in its own sequence (``position_ids``).
        slot_mapping [T] int64: pool slot of each new token, ``block * block_size + offset``.
        keep [K] int64: packed index of the last token of each sequence whose logits are kept.
        chunks: one ``_Chunk`` per multi-token sequence.
        decode_start: packed index of the first decode token (``T`` when there are none).
        block_tables [D, W] int32 / context_lens [D] int32: the decodes' tables and lengths.
        write_kv, decode: the parts that write the K/V and attend the decodes.
    """

    kv_cache: object
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    keep: torch.Tensor
    chunks: list[_Chunk]
    decode_start: int
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    write_kv: Callable = write_kv
    decode: Callable = decode_attention

    @classmethod
    def build(cls, kv_cache, block_tables: list[list[int]], context_lens: list[int], query_lens: list[int],
              block_size: int, device: torch.device | str = "cpu", keep: list[int] | None = None,
              slot_mapping: Callable | None = None, **parts) -> AttentionMetadata:
        """Tensors for one step from per-sequence lists (``S`` entries each; multi-token sequences first).

        ``context_lens[s]`` counts the sequence's tokens after this step; its last ``query_lens[s]`` are
        computed now, at positions ``context_lens[s] - query_lens[s] ..``. ``keep``: sequences whose
        logits are kept (default all). ``slot_mapping``: the part that computes the slots (default
        ``paged.core.block_table.slot_mapping``); ``parts``: ``write_kv=`` / ``decode=``.

        Raises:
            ValueError: mismatched lengths, a query longer than its context, a table too short for its
                context, or a multi-token sequence after a decode.
        """
        num_seqs = len(block_tables)
        if not (len(context_lens) == len(query_lens) == num_seqs) or num_seqs == 0:
            raise ValueError(f"need one block table, context length and query length per sequence, got "
                             f"{num_seqs}, {len(context_lens)}, {len(query_lens)}")
        starts = [c - q for c, q in zip(context_lens, query_lens)]
        for s, (table, ctx, q) in enumerate(zip(block_tables, context_lens, query_lens)):
            if not 0 < q <= ctx or len(table) * block_size < ctx:
                raise ValueError(f"sequence {s}: query {q} tokens, context {ctx} tokens, block table of "
                                 f"{len(table)} blocks x {block_size} slots")
        num_chunks = sum(q > 1 for q in query_lens)
        if any(q > 1 for q in query_lens[num_chunks:]):
            raise ValueError("pack the multi-token sequences (chunks) before the one-token decodes")
        offsets = [0]
        for q in query_lens:
            offsets.append(offsets[-1] + q)
        positions = [p for start, q in zip(starts, query_lens) for p in range(start, start + q)]
        slots = (slot_mapping or compute_slot_mapping)(block_tables, starts, query_lens, block_size)
        as_tensor = lambda x, dtype=torch.int64: torch.tensor(x, dtype=dtype, device=device)  # noqa: E731
        chunks = []
        for s in range(num_chunks):
            chunk = _Chunk(offsets[s], offsets[s + 1])
            if starts[s]:  # computed context before the chunk: read it from the pool, causal from there
                width = -(-context_lens[s] // block_size)
                q_pos = torch.arange(starts[s], context_lens[s], device=device)
                hidden = torch.arange(width * block_size, device=device)[None, :] > q_pos[:, None]
                chunk.block_index = as_tensor(block_tables[s][:width])
                chunk.bias = torch.zeros(hidden.shape, dtype=kv_cache.dtype, device=device).masked_fill_(
                    hidden, float("-inf"))[None, None]
            chunks.append(chunk)
        decodes = block_tables[num_chunks:]
        width = max((len(t) for t in decodes), default=0)
        keep = range(num_seqs) if keep is None else keep
        return cls(kv_cache, as_tensor(positions), as_tensor(slots), as_tensor([offsets[s + 1] - 1 for s in keep]),
                   chunks, offsets[num_chunks], as_tensor([t + [0] * (width - len(t)) for t in decodes], torch.int32),
                   as_tensor(context_lens[num_chunks:], torch.int32), **parts)


def _attend_chunk(c: _Chunk, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                  key_cache: torch.Tensor, value_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """One chunk: ``[q, H, D]`` for its packed tokens ``c.start:c.end``."""
    qs = q[c.start:c.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
    if c.block_index is None:  # nothing computed before: its own new K/V, causal
        ks, vs = (x[c.start:c.end].transpose(0, 1).unsqueeze(0) for x in (k_new, v_new))
        mask, causal = None, True
    else:  # computed context + the chunk's own tokens, all read from the pool
        ks, vs = (cache.index_select(0, c.block_index).flatten(0, 1).transpose(0, 1).unsqueeze(0)
                  for cache in (key_cache, value_cache))
        mask, causal = c.bias, False
    out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal, scale=scale,
                                         enable_gqa=qs.shape[1] != ks.shape[1])
    return out[0].transpose(0, 1)


def paged_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask=None, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """The function registered as ``"paged"`` in ``AttentionInterface`` (signature set by transformers).

    query [1, H, T, D], key/value [1, KVH, T, D]; ``kwargs["paged_metadata"]`` is the step's
    ``AttentionMetadata``. Returns ``([1, T, H, D], None)``.

    Raises:
        RuntimeError: called without ``paged_metadata`` (e.g. ``model.generate`` on a model switched to
            ``"paged"``; switch it back with ``use_attention(model)``).
    """
    meta: AttentionMetadata | None = kwargs.get("paged_metadata")
    if meta is None:
        raise RuntimeError("paged attention called without paged_metadata: this model is switched to the paged "
                           "engine; call model.set_attn_implementation('sdpa') to use it with transformers")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, H, D]
    k_new, v_new = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, KVH, D]
    key_cache, value_cache = meta.kv_cache.key_cache[module.layer_idx], meta.kv_cache.value_cache[module.layer_idx]
    meta.write_kv(key_cache, value_cache, k_new, v_new, meta.slot_mapping)  # every new token before any read
    parts = [_attend_chunk(c, q, k_new, v_new, key_cache, value_cache, scale) for c in meta.chunks]
    if meta.decode_start < q.shape[0]:
        parts.append(meta.decode(q[meta.decode_start:].contiguous(), key_cache, value_cache, meta.block_tables,
                                 meta.context_lens, scale))
    out = parts[0] if len(parts) == 1 else torch.cat(parts)  # packed-token order; one kind needs no copy
    return out.to(q.dtype).unsqueeze(0), None


def select_backend(device: torch.device | str) -> str:
    """Which decode attention to run on ``device``: ``"triton"`` or ``"torch"``.

    ``"triton"`` (``paged.kernels.paged_attention_decode``) on a CUDA device when ``triton`` imports;
    ``"torch"`` (``decode_attention`` here) everywhere else. On CPU the Triton kernels run only through
    the interpreter (``TRITON_INTERPRET=1``), far too slow for an engine. vLLM makes the same choice per
    platform in ``vllm/attention/selector.py``.
    """
    if torch.device(device).type != "cuda":
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"


def _no_mask(*args, **kwargs):
    """Mask function for ``"paged"``: no dense mask; the attention function masks per sequence."""
    return None


def use_paged_attention(model) -> None:
    """Switch ``model`` (a ``PreTrainedModel``) to the paged attention (registered once; idempotent)."""
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTN_NAME, paged_attention_forward)
        AttentionMaskInterface.register(ATTN_NAME, _no_mask)
        model.set_attn_implementation(ATTN_NAME)


def use_attention(model, name: str = "sdpa") -> None:
    """Switch ``model`` back to a transformers attention (``"sdpa"``, ``"eager"``) for ``generate``."""
    if getattr(model.config, "_attn_implementation", None) != name:
        model.set_attn_implementation(name)


def forward_logits(model, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """One packed forward: ``input_ids [T]`` -> logits ``[K, vocab]`` float32 of the kept sequences."""
    out = model(input_ids=input_ids.unsqueeze(0), position_ids=meta.positions.unsqueeze(0), use_cache=False,
                logits_to_keep=meta.keep, paged_metadata=meta)
    return out.logits[0].float()
