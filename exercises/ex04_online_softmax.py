# Generated from solutions/ex04_online_softmax.py by `python -m paged course sync`. Edit only the marked regions;
# grade with `python -m paged grade`.

r"""Exercise 04: the online-softmax update, first in PyTorch, then inside a Triton paged-decode kernel.

Attention of one query over a context walked block by block keeps three running values per query head:
the max ``m`` of the scores seen so far, the denominator ``l = sum exp(score - m)`` and the accumulator
``acc = sum exp(score - m) * value``. When a new block arrives with scores ``s`` (masked slots hold
``-inf``) and values ``v``:

    m_new = max(m, max(s))
    alpha = exp(m - m_new)             # rescales everything accumulated relative to the old max
    p     = exp(s - m_new)
    l     = alpha * l + sum(p)
    acc   = alpha * acc + p @ v
    m     = m_new

and after the last block the output is ``acc / l``. (Seed error E1 forgot to carry ``m`` and divided by
``output.sum()``.) Part 1 (``online_softmax_update``) runs on any machine; part 2 (the marked region of
``_decode_kernel``) needs Triton (Linux; the interpreter on CPU).

Check your answers with ``python -m paged grade ch04``.
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature (and O the output)
from __future__ import annotations

import math

import torch

from paged.kernels._triton import jit, kernel_device, require_triton, tl, triton


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor,
                          values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block into the running state; return the new ``(m, l, acc)`` (inputs not modified).

    Shapes (float32): ``m``, ``l`` ``[N]`` (one entry per query row), ``acc`` ``[N, D]``, ``scores``
    ``[N, B]`` (``-inf`` marks a masked slot), ``values`` ``[B, D]``. The empty state is
    ``m = -inf, l = 0, acc = 0``. A row whose block is entirely masked must come out unchanged (no NaN:
    ``exp(-inf - (-inf))`` is NaN, so guard the case where ``m_new`` is still ``-inf``).
    """
    raise NotImplementedError("ch04.ex1: m_new = max(m, rowmax); rescale l, acc by exp(m - m_new); guard -inf")


def attend_blockwise(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block: int,
                     scale: float | None = None) -> torch.Tensor:
    """Attention of ``query`` ``[N, D]`` over ``keys``/``values`` ``[L, D]`` in blocks of ``block`` tokens,
    with :func:`online_softmax_update` (no full row of scores is ever materialized). Returns ``[N, D]``."""
    num, dim = query.shape
    scale = 1 / math.sqrt(dim) if scale is None else scale
    m = torch.full((num,), float("-inf"))
    l = torch.zeros(num)
    acc = torch.zeros(num, values.shape[1])
    for start in range(0, keys.shape[0], block):
        scores = query.float() @ keys[start:start + block].float().T * scale
        m, l, acc = online_softmax_update(m, l, acc, scores, values[start:start + block].float())
    return acc / l[:, None]


@jit
def _decode_kernel(Q, K, V, BT, CL, O, scale,
                   stride_q_seq, stride_q_head, stride_k_block, stride_k_tok, stride_k_head,
                   stride_bt_seq, stride_o_seq, stride_o_head,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr):
    """One program per (sequence, query head); K and V share strides (same pool layout)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    offs_t = tl.arange(0, BLOCK_SIZE)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    d_mask = offs_d < HEAD_DIM
    context_len = tl.load(CL + seq)
    q = tl.load(Q + seq * stride_q_seq + head * stride_q_head + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    m = float("-inf")  # running max
    l = 0.0  # running denominator
    acc = tl.zeros([HEAD_DIM_P2], tl.float32)  # running sum of p * v
    for b in range(0, tl.cdiv(context_len, BLOCK_SIZE)):
        physical = tl.load(BT + seq * stride_bt_seq + b).to(tl.int64)
        t_mask = b * BLOCK_SIZE + offs_t < context_len
        kv_offsets = (physical * stride_k_block + offs_t[:, None] * stride_k_tok + kv_head * stride_k_head
                      + offs_d[None, :])
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_SIZE, HEAD_DIM_P2]
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[None, :] * k, axis=1) * scale  # [BLOCK_SIZE] scores of this block
        s = tl.where(t_mask, s, float("-inf"))
        # your online-softmax update of m, l and acc goes here (tl.maximum, tl.max, tl.exp, tl.sum)
    out = acc / l
    tl.store(O + seq * stride_o_seq + head * stride_o_head + offs_d, out.to(O.dtype.element_ty), mask=d_mask)


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention through block tables with :func:`_decode_kernel` (contract of
    ``paged.kernels.paged_attention_decode``, single pass, contexts >= 1). Writes into ``out`` when given."""
    require_triton()
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if num_heads % num_kv_heads or int(context_lens.min()) < 1:
        raise ValueError(f"need num_heads % num_kv_heads == 0 ({num_heads} % {num_kv_heads}) and contexts >= 1")
    kernel_device(query, key_cache, value_cache, block_tables, context_lens)
    if key_cache.stride() != value_cache.stride():
        raise ValueError("key_cache and value_cache must have the same strides")
    query, block_tables = query.contiguous(), block_tables.contiguous()
    out = torch.empty_like(query) if out is None else out
    scale = 1 / math.sqrt(head_dim) if scale is None else float(scale)
    _decode_kernel[(num_seqs, num_heads)](
        query, key_cache, value_cache, block_tables, context_lens, out, scale, query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0), out.stride(0),
        out.stride(1), GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        HEAD_DIM_P2=triton.next_power_of_2(head_dim))
    return out
