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

Backends: ``"torch"`` (CPU, or any device): one vectorized gather + ``scaled_dot_product_attention``
for all decode tokens and one for all prefill tokens, with a padded boolean mask, no per-sequence
loop. ``"triton"`` (CUDA): decode tokens go to the chapter 04 kernel
``paged.kernels.paged_attention_decode``; prefill keeps the gather + SDPA path. The idea is vLLM's
attention backend split (``vllm/attention/backends/``): a metadata object built once per step, read by
every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_NAME = "paged"
_registered = False


@dataclass
class _Group:
    """Padded views of one group of sequences (all prefills, or all decodes), built once per step.

    token_index [N] int64: packed positions of the group's real query tokens.
    q_index     [G, Qmax] int64: packed token of each padded query (padding repeats the last one).
    q_valid     [G, Qmax] bool: which padded queries are real.
    kv_slots    [G, Cmax] int64: pool slot of each context position (padding repeats the last one).
    mask        [G, 1, Qmax, Cmax] bool: key position <= query position (causal within the context).
    """

    seq_index: torch.Tensor
    token_index: torch.Tensor
    q_index: torch.Tensor
    q_valid: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor


def _build_group(seqs: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, context_lens: torch.Tensor,
                 block_tables: torch.Tensor, block_size: int) -> _Group:
    device = starts.device
    q_max, c_max = int(query_lens.max()), int(context_lens.max())
    j = torch.arange(q_max, device=device)
    last_q = (query_lens - 1)[:, None]
    q_index = starts[:, None] + torch.minimum(j[None, :], last_q)
    q_valid = j[None, :] < query_lens[:, None]
    q_pos = (context_lens - query_lens)[:, None] + torch.minimum(j[None, :], last_q)  # position in the sequence
    k_pos = torch.minimum(torch.arange(c_max, device=device)[None, :], (context_lens - 1)[:, None])
    tables = block_tables[seqs].long()
    # the slot formula: block_table[p // block_size] * block_size + p % block_size
    kv_slots = tables.gather(1, k_pos // block_size) * block_size + k_pos % block_size
    mask = (torch.arange(c_max, device=device)[None, None, :] <= q_pos[:, :, None]).unsqueeze(1)
    return _Group(seqs, q_index[q_valid], q_index, q_valid, kv_slots, mask)


@dataclass
class AttentionMetadata:
    """What every layer needs for one engine step over a packed batch of ``T`` tokens from ``S`` sequences.

    Sequences ``0 .. num_prefills-1`` are prefills (several new tokens, possibly after a cached prefix),
    the rest decodes (one new token). Tokens are packed in sequence order.

    Fields (on the model's device):
        kv_cache: the ``paged.kv_cache.KVCache`` pool; layer ``l`` uses ``key_cache[l]``/``value_cache[l]``
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
    prefill: _Group | None = None
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
        width = max(len(t) for t in block_tables)
        for s, (table, ctx, q) in enumerate(zip(block_tables, context_lens, query_lens)):
            if not 0 < q <= ctx or len(table) * block_size < ctx:
                raise ValueError(f"sequence {s}: query {q} tokens, context {ctx} tokens, block table of "
                                 f"{len(table)} blocks x {block_size} slots")
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32, device=device)
        ctx_t = torch.tensor(context_lens, dtype=torch.int64, device=device)
        q_t = torch.tensor(query_lens, dtype=torch.int64, device=device)
        starts = torch.cumsum(q_t, 0) - q_t
        seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_t)
        positions = torch.arange(int(q_t.sum()), device=device) - starts[seq_of_token] + (ctx_t - q_t)[seq_of_token]
        slots = (tables.long()[seq_of_token, positions // block_size] * block_size + positions % block_size)
        meta = cls(kv_cache, positions, slots, tables, ctx_t.int(),
                   torch.cat([starts, q_t.sum().view(1)]).int(), starts + q_t - 1, num_prefills, backend)
        groups = [(slice(0, num_prefills), "prefill"), (slice(num_prefills, num_seqs), "decode")]
        for part, name in groups:
            seqs = torch.arange(num_seqs, device=device)[part]
            if len(seqs):
                setattr(meta, name, _build_group(seqs, starts[part], q_t[part], ctx_t[part], tables, block_size))
        return meta


def _attend_group(group: _Group, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Padded gather + SDPA for one group; returns ``[N, H, D]`` for ``group.token_index``."""
    qg = q[group.q_index].transpose(1, 2)  # [G, H, Qmax, D]
    kg = k_flat[group.kv_slots].transpose(1, 2)  # [G, KVH, Cmax, D]
    vg = v_flat[group.kv_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=group.mask, scale=scale,
                                         enable_gqa=qg.shape[1] != kg.shape[1])
    return out.transpose(1, 2)[group.q_valid]  # [N, H, D]


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
    cache = meta.kv_cache
    cache.write(layer, k_new, v_new, meta.slot_mapping)
    key_cache, value_cache = cache.key_cache[layer], cache.value_cache[layer]
    k_flat = key_cache.view(-1, *key_cache.shape[2:])  # [num_blocks * block_size, KVH, D]
    v_flat = value_cache.view(-1, *value_cache.shape[2:])
    out = torch.empty_like(q)
    if meta.prefill is not None:
        out[meta.prefill.token_index] = _attend_group(meta.prefill, q, k_flat, v_flat, scale).to(q.dtype)
    if meta.decode is not None:
        group = meta.decode
        if meta.backend == "triton":
            from paged.kernels import paged_attention_decode

            seqs = group.seq_index
            out[group.token_index] = paged_attention_decode(
                q[group.token_index].contiguous(), key_cache, value_cache, meta.block_tables[seqs].contiguous(),
                meta.context_lens[seqs].contiguous(), scale=scale)
        else:
            out[group.token_index] = _attend_group(group, q, k_flat, v_flat, scale).to(q.dtype)
    return out.unsqueeze(0), None


def _no_mask(*args, **kwargs):
    """Mask function for ``"paged"``: no dense mask; the attention function masks per sequence."""
    return None


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


def default_backend(device: torch.device | str) -> str:
    """``"triton"`` on CUDA when ``paged.kernels`` provides the decode kernel, else ``"torch"``."""
    if torch.device(device).type != "cuda":
        return "torch"
    try:
        from paged.kernels import paged_attention_decode  # noqa: F401
    except ImportError:
        return "torch"
    return "triton"


def forward_logits(model, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """One packed forward: ``input_ids [T]`` -> logits ``[S, vocab]`` float32 of each sequence's last token."""
    out = model(input_ids=input_ids.unsqueeze(0), position_ids=meta.positions.unsqueeze(0), use_cache=False,
                logits_to_keep=meta.last_token_index, paged_metadata=meta)
    return out.logits[0].float()
