r"""Paged-attention decode in Triton, tuned for bandwidth: one query token per sequence, K/V through a block table.

Math. For query head :math:`h` of sequence :math:`s` with context length :math:`L` and scale :math:`c`
(default :math:`1/\sqrt{d}`), with :math:`B` the block size, ``bt`` the sequence's block table and
:math:`g(h) = h // (H/H_{kv})` the KV head that query head :math:`h` reads (GQA),

.. math:: o_h = \sum_{t<L} \frac{e^{c\,q_h\cdot k_t}}{\sum_{u<L} e^{c\,q_h\cdot k_u}}\, v_t,
   \qquad k_t = K[\mathrm{bt}[t \,//\, B],\ t \bmod B,\ g(h)].

Decode reads every cached K and V byte once and does about 4 flops per byte per query head of the group:
far below what a GPU can compute per byte it loads, so the kernel's speed is the speed at which it
streams K and V from memory. Four ideas get it there (chapter 04's performance lab, one step each):

1. **The GQA group in ``tl.dot``'s M dimension.** One program per (sequence, KV head[, split]) serves the
   ``G = H / H_kv`` query heads that share the KV head: their queries are the rows of a ``[BLOCK_M, D]``
   tile (``BLOCK_M = max(16, next_pow2(G))``, padded rows masked), so scores ``S = Q K^T`` and the update
   ``P V`` are two tensor-core matrix products, and each K/V byte is read once per KV head.
2. **KV tiles of ``BLOCK_N`` tokens, independent of the block size.** Tile ``j`` covers token positions
   ``t = j*BLOCK_N + n``; each position gathers its own physical block ``bt[t // B]`` and slot ``t % B``,
   so a tile spans several blocks (``BLOCK_N > B``) or part of one (``BLOCK_N < B``).
3. **Software pipelining** (``num_stages`` on the GPU): the loads of the next tiles are issued while the
   current one is computed.
4. **Split-K with a chosen split count.** ``num_splits=None`` applies :func:`choose_num_splits` (the rule of
   FlashAttention 2's ``num_splits_heuristic``): each sequence's tiles are cut into that many contiguous
   ranges, one program each, which write a partial output and its log-sum-exp; ``split_merge.py`` combines
   them (:math:`w_i = e^{\mathrm{lse}_i - \max\mathrm{lse}}`, :math:`o = \sum w_i o_i / \sum w_i`).
   A split with no token has :math:`\mathrm{lse} = -\infty`, weight 0: it merges as a no-op.

The launch config (tile, warps, stages, split count) comes from ``launch_config.py``, per GPU; the input
contract from ``decode_inputs.py``.

Online softmax per tile, in base 2 (:math:`e^x = 2^{x \log_2 e}`, the scale folded in): with scores
:math:`s` of the tile, :math:`m' = \max(m, \max s)`, :math:`\alpha = 2^{m-m'}`, :math:`p = 2^{s-m'}`,
:math:`\ell' = \alpha\ell + \sum p`, :math:`a' = \alpha a + p V`; at the end :math:`o = a/\ell`.

Precision. ``tl.dot`` takes fp16/bf16 operands with fp32 accumulation (the scores
never overflow fp16); ``p`` is cast to the value dtype for the second product, as FlashAttention does. fp32 inputs use
``input_precision="ieee"`` (no TF32). In Triton's interpreter (CPU) bf16 ``tl.dot`` multiplies raw bit
patterns (Triton issue 11584), so there :func:`launch_decode` upcasts bf16 inputs to fp32 first (and the
output back); bf16 is tested on a GPU only. Every masked load names its fill (``other=``): what sits past a
context (NaN, inf, stale data) never reaches the output. Every ``tl.dot`` dimension is >= 16 in the launches
below (the GPU needs it; the interpreter would accept less).

Sources: vLLM v1 ``vllm/v1/attention/ops/triton_unified_attention.py``, 0.15.1 (tiles independent of the page size,
each key position looking up its block; the group in the M rows); SGLang's grouped decode
(``decode_attention.py``: head group in ``tl.dot``, split stages, log-sum-exp merge); Dao et al.,
"Flash-Decoding for long-context inference" (2023); FlashAttention 2's split heuristic
(``csrc/flash_attn/flash_api.cpp``). Written from the math above, not copied.
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature (and O the output)
from __future__ import annotations

import math

import torch

from ._triton import jit, require_triton, tl, triton, upcast_bf16_in_interpreter
from .decode_inputs import validate_decode_inputs
from .launch_config import choose_num_splits, decode_config, decode_slots, device_spec
from .split_merge import launch_merge_splits


@jit
def attend_tile(q, k, v, mask, m, l, acc, qk_scale, PRECISION: tl.constexpr):
    """One online-softmax step over a KV tile (module docstring), shared by the decode and prefill
    kernels: scores ``q k^T`` in base 2 (``-inf`` where ``mask`` is False), then the running maximum
    ``m``, denominator ``l`` and accumulator ``acc`` [rows, HEAD_DIM_P2] updated; returns the three."""
    # s: [rows, BLOCK_N], fp32, base 2
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])  # masked positions: exp2(-inf) = 0
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc


@jit
def _decode_kernel(
    Q,
    K,
    V,
    BT,
    CL,
    O,
    LSE,
    qk_scale,
    num_splits,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    PRECISION: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # rows: the query heads of this KV head's group (padded to >= 16)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)  # token positions inside one KV tile
    offs_d = tl.arange(0, HEAD_DIM_P2)
    m_mask, d_mask = offs_m < GROUP, offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_m
    q = tl.load(
        Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    context_len = tl.load(CL + seq).to(tl.int32)
    num_tiles = tl.cdiv(context_len, BLOCK_N)
    per_split = tl.cdiv(num_tiles, num_splits)  # this sequence's tiles, cut into num_splits ranges
    first, last = split * per_split, tl.minimum((split + 1) * per_split, num_tiles)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], tl.float32)
    for tile in range(first, last):
        tokens = tile * BLOCK_N + offs_n
        t_mask = tokens < context_len
        # each position gathers its own physical block: a tile may span several blocks
        physical = tl.load(
            BT + seq * stride_bt_seq + tokens // BLOCK_SIZE, mask=t_mask, other=0
        ).to(tl.int64)
        slot = tokens % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_rows = physical * stride_k_block + slot * stride_k_tok + kv_head * stride_k_head
        v_rows = physical * stride_v_block + slot * stride_v_tok + kv_head * stride_v_head
        # k, v: [BLOCK_N, HEAD_DIM_P2]
        k = tl.load(K + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        # finite from the first tile on: the tile's first position is real
        m, l, acc = attend_tile(q, k, v, t_mask[None, :], m, l, acc, qk_scale, PRECISION)

    has_tokens = l > 0  # False for an empty split (or context_len 0)
    safe_l = tl.where(has_tokens, l, 1.0)
    tl.store(
        O
        + seq * stride_o_seq
        + heads[:, None] * stride_o_head
        + split * stride_o_split
        + offs_d[None, :],
        (acc / safe_l[:, None]).to(O.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )
    if WRITE_LSE:  # natural-log log-sum-exp: (m + log2 l) * ln 2
        lse = tl.where(has_tokens, (m + tl.log2(safe_l)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + seq * stride_lse_seq + heads * stride_lse_head + split, lse, mask=m_mask)


@upcast_bf16_in_interpreter
def launch_decode(
    query,
    key_cache,
    value_cache,
    block_tables,
    context_lens,
    scale=None,
    num_splits=None,
    config: dict | None = None,
) -> torch.Tensor:
    """:func:`paged_attention_decode` without input validation: no checks and no host sync.

    For callers that built the inputs themselves (the engine's step loop, the benchmark's timed region).
    Wrong inputs here give wrong results or an illegal memory access, never an error message. ``config``
    overrides :func:`decode_config` (keys ``BLOCK_N`` (>= 16 on a GPU), ``num_warps``, ``num_stages``).
    """
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    query = query.contiguous()
    block_tables, context_lens = block_tables.contiguous(), context_lens.contiguous()
    # x log2(e): the kernel's exponentials are base 2
    qk_scale = (1.0 / math.sqrt(head_dim) if scale is None else float(scale)) * 1.4426950408889634
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    spec = device_spec(query.device)
    cfg = {**decode_config(head_dim, query.dtype, spec), **(config or {})}
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs * num_kv_heads,
            triton.cdiv(block_tables.shape[1] * block_size, cfg["BLOCK_N"]),
            decode_slots(spec),
        )
    split = num_splits > 1  # then partial outputs and their log-sum-exp, merged by a second kernel
    if split:
        part = torch.empty(
            num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
        )
        lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
        dest_strides = (*part.stride()[:3], lse.stride(0), lse.stride(1))
    else:
        part, lse, dest_strides = out, out, (out.stride(0), out.stride(1), 0, 0, 0)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        part,
        lse,
        qk_scale,
        num_splits,
        query.stride(0),
        query.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        block_tables.stride(0),
        *dest_strides,
        GROUP=group,
        BLOCK_M=max(16, triton.next_power_of_2(group)),  # tl.dot: every dimension >= 16
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=max(16, triton.next_power_of_2(head_dim)),  # (the interpreter accepts less)
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        WRITE_LSE=split,
        **cfg,
    )
    return launch_merge_splits(part, lse, out) if split else out


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int | None = 1,
) -> torch.Tensor:
    """Decode attention over a paged KV cache (Triton; the interpreter on CPU).

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` float16 / bfloat16 / float32, one new token per sequence.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype as
            ``query``; ``block_size`` a power of two (8, 16, 32 typical), ``head_dim`` 1..256.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``; row ``s`` lists the physical blocks of
            sequence ``s`` in logical order; entries past the context are never read.
        context_lens: int32 ``[num_seqs]``, tokens to attend per sequence (0 gives a zero output).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        num_splits: 1 = single pass; an int > 1 = split-K (flash-decoding) over that many tile ranges of
            each sequence + a merge kernel; ``None`` = :func:`choose_num_splits` from the SM count, the
            programs (``num_seqs x num_kv_heads``) and the table's capacity (width x block size; no sync).

    Returns ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype, accumulated in float32. Query head
    ``h`` reads KV head ``h // (num_heads // num_kv_heads)``. bf16 is upcast to fp32 in the interpreter.

    Raises :class:`~paged.kernels.TritonUnavailableError` without Triton; ValueError (with the numbers)
    for bad shapes, dtypes, devices, GQA ratios, a context longer than its table row or a used table
    entry outside the pool.
    """
    require_triton()
    validate_decode_inputs(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    return launch_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
