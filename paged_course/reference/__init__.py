"""Reference attentions for one decode step over a paged KV cache, in plain PyTorch.

Every function here computes the same thing: for each sequence, one query token attends to the
``context_len`` keys and values stored for that sequence, with grouped-query attention (GQA) when
there are fewer KV heads than query heads. They differ only in *how* the keys and values are found:

- ``contiguous_attention``: K/V already laid out per sequence, ``[num_seqs, max_len, kv_heads, D]``
  (padded). The pre-paging picture.
- ``paged_attention_gather``: K/V scattered over the block pool; the block table gathers them back
  into a padded contiguous view, then the contiguous math runs. Vectorized, no per-sequence loop.
- ``paged_attention_blockwise``: walks the block table one KV block at a time with an *online softmax*
  (running max ``m``, running denominator ``l``, running weighted sum ``acc``), the math of the Triton
  kernel in ``paged.kernels`` and of vLLM's CUDA ``paged_attention_v1`` kernel
  (``csrc/attention/attention_kernels.cu``). Milakov & Gimelshein, "Online normalizer calculation for
  softmax", 2018; Dao et al., "FlashAttention", NeurIPS 2022.

Shared contract (the decode signature of ``paged.kernels.paged_attention_decode``):

    query        [num_seqs, num_heads, head_dim]                   float32 / float16 / bfloat16
                 (these PyTorch references also accept float64, still computed in float32)
    key_cache    [num_blocks, block_size, num_kv_heads, head_dim]  same dtype and device as query
    value_cache  same shape, dtype and device as key_cache         (vLLM v1 / FlashAttention "NHD")
    block_tables [num_seqs, max_blocks_per_seq]  int32 (int64 accepted), physical block ids
    context_lens [num_seqs]                      int32 (int64 accepted), tokens per sequence, >= 0
    scale        softmax scale, default ``head_dim ** -0.5``
    returns      [num_seqs, num_heads, head_dim] in the query dtype, computed in float32.

Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (GQA; vLLM's
``num_queries_per_kv``). Token position ``p`` of sequence ``s`` lives in block
``block_tables[s, p // block_size]`` at offset ``p % block_size``. Entries of ``block_tables`` past
``ceil(context_len / block_size)`` are never read, and whatever the pool holds past ``context_len``
(stale K/V, NaN, inf) never reaches the output: positions are masked to ``-inf`` before the softmax and
their values are replaced by zeros with ``torch.where`` (``NaN * 0`` is NaN, so a plain multiply by the
mask would leak). A sequence with ``context_len == 0`` gets a zero output (nothing to attend to).

Errors: ``ValueError`` naming the offending sizes for wrong ranks, mismatched shapes, dtypes or devices,
``num_heads % num_kv_heads != 0``, a context longer than ``max_blocks_per_seq * block_size``, a negative
context length, or a block id outside ``[0, num_blocks)`` among the blocks a context uses.

Sub-package ``reference`` owns what the chapters compare against: these attentions, KV-memory arithmetic
(``memory``), the tiny models (``models``), greedy agreement (``compare``) and the seed-claims ledger
(``ledger``, which reads ``sim`` and bench results, never runs a ``bench`` module). It never imports ``bench``,
``viz``, ``grading``, ``publish`` or ``tools``.
"""

from __future__ import annotations

import torch

from paged.worker.attention import select_backend
from paged.worker.kv_cache import KVCache, block_bytes

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_gqa(num_heads: int, num_kv_heads: int) -> int:
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"GQA needs num_heads % num_kv_heads == 0, got num_heads={num_heads}, "
            f"num_kv_heads={num_kv_heads}"
        )
    return num_heads // num_kv_heads


