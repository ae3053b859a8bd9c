"""Run any transformers decoder on the paged KV cache, through transformers' public extension points.

Nothing in transformers is patched. ``register()`` adds two functions under the name ``"paged"``:

- an attention function (``transformers.AttentionInterface``): it receives one layer's
  ``query [1, H, T, D]`` and ``key``/``value [1, KVH, T, D]`` (rotary already applied) for a *packed*
  batch of ``T`` new tokens from many sequences, writes the new K/V into the pool at their slots, then
  attends each token to its own sequence's cached context, and returns ``[1, T, H, D]``;
- a mask function (``transformers.masking_utils.AttentionMaskInterface``) that returns ``None``, so
  transformers never builds a ``T x T`` mask: our attention knows each sequence's extent.

``use_paged_attention(model)`` switches a model to it (``model.set_attn_implementation("paged")``).
The engine then calls ``model(input_ids [1, T], position_ids [1, T], use_cache=False,
logits_to_keep=<last token of each sequence>, paged_metadata=AttentionMetadata(...))``. The extra
keyword reaches the attention function unchanged (no globals): it carries the slot mapping, the block
tables, the context lengths and the ``KVCache``; the layer is ``module.layer_idx``.

Trap: ``set_attn_implementation`` writes into the model's config object, shared by every module and by
any other model built from the same object. Deep-copy a config before building a reference model from it.

Backends: ``"torch"`` (CPU, or any device): all decode tokens at once (one gather of their context
blocks, two batched matmuls, a padded additive mask; no per-sequence loop); prefills one sequence at a
time (a causal SDPA over its own new tokens, or over its gathered context after a prefix-cache hit),
which spends nothing on padding ragged prompt lengths. ``"triton"`` (CUDA): decode tokens go to the
chapter 04 kernel ``paged.kernels.paged_attention_decode``; prefills as above. The idea is vLLM's
attention backend split (``vllm/attention/backends/``): a metadata object built once per step, read by
every layer.

Where the CPU time goes (``python -m paged bench engine``, one thread): the linear layers first, then the
decode attention, about a third of a run: each layer gathers every decoding sequence's context blocks (one
``index_select`` per cache, padded to the longest context) and runs two small batched matmuls per KV head.
Everything per step is built once in ``AttentionMetadata.build`` (slots, block index, masks); a layer only
reads it, and a step of one kind (all decodes, or one prefill) returns its attention output without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_NAME = "paged"
_registered = False


@dataclass
class _Group:
    """The decode sequences of a step (one new token each), built once per step for every layer.

    Decodes are packed last: sequences ``seqs`` (a slice of the batch) own tokens ``start ..``, one each.
    block_index [G * B] int64: the first ``B = ceil(max context / block_size)`` entries of each block
                table, flattened: gathering these blocks gives every context, padded to ``B`` blocks.
    bias        [G, 1, B * block_size] float: 0 for positions < context length, -inf after.
    """

    seqs: slice
    start: int
    block_index: torch.Tensor
    bias: torch.Tensor

    @property
    def tokens(self) -> slice:
        return slice(self.start, self.start + self.seqs.stop - self.seqs.start)


def _additive_mask(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``-inf`` where ``hidden`` is True, 0 elsewhere (one fill, one masked write)."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(hidden, float("-inf"))


def _build_group(seqs: slice, start: int, max_context: int, context_lens: torch.Tensor, block_tables: torch.Tensor,
                 block_size: int, dtype: torch.dtype) -> _Group:
    """Built once per step, read by every layer: the index and mask tensors are never rebuilt per layer."""
    device = block_tables.device
    num_blocks = -(-max_context // block_size)  # pad every context to the longest one, in whole blocks
    block_index = block_tables[seqs, :num_blocks].long().reshape(-1)
    # context position p of a sequence sits at gathered row p: block p // block_size, offset p % block_size
    hidden = torch.arange(num_blocks * block_size, device=device)[None, :] >= context_lens[seqs, None]
    return _Group(seqs, start, block_index, _additive_mask(hidden, dtype)[:, None, :])


@dataclass
class _Prefill:
    """One prefill sequence: packed tokens ``start:end``. Without a cached prefix (``block_index`` None)
    it attends causally to its own new K/V; after a prefix-cache hit it gathers its context blocks
    (``block_index`` [B]) and masks with ``bias`` [1, 1, q, B * block_size]."""

    start: int
    end: int
    block_index: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def _build_prefill(start: int, query_len: int, context_len: int, table: torch.Tensor, block_size: int,
                   dtype: torch.dtype) -> _Prefill:
    if query_len == context_len:
        return _Prefill(start, start + query_len)
    num_blocks = -(-context_len // block_size)
    q_pos = torch.arange(context_len - query_len, context_len, device=table.device)
    hidden = torch.arange(num_blocks * block_size, device=table.device)[None, :] > q_pos[:, None]  # causal
    return _Prefill(start, start + query_len, table[:num_blocks].long(), _additive_mask(hidden, dtype)[None, None])


@dataclass
class AttentionMetadata:
    """What every layer needs for one engine step over a packed batch of ``T`` tokens from ``S`` sequences.

    Sequences ``0 .. num_prefills-1`` are prefills (several new tokens, possibly after a cached prefix),
    the rest decodes (one new token). Tokens are packed in sequence order.

    Fields (on the model's device):
        kv_cache: the ``paged.worker.kv_cache.KVCache`` pool; layer ``l`` uses ``key_cache[l]``/``value_cache[l]``
            ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        positions [T] int64: each token's position in its own sequence (``position_ids``).
        slot_mapping [T] int64: pool slot of each new token, ``block * block_size + offset``.
        block_tables [S, max_blocks] int32, padded with 0.
        context_lens [S] int32: tokens of each sequence after this step (cached + new).
        query_start_loc [S + 1] int32: packed offset of each sequence's first new token.
        last_token_index [S] int64: packed index of each sequence's last token (``logits_to_keep``).
        backend: ``"torch"`` or ``"triton"``.
    """

    kv_cache: object
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    last_token_index: torch.Tensor
    num_prefills: int
    backend: str
    prefills: list[_Prefill] | None = None
    decode: _Group | None = None

    @classmethod
    def build(cls, kv_cache, block_tables: list[list[int]], context_lens: list[int], query_lens: list[int],
              num_prefills: int, block_size: int, device: torch.device | str = "cpu",
              backend: str = "torch") -> AttentionMetadata:
        """Tensors for one step from per-sequence Python lists (``S`` entries each).

        ``context_lens[s]`` counts the sequence's tokens after this step; its last ``query_lens[s]``
        tokens are computed now, so their positions are ``context_lens[s] - query_lens[s] ..
        context_lens[s] - 1``.

        Raises:
            ValueError: mismatched list lengths, a query longer than its context, or a block table too
                short for its context.
        """
        num_seqs = len(block_tables)
        if not (len(context_lens) == len(query_lens) == num_seqs) or num_seqs == 0:
            raise ValueError(f"need one block table, context length and query length per sequence, got "
                             f"{num_seqs}, {len(context_lens)}, {len(query_lens)}")
        positions, slots, starts = [], [], [0]
        for s, (table, ctx, q) in enumerate(zip(block_tables, context_lens, query_lens)):
            if not 0 < q <= ctx or len(table) * block_size < ctx:
                raise ValueError(f"sequence {s}: query {q} tokens, context {ctx} tokens, block table of "
                                 f"{len(table)} blocks x {block_size} slots")
            for p in range(ctx - q, ctx):  # the new tokens and their slots in the pool
                positions.append(p)
                slots.append(table[p // block_size] * block_size + p % block_size)
            starts.append(starts[-1] + q)
        width = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32, device=device)
        ctx_t = torch.tensor(context_lens, dtype=torch.int32, device=device)
        meta = cls(kv_cache, torch.tensor(positions, device=device), torch.tensor(slots, device=device), tables,
                   ctx_t, torch.tensor(starts, dtype=torch.int32, device=device),
                   torch.tensor(starts[1:], device=device) - 1, num_prefills, backend)
        meta.prefills = [_build_prefill(starts[s], query_lens[s], context_lens[s], tables[s], block_size,
                                        kv_cache.dtype) for s in range(num_prefills)]
        if num_prefills < num_seqs:
            part = slice(num_prefills, num_seqs)
            meta.decode = _build_group(part, starts[num_prefills], max(context_lens[part]), ctx_t, tables,
                                       block_size, kv_cache.dtype)
        return meta


def _gather(cache: torch.Tensor, block_index: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """``[num_seqs, KVH, B * block_size, D]``: each sequence's context blocks, read through its block table.

    One ``index_select`` of whole blocks (contiguous ``block_size x KVH x D`` chunks), then one copy
    into the head-major layout the matmuls want. Rows past a sequence's context hold whatever those
    slots hold (zeros or stale, finite K/V); the bias masks them.
    """
    blocks = cache.index_select(0, block_index)  # [num_seqs * B, block_size, KVH, D]
    return blocks.view(num_seqs, -1, *cache.shape[2:]).transpose(1, 2).contiguous()


def _attend_decodes(group: _Group, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """All decode tokens at once: ``[G, H, D]``.

    One ``index_select`` of whole blocks per cache gives ``[G, C, KVH, D]`` (``C = B * block_size``).
    Then, per KV head (a loop of ``KVH`` iterations, not over sequences), two batched matmuls read
    that head's keys and values in place (a strided view: no copy) for the ``H / KVH`` query heads that
    share it (GQA).
    """
    num_seqs = group.seqs.stop - group.seqs.start
    kv_shape = (num_seqs, -1, *key_cache.shape[2:])
    keys = key_cache.index_select(0, group.block_index).view(kv_shape)  # [G, C, KVH, D]
    values = value_cache.index_select(0, group.block_index).view(kv_shape)
    num_heads, head_dim, num_kv_heads = q.shape[1], q.shape[2], keys.shape[2]
    q_stacked = q[group.tokens].view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = torch.empty_like(q_stacked)
    for h in range(num_kv_heads):  # scores = bias + scale * q k^T in one op: [G, g, C]
        scores = torch.baddbmm(group.bias, q_stacked[:, h], keys[:, :, h].transpose(1, 2), alpha=scale)
        out[:, h] = torch.bmm(scores.softmax(dim=-1), values[:, :, h])
    return out.view(num_seqs, num_heads, head_dim)


def _attend_prefill(p: _Prefill, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """One prefill sequence: ``[q, H, D]`` for its packed tokens ``p.start:p.end``."""
    qs = q[p.start:p.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
    if p.block_index is None:  # nothing cached: its own new K/V, causal
        ks = k_new[p.start:p.end].transpose(0, 1).unsqueeze(0)
        vs = v_new[p.start:p.end].transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                             enable_gqa=qs.shape[1] != ks.shape[1])
    else:  # cached prefix + new tokens, all read from the pool
        ks, vs = _gather(key_cache, p.block_index, 1), _gather(value_cache, p.block_index, 1)
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=p.bias, scale=scale,
                                             enable_gqa=qs.shape[1] != ks.shape[1])
    return out[0].transpose(0, 1)


def paged_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask=None, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """The function registered as ``"paged"`` in ``AttentionInterface`` (signature set by transformers).

    query [1, H, T, D], key/value [1, KVH, T, D]; ``kwargs["paged_metadata"]`` is the step's
    ``AttentionMetadata``. Returns ``([1, T, H, D], None)``.

    Raises:
        RuntimeError: called without ``paged_metadata`` (e.g. ``model.generate`` on a model switched to
            ``"paged"``; switch it back with ``model.set_attn_implementation("sdpa")``).
    """
    meta: AttentionMetadata | None = kwargs.get("paged_metadata")
    if meta is None:
        raise RuntimeError("paged attention called without paged_metadata: this model is switched to the paged "
                           "engine; call model.set_attn_implementation('sdpa') to use it with transformers")
    layer = module.layer_idx
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q = query[0].transpose(0, 1)  # [T, H, D]
    k_new, v_new = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, KVH, D]
    key_cache, value_cache = meta.kv_cache.key_cache[layer], meta.kv_cache.value_cache[layer]
    k_flat = key_cache.view(-1, *key_cache.shape[2:])  # [num_blocks * block_size, KVH, D]: one row per slot
    v_flat = value_cache.view(-1, *value_cache.shape[2:])
    # KVCache.write without its per-call checks: the slots were built from block tables in build()
    k_flat.index_copy_(0, meta.slot_mapping, k_new.to(k_flat.dtype))
    v_flat.index_copy_(0, meta.slot_mapping, v_new.to(v_flat.dtype))
    parts = [_attend_prefill(p, q, k_new, v_new, key_cache, value_cache, scale) for p in meta.prefills]
    if meta.decode is not None:
        group = meta.decode
        if meta.backend == "triton":  # inputs built by build(): the unchecked launch, no host sync
            from paged.kernels import launch_decode

            seqs = group.seqs
            parts.append(launch_decode(
                q[group.tokens].contiguous(), key_cache, value_cache, meta.block_tables[seqs].contiguous(),
                meta.context_lens[seqs].contiguous(), scale=scale))
        else:
            parts.append(_attend_decodes(group, q, key_cache, value_cache, scale))
    # parts are in packed-token order; a step of one kind (all decodes, or one prefill) needs no copy
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.to(q.dtype).unsqueeze(0), None


def _no_mask(*args, **kwargs):
    """Mask function for ``"paged"``: no dense mask; the attention function masks per sequence."""
    return None


def select_backend(device: torch.device | str) -> str:
    """Which decode attention to run on ``device``: ``"triton"`` or ``"torch"``.

    ``"triton"`` (``paged.kernels.paged_attention_decode``) on a CUDA device when ``triton`` imports;
    ``"torch"`` (vectorized PyTorch) everywhere else. On CPU the Triton
    kernels run only through the interpreter (``TRITON_INTERPRET=1``), which is far too slow for an
    engine, so the CPU backend is always ``"torch"``. vLLM makes the same choice per platform in
    ``vllm/attention/selector.py``.
    """
    if torch.device(device).type != "cuda":
        return "torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"

def register() -> None:
    """Register ``"paged"`` with transformers' attention and mask interfaces (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, _no_mask)
    _registered = True


def use_paged_attention(model) -> None:
    """Switch ``model`` (a ``PreTrainedModel``) to the paged attention; a no-op when already switched."""
    register()
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        model.set_attn_implementation(ATTN_NAME)


def use_attention(model, name: str = "sdpa") -> None:
    """Switch ``model`` back to a transformers attention (``"sdpa"``, ``"eager"``) for ``generate``."""
    if getattr(model.config, "_attn_implementation", None) != name:
        model.set_attn_implementation(name)


def forward_logits(model, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """One packed forward: ``input_ids [T]`` -> logits ``[S, vocab]`` float32 of each sequence's last token."""
    out = model(input_ids=input_ids.unsqueeze(0), position_ids=meta.positions.unsqueeze(0), use_cache=False,
                logits_to_keep=meta.last_token_index, paged_metadata=meta)
    return out.logits[0].float()
