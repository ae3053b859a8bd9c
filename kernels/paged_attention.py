r"""Paged-attention decode in Triton: one query token per sequence, keys and values read through a block table.

Math. For query head :math:`h` of sequence :math:`s` with context length :math:`L` and scale :math:`c`
(default :math:`1/\sqrt{d}`),

.. math:: o_h = \sum_{t<L} \frac{e^{c\,q_h\cdot k_t - m}}{\sum_{u<L} e^{c\,q_h\cdot k_u - m}}\, v_t,
   \qquad k_t = K[\mathrm{bt}[t \,//\, B],\ t \bmod B,\ g(h)],

where :math:`B` is the block size, ``bt`` the sequence's block table and :math:`g(h) = h // (H/H_{kv})`
the KV head that query head :math:`h` reads (GQA). The kernel walks the blocks in order with the online
softmax: a running max :math:`m`, a running denominator :math:`\ell` and a running weighted sum
:math:`a` of values. For each block with scores :math:`s_j`,

.. math:: m' = \max(m, \max_j s_j),\quad \alpha = e^{m-m'},\quad p_j = e^{s_j - m'},\quad
   \ell' = \alpha\,\ell + \textstyle\sum_j p_j,\quad a' = \alpha\,a + \sum_j p_j v_j,

and at the end :math:`o = a/\ell`. Nothing of size :math:`L` is ever stored.

Split-K (flash-decoding, ``num_splits > 1``): the blocks of a sequence are cut into ``num_splits``
contiguous ranges, each handled by its own program, which writes its partial output
:math:`o_i = a_i/\ell_i` and its log-sum-exp :math:`\mathrm{lse}_i = m_i + \log \ell_i`. A second kernel
merges them: with :math:`M = \max_i \mathrm{lse}_i` and :math:`w_i = e^{\mathrm{lse}_i - M}`,
:math:`o = \sum_i w_i o_i / \sum_i w_i`. A split holding no token has :math:`\ell_i = 0`,
:math:`\mathrm{lse}_i = -\infty`, hence :math:`w_i = 0`: it merges as a no-op. More programs keep the
GPU busy when batch x KV heads is small and contexts are long.

Program layout. One program per (sequence, KV head[, split]) serves every query head of that KV head's
group: the group's queries are a ``[GROUP_P2, HEAD_DIM_P2]`` tile (group and head dim padded to powers
of two and masked), so each K/V block is read from memory once per group, not once per query head.
Scores use broadcast-multiply-and-sum rather than ``tl.dot`` (``tl.dot`` needs tiles of at least
16 x 16 and is unreliable in the interpreter); every load is upcast to float32 at once, and every
masked load names its fill (``other=``) so that whatever sits in unused slots (NaN, inf, stale data)
never reaches the output.

Sources: vLLM ``csrc/attention/attention_kernels.cu`` (``paged_attention_v1`` / ``paged_attention_v2``:
the same per-block walk, v2 being the split version with a reduce kernel); Dao et al., "Flash-Decoding
for long-context inference" (2023); vLLM v1 ``vllm/attention/ops/triton_decode_attention.py`` (grouped
decode with split-K stages). Written from the math above, not copied.
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature (and O the output)
from __future__ import annotations

import math

import torch

from ._triton import jit, kernel_device, require_triton, tl, triton

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256


@jit
def _paged_decode_kernel(
    Q, K, V, BT, CL, O, LSE, scale, blocks_per_split,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq, stride_o_seq, stride_o_head, stride_o_split, stride_lse_seq, stride_lse_head,
    GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_P2)  # query heads of this KV head's group (padded)
    offs_t = tl.arange(0, BLOCK_SIZE)  # token slots inside one block
    offs_d = tl.arange(0, HEAD_DIM_P2)  # head-dim lanes (padded)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g

    context_len = tl.load(CL + seq).to(tl.int32)
    q = tl.load(Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    q = q * scale  # fold the softmax scale into q once

    m = tl.full([GROUP_P2], float("-inf"), tl.float32)  # running max of scores
    l = tl.zeros([GROUP_P2], tl.float32)  # running denominator, relative to m
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)  # running sum of p * v, relative to m

    num_blocks = tl.cdiv(context_len, BLOCK_SIZE)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    for b in range(first, last):  # logical block b of this sequence
        physical = tl.load(BT + seq * stride_bt_seq + b).to(tl.int64)  # int64: big pools overflow int32
        tokens = b * BLOCK_SIZE + offs_t
        t_mask = tokens < context_len  # only the last block is partly masked
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(K + physical * stride_k_block + offs_t[:, None] * stride_k_tok + kv_head * stride_k_head
                    + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_SIZE, HEAD_DIM_P2]
        v = tl.load(V + physical * stride_v_block + offs_t[:, None] * stride_v_tok + kv_head * stride_v_head
                    + offs_d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_P2, BLOCK_SIZE] scores
        s = tl.where(t_mask[None, :], s, float("-inf"))
        # online softmax: rescale what we have by exp(m - m_new), add this block
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: token 0 of every visited block is real
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])  # masked slots: exp(-inf) = 0
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new

    has_tokens = l > 0  # False for an empty split (or context_len 0)
    out = acc / tl.where(has_tokens, l, 1.0)[:, None]
    o_mask = g_mask[:, None] & d_mask[None, :]
    tl.store(O + seq * stride_o_seq + heads[:, None] * stride_o_head + split * stride_o_split + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=o_mask)
    if WRITE_LSE:
        lse = tl.where(has_tokens, m + tl.log(tl.where(has_tokens, l, 1.0)), float("-inf"))
        tl.store(LSE + seq * stride_lse_seq + heads * stride_lse_head + split, lse, mask=g_mask)


@jit
def _merge_splits_kernel(
    O_PART, LSE, O, num_splits,
    stride_p_seq, stride_p_head, stride_p_split, stride_lse_seq, stride_lse_head, stride_o_seq, stride_o_head,
    SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    s_mask = offs_s < num_splits
    lse = tl.load(LSE + seq * stride_lse_seq + head * stride_lse_head + offs_s, mask=s_mask, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # all splits empty: avoid -inf - -inf
    w = tl.exp(lse - lse_max)  # empty split: exp(-inf) = 0, a no-op in both sums
    part = tl.load(O_PART + seq * stride_p_seq + head * stride_p_head + offs_s[:, None] * stride_p_split
                   + offs_d[None, :], mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    w_sum = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(w_sum > 0, w_sum, 1.0)
    tl.store(O + seq * stride_o_seq + head * stride_o_head + offs_d, out.to(O.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


def validate_decode_inputs(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits) -> None:
    """Raise ValueError (with the numbers) unless the inputs satisfy the contract of
    :func:`paged_attention_decode`. Reads ``context_lens`` and ``block_tables`` (one device sync; callers
    that build the inputs themselves and need none can use :func:`launch_decode`)."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_dim], got shape {tuple(query.shape)}")
    if key_cache.dim() != 4:
        raise ValueError("key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got shape {tuple(key_cache.shape)}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} != key_cache shape {tuple(key_cache.shape)}")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not query.dtype == key_cache.dtype == value_cache.dtype:
        raise ValueError(f"dtypes differ: query {query.dtype}, key_cache {key_cache.dtype}, "
                         f"value_cache {value_cache.dtype}")
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, kv_head_dim = key_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"head_dim differs: query {head_dim}, key/value cache {kv_head_dim}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if block_size < 2 or block_size & (block_size - 1) or block_size > 256:
        raise ValueError(f"block_size must be a power of two in [2, 256], got {block_size}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"GQA needs num_heads % num_kv_heads == 0, got {num_heads} % {num_kv_heads}")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache must be contiguous in head_dim (stride 1)")
    if block_tables.dim() != 2 or block_tables.dtype not in INDEX_DTYPES:
        raise ValueError("block_tables must be a 2-D int32 (or int64) tensor [num_seqs, max_blocks_per_seq], "
                         f"got {block_tables.dtype} of shape {tuple(block_tables.shape)}")
    if context_lens.dim() != 1 or context_lens.dtype not in INDEX_DTYPES:
        raise ValueError(f"context_lens must be a 1-D int32 (or int64) tensor [num_seqs], got {context_lens.dtype} "
                         f"of shape {tuple(context_lens.shape)}")
    if block_tables.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise ValueError(f"num_seqs differs: query {num_seqs}, block_tables {block_tables.shape[0]}, "
                         f"context_lens {context_lens.shape[0]}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1, got {num_splits!r}")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    kernel_device(query, key_cache, value_cache, block_tables, context_lens)
    if num_seqs == 0:
        return
    width = block_tables.shape[1]
    lens = context_lens.long()
    used = torch.arange(width, device=lens.device)[None, :] < (lens[:, None] + block_size - 1) // block_size
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    lo, hi, num_bad = torch.stack([lens.min(), lens.max(), bad.sum()]).tolist()  # one device sync
    if lo < 0:
        raise ValueError(f"context_lens must be >= 0, got minimum {lo}")
    if hi > width * block_size:
        raise ValueError(f"context_len {hi} exceeds the block table's capacity: {width} blocks x "
                         f"{block_size} tokens = {width * block_size}")
    if num_bad:
        seq, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_tables[{seq}, {col}] = {int(block_tables[seq, col])} is outside the pool of "
                         f"{num_blocks} blocks (it holds tokens of a context of {int(lens[seq])})")