def _check_context_lens(
    context_lens: torch.Tensor,
    num_seqs: int,
    device: torch.device,
    capacity: int,
    capacity_what: str,
) -> None:
    if context_lens.dim() != 1 or context_lens.shape[0] != num_seqs:
        raise ValueError(
            f"context_lens must have shape [num_seqs]=[{num_seqs}], got {list(context_lens.shape)}"
        )
    if context_lens.dtype not in _INDEX_DTYPES:
        raise ValueError(f"context_lens must be int32 or int64, got {context_lens.dtype}")
    if context_lens.device != device:
        raise ValueError(f"context_lens is on {context_lens.device}, query on {device}")
    if num_seqs == 0:
        return
    lo, hi = int(context_lens.min()), int(context_lens.max())
    if lo < 0:
        raise ValueError(
            f"context_lens must be >= 0, got {lo} at sequence {int(context_lens.argmin())}"
        )
    if hi > capacity:
        raise ValueError(
            f"context_len {hi} (sequence {int(context_lens.argmax())}) exceeds {capacity_what} "
            f"= {capacity} tokens"
        )


def _check_paged(query, key_cache, value_cache, block_tables, context_lens) -> int:
    """Validate the shared paged signature; return the GQA group size."""
    if query.dim() != 3:
        raise ValueError(
            f"query must be [num_seqs, num_heads, head_dim], got shape {list(query.shape)}"
        )
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {list(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {list(value_cache.shape)} != key_cache shape {list(key_cache.shape)}"
        )
    if query.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"query must be a floating dtype, got {query.dtype}")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise ValueError(
            f"dtype mismatch: query {query.dtype}, key_cache {key_cache.dtype}, "
            f"value_cache {value_cache.dtype}"
        )
    for name, t in (
        ("key_cache", key_cache),
        ("value_cache", value_cache),
        ("block_tables", block_tables),
    ):
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, query on {query.device}")
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, kv_dim = key_cache.shape
    if kv_dim != head_dim:
        raise ValueError(f"head_dim mismatch: query {head_dim}, key_cache {kv_dim}")
    group = _check_gqa(num_heads, num_kv_heads)
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks_per_seq], "
            f"got shape {list(block_tables.shape)}"
        )
    if block_tables.dtype not in _INDEX_DTYPES:
        raise ValueError(f"block_tables must be int32 or int64, got {block_tables.dtype}")
    width = block_tables.shape[1]
    _check_context_lens(
        context_lens,
        num_seqs,
        query.device,
        width * block_size,
        f"block_tables width x block_size = {width} x {block_size}",
    )
    used = _used_blocks(block_tables, context_lens, block_size)
    if used.any():
        ids = block_tables[used]
        if int(ids.min()) < 0 or int(ids.max()) >= num_blocks:
            bad = ids[(ids < 0) | (ids >= num_blocks)][0]
            raise ValueError(
                f"block id {int(bad)} in a used block_tables entry is outside [0, {num_blocks})"
            )
    return group


