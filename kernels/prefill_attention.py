r"""Varlen paged prefill attention in Triton: every prompt chunk of a step in one launch, K/V through block tables.

A step packs the new tokens of ``C`` chunks into one row of ``T`` tokens: chunk ``c`` owns packed tokens
``query_start[c] .. query_start[c+1]-1``, which sit at positions ``L_c - q_c .. L_c - 1`` of its sequence,
where ``L_c`` is the sequence's length after the step (``context_lens[c]``) and ``q_c`` the chunk's length.
Their K/V are already in the pool (the engine writes every new token before attention), so a query at
position :math:`p` attends to positions :math:`t \le p` of its own sequence, all read through the block
table: the cached context (earlier chunks, prefix-cache hits) and, causally, its own chunk

.. math:: o_p = \sum_{t \le p} \frac{e^{c\,q_p\cdot k_t}}{\sum_{u \le p} e^{c\,q_p\cdot k_u}}\, v_t,
   \qquad k_t = K[\mathrm{bt}[t \,//\, B],\ t \bmod B,\ g(h)].

One program per (chunk, tile of ``BLOCK_M`` query tokens, query head): the query tile is the M dimension
of ``tl.dot``; it walks the KV positions in tiles of ``BLOCK_N``, each position gathering its own physical
block (a tile spans several blocks), with the online softmax of ``paged_attention.py`` (base 2, fp32
accumulators). The walk stops at the tile's last query position (causal), and masks per element
``t <= p``. Programs past a chunk's end store nothing; the grid's second dimension is the longest chunk,
known on the host (no sync). Query head ``h`` reads KV head ``h // (H / H_kv)`` (GQA); each query head's
program reads the group's K/V again (simple; packing the group into the M rows, as the decode kernel
does, would read them once).

Sources: vLLM v1's Triton unified attention (``vllm/v1/attention/ops/triton_unified_attention.py``, 0.15.1: one
kernel for chunked prefill over block tables, per-position block lookup, ``query_start_loc``);
FlashAttention-2's varlen interface (``cu_seqlens``). Written from the math above, not copied.
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online softmax
from __future__ import annotations

import math

import torch

from ._triton import jit, require_triton, tl, triton, upcast_bf16_in_interpreter
from .launch_config import device_spec, prefill_config
from .paged_attention import attend_tile


@jit
def _prefill_kernel(
    Q,
    K,
    V,
    BT,
    QS,
    CL,
    O,
    qk_scale,
    stride_q_tok,
    stride_q_head,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    stride_o_tok,
    stride_o_head,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    PRECISION: tl.constexpr,
):
    chunk, tile, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_first = tl.load(QS + chunk).to(tl.int32)
    q_len = tl.load(QS + chunk + 1).to(tl.int32) - q_first
    context_len = tl.load(CL + chunk).to(tl.int32)
    # the tile's tokens, counted from the chunk's first
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n, offs_d = tl.arange(0, BLOCK_N), tl.arange(0, HEAD_DIM_P2)
    m_mask, d_mask = offs_m < q_len, offs_d < HEAD_DIM
    q = tl.load(
        Q + (q_first + offs_m)[:, None] * stride_q_tok + head * stride_q_head + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = context_len - q_len + offs_m  # each query token's position in its sequence
    kv_head = head // GROUP
    # causal: the tile's last query sees positions < end; a tile past the chunk's end walks nothing
    end = tl.where(
        tile * BLOCK_M < q_len,
        tl.minimum(context_len, context_len - q_len + (tile + 1) * BLOCK_M),
        0,
    )
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], tl.float32)
    for start in range(0, end, BLOCK_N):
        tokens = start + offs_n
        t_mask = tokens < end
        physical = tl.load(
            BT + chunk * stride_bt_seq + tokens // BLOCK_SIZE, mask=t_mask, other=0
        ).to(tl.int64)
        slot = tokens % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_rows = physical * stride_k_block + slot * stride_k_tok + kv_head * stride_k_head
        v_rows = physical * stride_v_block + slot * stride_v_tok + kv_head * stride_v_head
        # k, v: [BLOCK_N, HEAD_DIM_P2]
        k = tl.load(K + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        # causal; finite from the first tile on: position 0 is visible to all
        visible = t_mask[None, :] & (tokens[None, :] <= q_pos[:, None])
        m, l, acc = attend_tile(q, k, v, visible, m, l, acc, qk_scale, PRECISION)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(
        O + (q_first + offs_m)[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


@upcast_bf16_in_interpreter
def launch_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of every chunk's new tokens to their sequence's paged K/V, in one launch.

    Args:
        query: ``[T, H, D]`` (any strides with ``stride(-1) == 1``), the chunks' packed new tokens.
        key_cache, value_cache: ``[num_blocks, block_size, H_kv, D]``, the new tokens' K/V already written.
        block_tables: int32 / int64 ``[C, W]``, row ``c`` the chunk's sequence's blocks in logical order.
        query_start: int ``[C + 1]``, packed offsets (``query_start[C] == T``).
        context_lens: int ``[C]``, each sequence's tokens after this step (cached context + chunk).
        max_query_len: the longest chunk (host int: the grid's second dimension).
        scale: softmax scale, default ``1/sqrt(D)``.

    Returns ``[T, H, D]`` in ``query``'s dtype (fp32 accumulation; bf16 is upcast to fp32 in the interpreter).
    Like :func:`~paged.kernels.launch_decode`, unchecked (the engine builds the inputs; no host sync): a
    table too short for its context reads junk. Raises :class:`~paged.kernels.TritonUnavailableError`
    without Triton.
    """
    require_triton()
    num_heads, head_dim = query.shape[1:]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    cfg = prefill_config(head_dim, query.dtype, device_spec(query.device))
    grid = (block_tables.shape[0], triton.cdiv(max_query_len, cfg["BLOCK_M"]), num_heads)
    _prefill_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        query_start,
        context_lens,
        out,
        (1.0 / math.sqrt(head_dim) if scale is None else float(scale))
        * 1.4426950408889634,  # x log2(e)
        query.stride(0),
        query.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=num_heads // key_cache.shape[2],
        BLOCK_SIZE=key_cache.shape[1],
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=max(16, triton.next_power_of_2(head_dim)),  # tl.dot: every dimension >= 16
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        **cfg,
    )
    return out
