"""The engine's attention backend: any transformers decoder on the paged KV cache, through public hooks.

Nothing in transformers is patched. ``use_paged_attention(model)`` registers two functions under ``"paged"``:

- an attention function (``transformers.AttentionInterface``): it receives one layer's
  ``query [1, H, T, D]`` and ``key``/``value [1, KVH, T, D]`` (rotary already applied) for a *packed*
  batch of ``T`` new tokens from many sequences, writes the new K/V into the pool at their slots, then
  attends each token to its own sequence's context, and returns ``[1, T, H, D]``;
- a mask function (``transformers.masking_utils.AttentionMaskInterface``) that returns ``None``, so
  transformers never builds a ``T x T`` mask: the metadata knows each sequence's extent.

The model runner calls ``model(input_ids [1, T], position_ids [1, T], use_cache=False,
logits_to_keep=<last token of each sampling sequence>, paged_metadata=AttentionMetadata(...),
paged_backend=AttentionBackend(...))``; the extra keywords reach the attention function unchanged (no
globals), the layer is ``module.layer_idx``. The metadata are the step's tensors; the backend is the
engine's attention parts, resolved once per engine.

A step packs **chunks** first (sequences computing several tokens: a prompt, a prompt chunk, a
recomputed sequence) and **decodes** last (one token each). A chunk attends causally to itself and to its
already computed context, read from the pool through its block table (vLLM v1's chunked prefill, 0.10.2). Every
chunk of the step goes through one call of the prefill part (``prefill_attention`` here on CPU, one SDPA
per chunk; the Triton kernel ``paged.kernels.launch_prefill`` on CUDA), all decodes through one call of
the decode part (the vectorized ``decode_attention`` here on CPU, the Triton kernel on CUDA); the parts
are resolved in ``paged.engine.parts``. The idea is vLLM v1's backend split (``vllm/v1/attention/backends/``, 0.10.2):
metadata built once per step (on the host, copied to the device in one transfer), read by every layer.

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
    ``[num_blocks * block_size, KVH, D]`` view (vLLM v1's ``reshape_and_cache_flash``, ``vllm/_custom_ops.py``,
    0.10.2). Unchecked: the engine built the slots from its block tables."""
    for cache, new in ((key_cache, key), (value_cache, value)):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, new.to(cache.dtype))


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
    context are masked out. Then one ``scaled_dot_product_attention`` call in which the ``H / KVH``
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
    visible = torch.arange(keys.shape[2], device=query.device)[None, :] < context_lens[:, None]
    # [S, KVH, group, D]
    q = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=visible[:, None, None], scale=scale
    )
    return out.reshape(num_seqs, num_heads, head_dim)


def prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of ``C`` chunks over their paged contexts, read from the pool: ``[T, H, D]``.

    query ``[T, H, D]`` (chunk ``c`` is rows ``query_start[c]:query_start[c + 1]``); caches
    ``[num_blocks, block_size, KVH, D]`` already holding every chunk's new K/V; block_tables int ``[C, W]``;
    query_start int ``[C + 1]``; context_lens int ``[C]``: each chunk's tokens after this step, so its row
    ``i`` sits at position ``context_lens[c] - chunk_len + i`` and sees positions ``0 ..`` that one
    (its cached prefix plus itself; vLLM v1's chunked prefill, 0.10.2). ``max_query_len`` is unused here (it
    sizes the Triton kernel's grid, ``paged.kernels.launch_prefill``, which has this signature). One
    ``scaled_dot_product_attention`` per chunk, the ``H / KVH`` query heads of a KV head sharing it (GQA).
    Unchecked (the engine's inputs).
    """
    block_size = key_cache.shape[1]
    starts, lens = query_start.tolist(), context_lens.tolist()
    outs = []
    for c, ctx in enumerate(lens):
        q = query[starts[c] : starts[c + 1]].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        blocks = block_tables[c, : -(-ctx // block_size)].long()
        keys, values = (
            cache.index_select(0, blocks).flatten(0, 1)[:ctx].transpose(0, 1).unsqueeze(0)
            for cache in (key_cache, value_cache)
        )  # [1, KVH, ctx, D]
        num_new = q.shape[2]
        mask = None
        if num_new < ctx:  # a cached prefix: row i sees positions <= ctx - num_new + i
            rows = torch.arange(ctx - num_new, ctx, device=query.device)
            mask = torch.arange(ctx, device=query.device)[None, :] <= rows[:, None]
        out = F.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=q.shape[1] != keys.shape[1],
        )
        outs.append(out[0].transpose(0, 1))
    return outs[0] if len(outs) == 1 else torch.cat(outs)


@dataclass(frozen=True)
class StepLayout:
    """How ``prepare_inputs``'s int64 buffer splits into ``AttentionMetadata``'s fields: the field
    ``sizes`` in order, table columns ``width`` (``decode_width`` for the decodes), the number of chunks
    and the longest chunk."""

    sizes: tuple[int, ...]
    width: int
    decode_width: int
    num_chunks: int
    max_query_len: int


def prepare_inputs(
    block_tables: list[list[int]],
    context_lens: list[int],
    query_lens: list[int],
    block_size: int,
    keep: list[int] | None = None,
    slot_mapping: Callable | None = None,
    token_ids: list[int] | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, StepLayout]:
    """The step's integers in one host int64 tensor, and the ``StepLayout`` ``AttentionMetadata.from_buffer``
    reads it with (arguments as ``AttentionMetadata.build``; ``width``: table columns, default the widest).

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
    # a fixed width (a CUDA graph's buffers) holds for the decodes too
    decode_width = width or max((len(t) for t in block_tables[num_chunks:]), default=0)
    width = width or max(len(t) for t in block_tables)
    keep = range(num_seqs) if keep is None else keep
    # one int64 buffer, field after field (from_buffer's order)
    flat = array.array("q", token_ids or ())
    for start, q in zip(starts, query_lens):
        flat.extend(range(start, start + q))
    flat.extend(
        (slot_mapping or compute_slot_mapping)(block_tables, starts, query_lens, block_size)
    )
    flat.extend([*(offsets[s + 1] - 1 for s in keep), *context_lens, *offsets])
    for table in block_tables:
        flat.extend(table + [0] * (width - len(table)))
    num_tokens = offsets[-1]
    sizes = (len(token_ids or ()), num_tokens, num_tokens, len(keep), num_seqs, num_seqs + 1)
    layout = StepLayout(
        (*sizes, num_seqs * width), width, decode_width, num_chunks, max(query_lens)
    )
    return torch.frombuffer(flat, dtype=torch.int64), layout


@dataclass
class AttentionMetadata:
    """What every layer needs for one engine step over a packed batch of ``T`` tokens from ``S`` sequences
    (``C`` chunks, then ``S - C`` decodes): tensors and host ints only (nano-vllm's ``Context``).

    Fields (on the model's device; every int64 tensor is a view of one buffer, built on the host and
    copied to the device in one transfer):
        input_ids [T] int64: the packed tokens (empty when ``build`` got no ``token_ids``).
        positions [T] int64: each token's position in its own sequence (``position_ids``).
        slot_mapping [T] int64: pool slot of each new token, ``block * block_size + offset``.
        keep [K] int64: packed index of the last token of each sequence whose logits are kept.
        query_start [S + 1] / context_lens [S] / block_tables [S, W] int64: packed offsets of each
            sequence's new tokens, its tokens after this step, its block table (zero-padded); the chunk
            attention reads the first ``C``.
        num_chunks: ``C``; decode_start: packed index of the first decode token (``T`` when none).
        max_query_len: the longest chunk (sizes the chunk kernel's grid).
        decode_block_tables [S - C, W'] int32 / decode_context_lens [S - C] int32: the decodes' copies.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    keep: torch.Tensor
    query_start: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    num_chunks: int
    decode_start: int
    max_query_len: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor

    @classmethod
    def from_buffer(cls, buf: torch.Tensor, layout: StepLayout) -> AttentionMetadata:
        """Views of ``buf`` (the device copy of ``prepare_inputs``'s tensor); only the decodes' int32
        tables are copies. ``decode_start`` is read from the host (no device sync)."""
        ids, positions, slots, keep, lens, query_start, tables = buf.split(layout.sizes)
        tables = tables.view(len(lens), layout.width)
        c = layout.num_chunks
        decode_start = layout.sizes[1] - (len(lens) - c)  # every decode computes one token
        return cls(
            ids,
            positions,
            slots,
            keep,
            query_start,
            lens,
            tables,
            c,
            decode_start,
            layout.max_query_len,
            tables[c:, : layout.decode_width].to(torch.int32),
            lens[c:].to(torch.int32),
        )

    @classmethod
    def build(
        cls,
        block_tables: list[list[int]],
        context_lens: list[int],
        query_lens: list[int],
        block_size: int,
        device: torch.device | str = "cpu",
        keep: list[int] | None = None,
        slot_mapping: Callable | None = None,
        token_ids: list[int] | None = None,
        prepare: Callable = prepare_inputs,
    ) -> AttentionMetadata:
        """Tensors for one step from per-sequence lists (``S`` entries each; multi-token sequences first).

        ``context_lens[s]`` counts the sequence's tokens after this step; its last ``query_lens[s]`` are
        computed now, at positions ``context_lens[s] - query_lens[s] ..``. ``keep``: sequences whose
        logits are kept (default all). ``slot_mapping``: the part that computes the slots (default
        ``paged.core.block_table.slot_mapping``); ``token_ids``: the packed input ids (they travel in the
        same transfer); ``prepare``: the part that packs them (``prepare_inputs``). Errors as
        ``prepare_inputs``.
        """
        host, layout = prepare(
            block_tables, context_lens, query_lens, block_size, keep, slot_mapping, token_ids
        )
        if torch.device(device).type == "cuda":  # pinned host memory: one asynchronous copy
            host = host.pin_memory().to(device, non_blocking=True)
        return cls.from_buffer(host, layout)


@dataclass(frozen=True)
class AttentionBackend:
    """The engine's attention parts resolved once for its pool (``paged.engine.parts.Parts.attention``):
    ``write_kv`` stores the new K/V, ``prefill`` attends every chunk of a step in one call, ``decode``
    every decode in one call; ``paged_attention_forward`` runs them for each layer."""

    kv_cache: object
    write_kv: Callable
    prefill: Callable
    decode: Callable


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
    ``AttentionMetadata``, ``kwargs["paged_backend"]`` the engine's ``AttentionBackend``.
    Returns ``([1, T, H, D], None)``.

    Raises:
        RuntimeError: called without ``paged_metadata`` / ``paged_backend`` (e.g. ``model.generate`` on
            a model switched to ``"paged"``; switch it back with ``use_attention(model)``).
    """
    meta: AttentionMetadata | None = kwargs.get("paged_metadata")
    backend: AttentionBackend | None = kwargs.get("paged_backend")
    if meta is None or backend is None:
        raise RuntimeError(
            "paged attention called without paged_metadata: this model is switched to the paged "
            "engine; call model.set_attn_implementation('sdpa') to use it with transformers"
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, H, D]
    key_cache = backend.kv_cache.key_cache[module.layer_idx]
    value_cache = backend.kv_cache.value_cache[module.layer_idx]
    # the new K/V [T, KVH, D] written to the pool first, then the chunks, then the decodes
    backend.write_kv(
        key_cache, value_cache, key[0].transpose(0, 1), value[0].transpose(0, 1), meta.slot_mapping
    )
    c, outs = meta.num_chunks, []
    if c:
        outs.append(
            backend.prefill(
                q[: meta.decode_start],
                key_cache,
                value_cache,
                meta.block_tables[:c],
                meta.query_start[: c + 1],
                meta.context_lens[:c],
                meta.max_query_len,
                scale,
            )
        )
    if meta.decode_start < q.shape[0]:
        outs.append(
            backend.decode(
                q[meta.decode_start :].contiguous(),
                key_cache,
                value_cache,
                meta.decode_block_tables,
                meta.decode_context_lens,
                scale,
            )
        )
    out = outs[0] if len(outs) == 1 else torch.cat(outs)  # one kind needs no copy
    return out.to(q.dtype).unsqueeze(0), None


def select_backend(device: torch.device | str) -> str:
    """Which decode attention to run on ``device``: ``"triton"`` or ``"torch"``.

    ``"triton"`` (``paged.kernels.paged_attention_decode``) on a CUDA device when ``triton`` imports;
    ``"torch"`` (``decode_attention`` here) everywhere else. On CPU the Triton kernels run only through
    the interpreter (``TRITON_INTERPRET=1``), far too slow for an engine. vLLM (v0 and v1) makes the same choice per
    platform in ``vllm/attention/selector.py`` (0.10.2).
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