def _used_blocks(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Bool ``[num_seqs, width]``: True where the entry holds one of the ``ceil(len / bs)`` used blocks."""
    blocks_needed = (context_lens.long() + block_size - 1) // block_size
    return torch.arange(block_tables.shape[1], device=block_tables.device) < blocks_needed[:, None]


def _masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of one query per sequence over padded K/V, in float32.

    query ``[S, H, D]``, key/value ``[S, L, KVH, D]``, valid bool ``[S, L]``; returns fp32 ``[S, H, D]``.
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[2]
    group = num_heads // num_kv_heads
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)  # head h = kv_head * group + g
    keep = valid[:, :, None, None]
    k = torch.where(keep, key.float(), 0.0)  # garbage past the context never enters the math
    v = torch.where(keep, value.float(), 0.0)
    scores = torch.einsum("skgd,slkd->skgl", q, k) * scale  # [S, KVH, G, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(
        torch.isfinite(m), m, 0.0
    )  # an empty context: every score -inf, keep exp() at 0
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    out = torch.einsum("skgl,slkd->skgd", p, v) / torch.where(denom > 0, denom, 1.0)
    return out.reshape(num_seqs, num_heads, head_dim)


def write_kv_checked(
    cache, layer: int, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``key[i]`` and ``value[i]`` of layer ``layer`` of ``cache`` (a ``KVCache``) at slot ``slot_mapping[i]``,
    checked: the teaching version of the engine's unchecked ``paged.worker.attention.write_kv``.

    Slot ``s`` is block ``s // block_size``, offset ``s % block_size``; ``-1`` means skip that token
    (vLLM pads with -1; e.g. a token whose KV is already cached). One vectorized ``index_copy_`` on
    the flat ``[num_slots, kv_heads, head_dim]`` view of each cache, like ``reshape_and_cache``.

    Args:
        layer: ``0 <= layer < num_layers``.
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, the pool's dtype and device.
        slot_mapping: int64 (int32 accepted) ``[num_tokens]`` on the pool's device; each entry in
            ``[-1, num_slots)``, no slot twice.

    Raises:
        ValueError: a bad layer, shape, dtype, device, slot out of range or repeated slot. The pool
            is unchanged after an error (everything is checked before the first write).
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < cache.num_layers:
        raise ValueError(f"layer must be in [0, {cache.num_layers}), got {layer!r}")
    want = (cache.num_kv_heads, cache.head_dim)
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or tuple(t.shape[1:]) != want:
            raise ValueError(
                f"{name} must be [num_tokens, {want[0]}, {want[1]}], got {list(t.shape)}"
            )
        if t.dtype != cache.dtype:
            raise ValueError(f"{name} dtype {t.dtype} != pool dtype {cache.dtype}")
        if t.device != cache.device:
            raise ValueError(f"{name} is on {t.device}, the pool on {cache.device}")
    num_tokens = key.shape[0]
    if value.shape[0] != num_tokens:
        raise ValueError(f"key has {num_tokens} tokens, value {value.shape[0]}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != num_tokens:
        raise ValueError(
            f"slot_mapping must be [num_tokens={num_tokens}], got {list(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in _INDEX_DTYPES:
        raise ValueError(f"slot_mapping must be int64 or int32, got {slot_mapping.dtype}")
    if slot_mapping.device != cache.device:
        raise ValueError(f"slot_mapping is on {slot_mapping.device}, the pool on {cache.device}")
    if num_tokens == 0:
        return
    lo, hi = int(slot_mapping.min()), int(slot_mapping.max())
    num_slots = cache.num_blocks * cache.block_size
    if lo < -1 or hi >= num_slots:
        bad = lo if lo < -1 else hi
        raise ValueError(
            f"slot {bad} outside [-1, {num_slots}) (num_blocks {cache.num_blocks} x "
            f"block_size {cache.block_size})"
        )
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    if slots.unique().numel() != slots.numel():
        raise ValueError(f"slot_mapping writes a slot twice: {slots.tolist()}")
    flat_k = cache.key_cache[layer].view(num_slots, *want)  # row = slot
    flat_v = cache.value_cache[layer].view(num_slots, *want)
    flat_k.index_copy_(0, slots, key[keep])
    flat_v.index_copy_(0, slots, value[keep])


def kv_cache_from_budget(
    budget_bytes: int,
    num_layers: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cpu_budget_bytes: int = 0,
):
    """A ``KVCache`` with as many whole blocks as fit in ``budget_bytes`` (and ``cpu_budget_bytes`` for swap):
    ``budget // block_bytes(...)``, as vLLM sizes its pool.

    Raises:
        ValueError: a negative budget, or one that holds no whole block (the message gives one block's bytes).
    """
    per_block = block_bytes(num_layers, num_kv_heads, head_dim, block_size, dtype)
    if budget_bytes < 0 or cpu_budget_bytes < 0:
        raise ValueError(f"budgets must be >= 0 bytes, got {budget_bytes} and {cpu_budget_bytes}")
    if budget_bytes < per_block:
        raise ValueError(f"budget_bytes={budget_bytes} holds no block of {per_block} bytes")
    return KVCache(
        num_layers,
        budget_bytes // per_block,
        block_size,
        num_kv_heads,
        head_dim,
        dtype,
        device,
        cpu_budget_bytes // per_block,
    )


def pad_block_tables(
    tables: list[list[int]], max_blocks: int | None = None, pad: int = 0
) -> torch.Tensor:
    """Stack block tables into an int32 tensor ``[num_seqs, max_blocks]`` for the attention kernels.

    Rows shorter than ``max_blocks`` are padded with ``pad`` (default 0, as vLLM v0's
    ``make_tensor_with_pad``): block 0 is a real block, so a stray read of a padded entry stays inside
    the pool; kernels never use it because they stop at each sequence's ``context_len``. Pass ``pad=-1``
    to make padding visible (any use of it then fails loudly in a gather).

    Raises:
        ValueError: a table longer than ``max_blocks``.
    """
    longest = max((len(t) for t in tables), default=0)
    max_blocks = longest if max_blocks is None else max_blocks
    if longest > max_blocks:
        raise ValueError(f"a block table has {longest} blocks, more than max_blocks={max_blocks}")
    rows = [list(t) + [pad] * (max_blocks - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(tables), max_blocks)


def contiguous_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention over per-sequence contiguous (padded) K/V: the layout before paging.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``.
        key, value: ``[num_seqs, max_len, num_kv_heads, head_dim]``; row ``s`` holds the first
            ``context_lens[s]`` tokens of sequence ``s``; the padding after them may hold anything.
        context_lens: int ``[num_seqs]``, ``0 <= context_lens[s] <= max_len``.
        scale: softmax scale, default ``head_dim ** -0.5``.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query dtype (computed in float32).

    Raises:
        ValueError: wrong ranks or shapes, mismatched dtypes or devices, ``num_heads % num_kv_heads``
            not 0, or a context length outside ``[0, max_len]`` (numbers in the message).
    """
    if query.dim() != 3 or key.dim() != 4:
        raise ValueError(
            f"query must be [S, H, D] and key [S, L, KVH, D], got {list(query.shape)} and "
            f"{list(key.shape)}"
        )
    if value.shape != key.shape:
        raise ValueError(f"value shape {list(value.shape)} != key shape {list(key.shape)}")
    if query.dtype not in _FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(
            f"dtype mismatch: query {query.dtype}, key {key.dtype}, value {value.dtype}"
        )
    if key.device != query.device or value.device != query.device:
        raise ValueError(
            f"device mismatch: query {query.device}, key {key.device}, value {value.device}"
        )
    num_seqs, num_heads, head_dim = query.shape
    if key.shape[0] != num_seqs or key.shape[3] != head_dim:
        raise ValueError(
            f"key must be [num_seqs={num_seqs}, max_len, num_kv_heads, head_dim={head_dim}], "
            f"got {list(key.shape)}"
        )
    _check_gqa(num_heads, key.shape[2])
    max_len = key.shape[1]
    _check_context_lens(context_lens, num_seqs, query.device, max_len, "key max_len")
    scale = head_dim**-0.5 if scale is None else float(scale)
    valid = torch.arange(max_len, device=query.device) < context_lens[:, None]
    return _masked_attention(query, key, value, valid, scale).to(query.dtype)


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather each sequence's K/V through its block table into padded ``[S, L, KVH, D]`` tensors.

    ``L = ceil(max(context_lens) / block_size) * block_size``. Unused block-table entries are replaced
    by block 0 before indexing (they may hold -1 or stale ids) and masked afterwards. Returns
    ``(key, value, valid)`` with ``valid`` bool ``[S, L]``. One advanced-indexing op per tensor: this
    is the copy that a fused kernel avoids. Inputs are not validated here (``paged_attention_gather`` does).
    """
    block_size = key_cache.shape[1]
    num_seqs = block_tables.shape[0]
    max_len = int(context_lens.max()) if num_seqs else 0
    width = -(-max_len // block_size)  # ceil: only the columns some sequence uses
    used = _used_blocks(block_tables[:, :width], context_lens, block_size)
    table = torch.where(used, block_tables[:, :width], 0).long()
    # [S, width, bs, KVH, D] -> [S, width * bs, KVH, D]: position p sits at (p // bs, p % bs).
    key = key_cache[table].flatten(1, 2)
    value = value_cache[table].flatten(1, 2)
    valid = torch.arange(width * block_size, device=key_cache.device) < context_lens[:, None]
    return key, value, valid


def paged_attention_gather(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention over the paged pool: gather K/V through the block tables, then attend.

    The shapes, dtypes and errors are the module's shared contract (see the module docstring).
    Vectorized over sequences: one gather, one masked softmax. This is the engine's CPU path and the
    reference the Triton kernel is tested against.
    """
    _check_paged(query, key_cache, value_cache, block_tables, context_lens)
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    if query.shape[0] == 0:
        return torch.empty_like(query)
    key, value, valid = gather_kv(key_cache, value_cache, block_tables, context_lens)
    return _masked_attention(query, key, value, valid, scale).to(query.dtype)


def paged_attention_blockwise(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention with an online softmax over KV blocks: the Triton kernel's math in PyTorch.

    For each block column ``j`` of the block tables (all sequences at once), with scores ``x`` of the
    block's valid tokens:

        m_new = max(m, max(x));  alpha = exp(m - m_new);  p = exp(x - m_new)
        l = l * alpha + sum(p);  acc = acc * alpha + p @ V_block;  m = m_new
        out = acc / l  (after the last block)

    so no full row of scores is ever stored (Milakov & Gimelshein 2018, "Online normalizer calculation
    for softmax"; Dao et al. 2022, FlashAttention). Corrects seed error E1: ``m`` is carried between
    blocks, both ``l`` and ``acc`` are rescaled by ``exp(m_old - m_new)``, and the division is by ``l``.
    Same contract and errors as ``paged_attention_gather``.
    """
    _check_paged(query, key_cache, value_cache, block_tables, context_lens)
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else float(scale)
    if num_seqs == 0:
        return torch.empty_like(query)
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
    m = torch.full((num_seqs, num_kv_heads, group), float("-inf"), device=query.device)
    l = torch.zeros((num_seqs, num_kv_heads, group), device=query.device)  # noqa: E741 (the paper's l)
    acc = torch.zeros((num_seqs, num_kv_heads, group, head_dim), device=query.device)
    lens = context_lens.long()
    num_block_cols = -(-int(lens.max()) // block_size)
    offsets = torch.arange(block_size, device=query.device)
    for j in range(num_block_cols):  # the kernel's loop over KV blocks; sequences stay vectorized
        valid = j * block_size + offsets < lens[:, None]  # [S, bs]
        ids = torch.where(
            valid[:, 0], block_tables[:, j], 0
        ).long()  # a finished sequence reads block 0
        keep = valid[:, :, None, None]
        k = torch.where(keep, key_cache[ids].float(), 0.0)  # [S, bs, KVH, D]
        v = torch.where(keep, value_cache[ids].float(), 0.0)
        x = torch.einsum("skgd,sbkd->skgb", q, k) * scale
        x = x.masked_fill(~valid[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, x.amax(dim=-1))
        m_safe = torch.where(
            torch.isfinite(m_new), m_new, 0.0
        )  # nothing valid yet: keep exp() finite
        alpha = torch.exp(m - m_safe)  # exp(-inf) = 0 on the first valid block
        p = torch.exp(x - m_safe[..., None])
        l = l * alpha + p.sum(dim=-1)  # noqa: E741
        acc = acc * alpha[..., None] + torch.einsum("skgb,sbkd->skgd", p, v)
        m = m_new
    out = acc / torch.where(l > 0, l, 1.0)[..., None]
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Decode attention through the backend ``select_backend(query.device)`` picks (or ``backend``).

    Raises:
        ValueError: an unknown backend name, or anything the chosen backend rejects.
    """
    backend = backend or select_backend(query.device)
    if backend == "torch":
        return paged_attention_gather(
            query, key_cache, value_cache, block_tables, context_lens, scale
        )
    if backend == "triton":
        from paged.kernels import paged_attention_decode as triton_decode

        return triton_decode(query, key_cache, value_cache, block_tables, context_lens, scale)
    raise ValueError(f"backend must be 'torch' or 'triton', got {backend!r}")


__all__ = [
    "kv_cache_from_budget",
    "pad_block_tables",
    "write_kv_checked",
    "contiguous_attention",
    "gather_kv",
    "paged_attention",
    "paged_attention_blockwise",
    "paged_attention_gather",
    "select_backend",
]
