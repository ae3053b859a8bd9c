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
already computed context, read from the pool through its block table (vLLM v1's chunked prefill). On
CPU each chunk is one SDPA call (a chunk with no computed context on its own new K/V, without touching
the pool); on CUDA every chunk of the step goes through one call of the Triton prefill kernel
(``paged.kernels.launch_prefill``). All decodes go through one call of the decode part
(``paged.engine.parts``): the vectorized PyTorch ``decode_attention`` here on CPU, the Triton kernel on
CUDA. The idea is vLLM's backend split (``vllm/v1/attention/backends/``): metadata built once per step
(on the host, copied to the device in one transfer), read by every layer.

Trap: ``set_attn_implementation`` writes into the model's config object, shared by every module and by
any other model built from the same object. Deep-copy a config before building a reference model from it.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from paged.core.block_table import slot_mapping as compute_slot_mapping

ATTN_NAME = "paged"


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key[i]`` / ``value[i]`` ``[T, KVH, D]`` at slot ``slot_mapping[i]`` (int64 ``[T]``) of one
    layer's caches ``[num_blocks, block_size, KVH, D]``: one ``index_copy_`` on the flat
    ``[num_blocks * block_size, KVH, D]`` view (vLLM's ``reshape_and_cache_flash``). Unchecked: the engine
    built the slots from its block tables."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(key_cache.dtype))
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(
        0, slot_mapping, value.to(value_cache.dtype)
    )


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence over its paged context, vectorized over sequences: ``[S, H, D]``.

    query ``[S, H, D]``; caches ``[num_blocks, block_size, KVH, D]``; block_tables int32 ``[S, W]`` whose
    width covers every context (entries past a context hold any valid block id); context_lens int32 ``[S]``.
    One ``index_select`` of whole blocks per cache gives ``[S, W * block_size, KVH, D]``; positions past a
    context get a ``-inf`` bias. Then one ``scaled_dot_product_attention`` call in which the ``H / KVH``
    query heads sharing a KV head are that head's query rows (GQA without repeating K/V, no loop over
    heads or sequences). Unchecked (the engine's inputs): the pool's unused slots hold finite stale K/V,
    so masking the scores suffices.
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    index = block_tables.long().flatten()
    keys, values = (
        cache.index_select(0, index).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
        for cache in (key_cache, value_cache)
    )  # [S, KVH, C, D]
    hidden = torch.arange(keys.shape[2], device=query.device)[None, :] >= context_lens[:, None]
    bias = torch.zeros(hidden.shape, dtype=query.dtype, device=query.device).masked_fill_(
        hidden, float("-inf")
    )
    q = query.view(
        num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim
    )  # [S, KVH, group, D]
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=bias[:, None, None], scale=scale
    )
    return out.reshape(num_seqs, num_heads, head_dim)


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
    """What every layer needs for one engine step over a packed batch of ``T`` tokens from ``S`` sequences
    (``C`` chunks, then decodes).

    Fields (on the model's device; every integer tensor is a view of one int64 buffer, built on the host
    and copied to the device in one transfer):
        kv_cache: the ``KVCache`` pool; layer ``l`` uses ``key_cache[l]`` / ``value_cache[l]``.
        input_ids [T] int64: the packed tokens (empty when ``build`` got no ``token_ids``).
        positions [T] int64: each token's position in its own sequence (``position_ids``).
        slot_mapping [T] int64: pool slot of each new token, ``block * block_size + offset``.
        keep [K] int64: packed index of the last token of each sequence whose logits are kept.
        seq_lens [S] / query_start [S + 1] / tables [S, W] int64: every sequence's tokens after this step,
            packed offsets of its new tokens, block table (zero-padded); the chunk kernel reads the first ``C``.
        chunks: one ``_Chunk`` per multi-token sequence (the per-chunk PyTorch path).
        decode_start: packed index of the first decode token (``T`` when there are none).
        block_tables [D, W'] int32 / context_lens [D] int32: the decodes' tables and lengths.
        max_query_len: the longest chunk (host int; sizes the chunk kernel's grid).
        write_kv, decode: the parts that write the K/V and attend the decodes; ``prefill``: ``None`` (one
            SDPA per chunk) or a kernel attending every chunk in one call (CUDA: ``paged.kernels``).
    """

    kv_cache: object
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    keep: torch.Tensor
    seq_lens: torch.Tensor
    query_start: torch.Tensor
    tables: torch.Tensor
    chunks: list[_Chunk]
    decode_start: int
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    max_query_len: int = 1
    write_kv: Callable = write_kv
    decode: Callable = decode_attention
    prefill: Callable | None = None

    @staticmethod
    def pack(
        block_tables: list[list[int]],
        context_lens: list[int],
        query_lens: list[int],
        block_size: int,
        keep: list[int] | None = None,
        slot_mapping: Callable | None = None,
        token_ids: list[int] | None = None,
        width: int | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """The step's integers in one host int64 tensor, and the layout ``from_buffer`` reads it with
        (arguments as ``build``; ``width``: table columns, default the widest table).

        Raises:
            ValueError: mismatched lengths, a query longer than its context, a table too short for its
                context, or a multi-token sequence after a decode.
        """
        num_seqs = len(block_tables)
        if not (len(context_lens) == len(query_lens) == num_seqs) or num_seqs == 0:
            raise ValueError(
                f"need one block table, context length and query length per sequence, got "
                f"{num_seqs}, {len(context_lens)}, {len(query_lens)}"
            )
        starts = [c - q for c, q in zip(context_lens, query_lens)]
        for s, (table, ctx, q) in enumerate(zip(block_tables, context_lens, query_lens)):
            if not 0 < q <= ctx or len(table) * block_size < ctx:
                raise ValueError(
                    f"sequence {s}: query {q} tokens, context {ctx} tokens, block table of "
                    f"{len(table)} blocks x {block_size} slots"
                )
        num_chunks = sum(q > 1 for q in query_lens)
        if any(q > 1 for q in query_lens[num_chunks:]):
            raise ValueError("pack the multi-token sequences (chunks) before the one-token decodes")
        offsets = list(itertools.accumulate(query_lens, initial=0))
        decode_width = width or max(
            (len(t) for t in block_tables[num_chunks:]), default=0
        )  # a fixed width
        width = width or max(
            len(t) for t in block_tables
        )  # (a CUDA graph's buffers) holds for the decodes too
        keep = range(num_seqs) if keep is None else keep
        flat = array.array(
            "q", token_ids or ()
        )  # one int64 buffer, field after field (from_buffer's order)
        for start, q in zip(starts, query_lens):
            flat.extend(range(start, start + q))
        flat.extend(
            (slot_mapping or compute_slot_mapping)(block_tables, starts, query_lens, block_size)
        )
        flat.extend([*(offsets[s + 1] - 1 for s in keep), *context_lens, *offsets])
        for table in block_tables:
            flat.extend(table + [0] * (width - len(table)))
        layout = {
            "sizes": [
                len(token_ids or ()),
                offsets[-1],
                offsets[-1],
                len(keep),
                num_seqs,
                num_seqs + 1,
                num_seqs * width,
            ],
            "width": width,
            "decode_width": decode_width,
            "chunks": [(offsets[s], offsets[s + 1], starts[s]) for s in range(num_chunks)],
            "max_query_len": max(query_lens),
        }
        return torch.frombuffer(flat, dtype=torch.int64), layout

    @classmethod
    def from_buffer(
        cls, kv_cache, buf: torch.Tensor, layout: dict, block_size: int, **parts
    ) -> AttentionMetadata:
        """Views of ``buf`` (the device copy of ``pack``'s tensor); only the decodes' int32 tables are copies."""
        ids, positions, slots, keep, lens, query_start, tables = buf.split(layout["sizes"])
        tables = tables.view(len(lens), layout["width"])
        chunks = []
        for i, (first, last, start) in enumerate(layout["chunks"]):
            chunks.append(_Chunk(first, last))
            if (
                start and parts.get("prefill") is None
            ):  # computed context first: read it from the pool
                ctx, width = start + last - first, -(-(start + last - first) // block_size)
                visible = torch.arange(width * block_size, device=buf.device)
                chunks[-1].block_index = tables[i, :width]
                chunks[-1].bias = torch.zeros(
                    visible.shape, dtype=kv_cache.dtype, device=buf.device
                ).masked_fill(
                    visible > torch.arange(start, ctx, device=buf.device)[:, None], float("-inf")
                )[None, None]
        c = len(chunks)
        return cls(
            kv_cache,
            ids,
            positions,
            slots,
            keep,
            lens,
            query_start,
            tables,
            chunks,
            chunks[-1].end if c else 0,
            tables[c:, : layout["decode_width"]].to(torch.int32),
            lens[c:].to(torch.int32),
            layout["max_query_len"],
            **parts,
        )

    @classmethod
    def build(
        cls,
        kv_cache,
        block_tables: list[list[int]],
        context_lens: list[int],
        query_lens: list[int],
        block_size: int,
        device: torch.device | str = "cpu",
        keep: list[int] | None = None,
        slot_mapping: Callable | None = None,
        token_ids: list[int] | None = None,
        **parts,
    ) -> AttentionMetadata:
        """Tensors for one step from per-sequence lists (``S`` entries each; multi-token sequences first).

        ``context_lens[s]`` counts the sequence's tokens after this step; its last ``query_lens[s]`` are
        computed now, at positions ``context_lens[s] - query_lens[s] ..``. ``keep``: sequences whose
        logits are kept (default all). ``slot_mapping``: the part that computes the slots (default
        ``paged.core.block_table.slot_mapping``); ``token_ids``: the packed input ids (they travel in the
        same transfer); ``parts``: ``write_kv=`` / ``decode=`` / ``prefill=``. Errors as ``pack``.
        """
        host, layout = cls.pack(
            block_tables, context_lens, query_lens, block_size, keep, slot_mapping, token_ids
        )
        if torch.device(device).type == "cuda":  # pinned host memory: one asynchronous copy
            host = host.pin_memory().to(device, non_blocking=True)
        return cls.from_buffer(kv_cache, host, layout, block_size, **parts)


def _attend_chunk(
    c: _Chunk,
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One chunk: ``[q, H, D]`` for its packed tokens ``c.start:c.end``."""
    qs = q[c.start : c.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
    if c.block_index is None:  # nothing computed before: its own new K/V, causal
        ks, vs = (x[c.start : c.end].transpose(0, 1).unsqueeze(0) for x in (k_new, v_new))
        mask, causal = None, True
    else:  # computed context + the chunk's own tokens, all read from the pool
        ks, vs = (
            cache.index_select(0, c.block_index).flatten(0, 1).transpose(0, 1).unsqueeze(0)
            for cache in (key_cache, value_cache)
        )
        mask, causal = c.bias, False
    out = F.scaled_dot_product_attention(
        qs,
        ks,
        vs,
        attn_mask=mask,
        is_causal=causal,
        scale=scale,
        enable_gqa=qs.shape[1] != ks.shape[1],
    )
    return out[0].transpose(0, 1)


def paged_attention_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask=None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """The function registered as ``"paged"`` in ``AttentionInterface`` (signature set by transformers).

    query [1, H, T, D], key/value [1, KVH, T, D]; ``kwargs["paged_metadata"]`` is the step's
    ``AttentionMetadata``. Returns ``([1, T, H, D], None)``.

    Raises:
        RuntimeError: called without ``paged_metadata`` (e.g. ``model.generate`` on a model switched to
            ``"paged"``; switch it back with ``use_attention(model)``).
    """
    meta: AttentionMetadata | None = kwargs.get("paged_metadata")
    if meta is None:
        raise RuntimeError(
            "paged attention called without paged_metadata: this model is switched to the paged "
            "engine; call model.set_attn_implementation('sdpa') to use it with transformers"
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, H, D]
    k_new, v_new = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, KVH, D]
    key_cache, value_cache = (
        meta.kv_cache.key_cache[module.layer_idx],
        meta.kv_cache.value_cache[module.layer_idx],
    )
    meta.write_kv(
        key_cache, value_cache, k_new, v_new, meta.slot_mapping
    )  # every new token before any read
    if meta.prefill is not None and meta.chunks:  # every chunk in one kernel call
        c = len(meta.chunks)
        parts = [
            meta.prefill(
                q[: meta.decode_start],
                key_cache,
                value_cache,
                meta.tables[:c],
                meta.query_start[: c + 1],
                meta.seq_lens[:c],
                meta.max_query_len,
                scale,
            )
        ]
    else:
        parts = [
            _attend_chunk(c, q, k_new, v_new, key_cache, value_cache, scale) for c in meta.chunks
        ]
    if meta.decode_start < q.shape[0]:
        parts.append(
            meta.decode(
                q[meta.decode_start :].contiguous(),
                key_cache,
                value_cache,
                meta.block_tables,
                meta.context_lens,
                scale,
            )
        )
    out = (
        parts[0] if len(parts) == 1 else torch.cat(parts)
    )  # packed-token order; one kind needs no copy
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
    out = model(
        input_ids=input_ids.unsqueeze(0),
        position_ids=meta.positions.unsqueeze(0),
        use_cache=False,
        logits_to_keep=meta.keep,
        paged_metadata=meta,
    )
    return out.logits[0].float()