def _num_warps(tile_elements: int) -> int:
    """Fixed launch config (no autotuning): more warps for bigger [group, block, head_dim] tiles."""
    return 4 if tile_elements <= 8192 else 8


def launch_decode(query, key_cache, value_cache, block_tables, context_lens, scale=None, num_splits=1) -> torch.Tensor:
    """:func:`paged_attention_decode` without input validation: no checks and no host sync.

    For callers that built the inputs themselves (the benchmark's timed region, an engine's step loop).
    Wrong inputs here give wrong results or an illegal memory access, never an error message.
    """
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    query = query.contiguous()
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    group_p2, d_p2 = triton.next_power_of_2(group), triton.next_power_of_2(head_dim)
    blocks_per_split = triton.cdiv(block_tables.shape[1], num_splits)
    common = dict(GROUP=group, GROUP_P2=group_p2, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_P2=d_p2,
                  num_warps=_num_warps(group_p2 * block_size * d_p2))
    k_strides = (key_cache.stride(0), key_cache.stride(1), key_cache.stride(2))
    v_strides = (value_cache.stride(0), value_cache.stride(1), value_cache.stride(2))
    if num_splits == 1:
        _paged_decode_kernel[(num_seqs, num_kv_heads, 1)](
            query, key_cache, value_cache, block_tables, context_lens, out, out, scale, blocks_per_split,
            query.stride(0), query.stride(1), *k_strides, *v_strides, block_tables.stride(0),
            out.stride(0), out.stride(1), 0, 0, 0, WRITE_LSE=False, **common)
        return out
    part = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, context_lens, part, lse, scale, blocks_per_split,
        query.stride(0), query.stride(1), *k_strides, *v_strides, block_tables.stride(0),
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1), WRITE_LSE=True, **common)
    _merge_splits_kernel[(num_seqs, num_heads)](
        part, lse, out, num_splits, part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1), SPLITS_P2=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
        HEAD_DIM_P2=d_p2)
    return out


def paged_attention_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float | None = None,
                           num_splits: int = 1) -> torch.Tensor:
    """Decode attention over a paged KV cache (Triton; the interpreter on CPU).

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` float16 / bfloat16 / float32, one new token per sequence.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype as
            ``query``; ``block_size`` a power of two (8, 16, 32 typical), ``head_dim`` 1..256.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``; row ``s`` lists the physical blocks of
            sequence ``s`` in logical order; entries past the context are never read.
        context_lens: int32 ``[num_seqs]``, tokens to attend per sequence (0 gives a zero output).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        num_splits: 1 = single pass; > 1 = split-K (flash-decoding) over block ranges + a merge kernel.

    Returns ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype, accumulated in float32. Query head
    ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.

    Raises :class:`~paged.kernels.TritonUnavailableError` without Triton; ValueError (with the numbers)
    for bad shapes, dtypes, devices, GQA ratios, a context longer than its table row or a used table
    entry outside the pool.
    """
    require_triton()
    validate_decode_inputs(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits)
    return launch_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits)
