r"""The teaching paged-attention decode kernel (chapter 04, first half): one block per loop step, no ``tl.dot``.

This is the kernel written to be read. It is correct and slow: on an H200 it reached 11.5% of the HBM
bandwidth at batch 64, context 4,096 (``docs/gpu/h200-2026-11-30/kernel.json``). The engine runs the tuned
kernel :func:`paged.kernels.paged_attention_decode`; chapter 04's second half goes from this one to that one.

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
Scores use broadcast-multiply-and-sum rather than ``tl.dot`` (the tuned kernel puts the group in
``tl.dot``'s rows instead, padded to 16); every load is upcast to float32 at once, and every
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

from paged.kernels._triton import jit, require_triton, tl, triton
from paged.kernels.decode_inputs import validate_decode_inputs
from paged.kernels.split_merge import launch_merge_splits


@jit
def _paged_decode_kernel(
    Q,
    K,
    V,
    BT,
    CL,
    O,
    LSE,
    scale,
    blocks_per_split,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    stride_o_split,
    stride_lse_seq,
    stride_lse_head,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    WRITE_LSE: tl.constexpr,
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
    q = tl.load(
        Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    q = q * scale  # fold the softmax scale into q once

    m = tl.full([GROUP_P2], float("-inf"), tl.float32)  # running max of scores
    l = tl.zeros([GROUP_P2], tl.float32)  # running denominator, relative to m
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)  # running sum of p * v, relative to m

    num_blocks = tl.cdiv(context_len, BLOCK_SIZE)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    for b in range(first, last):  # logical block b of this sequence
        physical = tl.load(BT + seq * stride_bt_seq + b).to(
            tl.int64
        )  # int64: big pools overflow int32
        tokens = b * BLOCK_SIZE + offs_t
        t_mask = tokens < context_len  # only the last block is partly masked
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(
            K
            + physical * stride_k_block
            + offs_t[:, None] * stride_k_tok
            + kv_head * stride_k_head
            + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)  # [BLOCK_SIZE, HEAD_DIM_P2]
        v = tl.load(
            V
            + physical * stride_v_block
            + offs_t[:, None] * stride_v_tok
            + kv_head * stride_v_head
            + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
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
    tl.store(
        O
        + seq * stride_o_seq
        + heads[:, None] * stride_o_head
        + split * stride_o_split
        + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=o_mask,
    )
    if WRITE_LSE:
        lse = tl.where(has_tokens, m + tl.log(tl.where(has_tokens, l, 1.0)), float("-inf"))
        tl.store(LSE + seq * stride_lse_seq + heads * stride_lse_head + split, lse, mask=g_mask)


def _num_warps(tile_elements: int) -> int:
    """Fixed launch config (no autotuning): more warps for bigger [group, block, head_dim] tiles."""
    return 4 if tile_elements <= 8192 else 8


def launch_teaching_decode(
    query, key_cache, value_cache, block_tables, context_lens, scale=None, num_splits=1
) -> torch.Tensor:
    """:func:`teaching_decode` without input validation (no checks, no host sync), for timed loops.

    ``num_splits=None`` means 1 here (this kernel has no split heuristic).
    """
    num_splits = num_splits or 1
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    query, block_tables, context_lens = (
        query.contiguous(),
        block_tables.contiguous(),
        context_lens.contiguous(),
    )
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    group_p2, d_p2 = triton.next_power_of_2(group), triton.next_power_of_2(head_dim)
    blocks_per_split = triton.cdiv(block_tables.shape[1], num_splits)
    common = dict(
        GROUP=group,
        GROUP_P2=group_p2,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=d_p2,
        num_warps=_num_warps(group_p2 * block_size * d_p2),
    )
    k_strides = (key_cache.stride(0), key_cache.stride(1), key_cache.stride(2))
    v_strides = (value_cache.stride(0), value_cache.stride(1), value_cache.stride(2))
    if num_splits == 1:
        _paged_decode_kernel[(num_seqs, num_kv_heads, 1)](
            query,
            key_cache,
            value_cache,
            block_tables,
            context_lens,
            out,
            out,
            scale,
            blocks_per_split,
            query.stride(0),
            query.stride(1),
            *k_strides,
            *v_strides,
            block_tables.stride(0),
            out.stride(0),
            out.stride(1),
            0,
            0,
            0,
            WRITE_LSE=False,
            **common,
        )
        return out
    part = torch.empty(
        num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
    )
    lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        part,
        lse,
        scale,
        blocks_per_split,
        query.stride(0),
        query.stride(1),
        *k_strides,
        *v_strides,
        block_tables.stride(0),
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        WRITE_LSE=True,
        **common,
    )
    return launch_merge_splits(
        part, lse, out
    )  # the engine's merge kernel, shared with the tuned kernel


def teaching_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int = 1,
) -> torch.Tensor:
    """Decode attention over a paged KV cache with the teaching kernel (Triton; the interpreter on CPU).

    Same arguments, result and errors as :func:`paged.kernels.paged_attention_decode` (whose
    ``validate_decode_inputs`` it calls): ``query`` ``[num_seqs, num_heads, head_dim]`` fp16 / bf16 / fp32,
    pools ``[num_blocks, block_size, num_kv_heads, head_dim]``, int32 ``block_tables``
    ``[num_seqs, max_blocks_per_seq]`` and ``context_lens`` ``[num_seqs]``; returns
    ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype, accumulated in fp32. ``num_splits > 1`` cuts
    the table width into that many ranges of blocks (split-K). Raises ValueError (with the numbers) for
    bad inputs and :class:`~paged.kernels.TritonUnavailableError` without Triton.
    """
    require_triton()
    validate_decode_inputs(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    return launch_teaching_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
