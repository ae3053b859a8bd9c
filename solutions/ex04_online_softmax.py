r"""Exercise 04: the online softmax, a Triton paged-decode kernel, and the split-K merge (chapter 04, part 1).

Attention of one query over a context read block by block keeps, per query head, three running values:
the max ``m`` of the scores seen so far, the denominator ``l`` of the softmax relative to ``m``, and the
unnormalized weighted sum ``acc`` of the values relative to ``m`` (chapter 04, section 2, derives how a
new block changes them). Three build steps, in this file:

1. ``online_softmax_update`` (region ch04.ex1, PyTorch, any machine): fold one block into the state.
2. ``walk_blocks`` (ch04.ex2, Triton; the interpreter on CPU), the loop of ``_decode_kernel``, chapter 04's
   teaching kernel: one program per (sequence, KV head, split) serving the whole GQA group. Everything around
   the loop is written: the query tile (the scale folded in), the empty state, and the end, which writes
   ``acc / l`` and, for split-K, the log-sum-exp ``m + log l``. You write the walk over this program's
   blocks. The teaching kernel that the course's tools run (``paged_course.kernel_lab.teaching_decode``) and
   the starter of ``ex04_fast_decode.py`` call this same function, so they run your walk.
3. ``merge_splits`` (ch04.ex4, PyTorch): combine the partial outputs of split-K through their
   log-sum-exps; a split that held no token must change nothing.

(``ch04.ex3``, in ``ex04_fast_decode.py``, is the "make it faster" exercise of the second half.)
Check one step in the chapter with ``check("ch04.ex1")``, or all of them with ``python -m paged grade ch04``.
Sources: Milakov & Gimelshein 2018 (online normalizer); Dao et al. 2022 (FlashAttention) and 2023
(Flash-Decoding); vLLM ``csrc/attention/attention_kernels.cu`` (``paged_attention_v1`` / ``_v2``).
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature (and O the output)
from __future__ import annotations

import math

import torch

from paged.kernels import validate_decode_inputs
from paged.kernels._triton import jit, require_triton, tl, triton


def online_softmax_update(
    m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block into the running state; return the new ``(m, l, acc)`` (inputs not modified).

    Shapes (float32): ``m``, ``l`` ``[N]`` (one entry per query row), ``acc`` ``[N, D]``, ``scores``
    ``[N, B]`` (``-inf`` marks a masked slot), ``values`` ``[B, D]``. The empty state is
    ``m = -inf, l = 0, acc = 0``. Scores may be large (hundreds): no ``exp`` of an unshifted score. A row
    whose block is entirely masked must come out unchanged, without NaN, even from the empty state
    (``-inf - (-inf)`` is NaN).
    """
    # BEGIN SOLUTION ch04.ex1 -- the state (m, l, acc) after one more block, as new tensors
    # HINT: l and acc are relative to the old max. When the max grows, by what factor must they shrink? And what is
    # HINT+ that factor for a row that has seen no token yet?
    # HINT: The new max is the larger of the old one and the block's row max. Shift by it where it is finite and by
    # HINT+ zero where the row has seen nothing; the old sum and accumulator shrink by the exponential of old max
    # HINT+ minus shift, then gain this block's exponentiated scores (summed for the sum, times the values for the
    # HINT+ accumulator).
    m_new = torch.maximum(m, scores.amax(dim=-1))
    m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # all masked so far
    alpha = torch.exp(m - m_safe)  # exp(-inf) = 0 for the first real block
    p = torch.exp(scores - m_safe[:, None])  # masked slots: exp(-inf) = 0
    l_new = l * alpha + p.sum(dim=-1)
    acc_new = acc * alpha[:, None] + p @ values
    return m_new, l_new, acc_new
    # END SOLUTION


def attend_blockwise(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    block: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of ``query`` ``[N, D]`` over ``keys``/``values`` ``[L, D]`` in blocks of ``block`` tokens,
    with :func:`online_softmax_update` (no full row of scores is ever materialized). Returns ``[N, D]``."""
    num, dim = query.shape
    scale = 1 / math.sqrt(dim) if scale is None else scale
    m = torch.full((num,), float("-inf"))
    l = torch.zeros(num)
    acc = torch.zeros(num, values.shape[1])
    for start in range(0, keys.shape[0], block):
        scores = query.float() @ keys[start : start + block].float().T * scale
        m, l, acc = online_softmax_update(m, l, acc, scores, values[start : start + block].float())
    return acc / l[:, None]


@jit
def walk_blocks(
    q,
    m,
    l,
    acc,
    K,
    V,
    BT,
    seq,
    kv_head,
    split,
    context_len,
    blocks_per_split,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_bt_seq,
    offs_t,
    offs_d,
    d_mask,
    BLOCK_SIZE: tl.constexpr,
):
    """The loop of the teaching kernel: fold this program's blocks into the running state ``(m, l, acc)``.

    ``q`` ``[GROUP_P2, HEAD_DIM_P2]`` fp32 (the scale folded in), ``m``, ``l`` ``[GROUP_P2]`` and ``acc``
    ``[GROUP_P2, HEAD_DIM_P2]`` fp32 (the empty state on entry). Split ``split`` owns the logical blocks
    ``split * blocks_per_split`` .. ``(split + 1) * blocks_per_split - 1`` of sequence ``seq``, but only those
    holding some of its ``context_len`` tokens; block ``b`` sits in physical block ``BT[seq, b]`` (row stride
    ``stride_bt_seq``), token slot ``t`` of KV head ``kv_head`` at ``physical * stride_k_block + t *
    stride_k_tok + kv_head * stride_k_head`` in ``K`` and ``V`` (same strides). ``offs_t`` are a block's token
    slots, ``offs_d`` the head-dim lanes and ``d_mask`` the real ones. Returns the new ``(m, l, acc)``.
    """
    # BEGIN SOLUTION ch04.ex2 -- fold this program's blocks into (m, l, acc)
    # HINT: Which logical blocks belong to this split, and which of them hold any token? For each: where does it live,
    # HINT+ which of its slots are real, what does a masked load read?
    # HINT: Walk this split's logical blocks, stopping at the last one the context reaches. For each, read its
    # HINT+ physical id from the block table (widened to 64 bits before computing addresses), mask the slots whose
    # HINT+ position is past the context, load keys and values with zeros in the masked slots, give those slots a
    # HINT+ score of minus infinity, and fold the block in with your online update from step 1.
    # STUB: pass  # your walk over this program's blocks: lookup, masked loads (other=), scores, online update
    num_blocks = tl.cdiv(context_len, BLOCK_SIZE)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    for b in range(first, last):  # logical block b of this sequence
        physical = tl.load(BT + seq * stride_bt_seq + b).to(
            tl.int64
        )  # int64: big pools overflow int32
        t_mask = b * BLOCK_SIZE + offs_t < context_len  # only the last block is partly masked
        kv_mask = t_mask[:, None] & d_mask[None, :]
        kv_offsets = (
            physical * stride_k_block
            + offs_t[:, None] * stride_k_tok
            + kv_head * stride_k_head
            + offs_d[None, :]
        )
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0).to(
            tl.float32
        )  # [BLOCK_SIZE, HEAD_DIM_P2]
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_P2, BLOCK_SIZE]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: token 0 of every visited block is real
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    # END SOLUTION
    return m, l, acc


@jit
def _decode_kernel(
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
    """One program per (sequence, KV head, split); K and V share strides (one pool layout).

    The program serves the ``GROUP`` query heads ``kv_head * GROUP + g`` of its KV head: the query tile is
    ``[GROUP_P2, HEAD_DIM_P2]`` (both padded to powers of two, the padding masked). Split ``split`` owns the
    logical blocks ``split * blocks_per_split`` .. ``(split + 1) * blocks_per_split - 1`` of its sequence,
    but only those that hold some of its ``context_len`` tokens. Output: ``O[seq, head, split]``; with
    ``WRITE_LSE`` also ``LSE[seq, head, split]`` (``-inf`` for a split with no token).
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_P2)  # the group's query heads (padded)
    offs_t = tl.arange(0, BLOCK_SIZE)  # token slots of one block
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
    q = q * scale  # the softmax scale, folded into q once
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)  # running max, per query head of the group
    l = tl.zeros([GROUP_P2], tl.float32)  # running denominator, relative to m
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)  # running sum of p * v, relative to m
    m, l, acc = walk_blocks(
        q,
        m,
        l,
        acc,
        K,
        V,
        BT,
        seq,
        kv_head,
        split,
        context_len,
        blocks_per_split,
        stride_k_block,
        stride_k_tok,
        stride_k_head,
        stride_bt_seq,
        offs_t,
        offs_d,
        d_mask,
        BLOCK_SIZE,
    )
    has_tokens = l > 0  # False for a split with no token (or a context of 0)
    out = acc / tl.where(has_tokens, l, 1.0)[:, None]
    tl.store(
        O
        + seq * stride_o_seq
        + heads[:, None] * stride_o_head
        + split * stride_o_split
        + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=g_mask[:, None] & d_mask[None, :],
    )
    if WRITE_LSE:
        lse = tl.where(has_tokens, m + tl.log(tl.where(has_tokens, l, 1.0)), float("-inf"))
        tl.store(LSE + seq * stride_lse_seq + heads * stride_lse_head + split, lse, mask=g_mask)


def _launch(
    query,
    key_cache,
    value_cache,
    block_tables,
    context_lens,
    scale,
    num_splits,
    out,
    lse,
    num_warps=4,
):
    """Launch ``_decode_kernel`` on a grid of (sequences, KV heads, splits) without input checks; ``out`` gets
    the (partial) outputs, ``lse`` (or None for one split) the log-sum-exps; ``num_warps`` per program."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if key_cache.stride() != value_cache.stride():
        raise ValueError(
            f"key_cache and value_cache must have the same strides, got {key_cache.stride()} and "
            f"{value_cache.stride()}"
        )
    query, block_tables, context_lens = (
        query.contiguous(),
        block_tables.contiguous(),
        context_lens.contiguous(),
    )
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    split_stride = out.stride(2) if lse is not None else 0
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        out,
        out if lse is None else lse,
        scale,
        triton.cdiv(block_tables.shape[1], num_splits),
        query.stride(0),
        query.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        split_stride,
        0 if lse is None else lse.stride(0),
        0 if lse is None else lse.stride(1),
        GROUP=group,
        GROUP_P2=triton.next_power_of_2(group),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=triton.next_power_of_2(head_dim),
        WRITE_LSE=lse is not None,
        num_warps=num_warps,
    )


def decode_splits(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int = 2,
    partial: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first pass of split-K: the table width is cut into ``num_splits`` equal ranges of logical blocks
    (``ceil(W / num_splits)`` each), one program per (sequence, KV head, split).

    Returns ``(partial, lse)``: float32 ``[num_seqs, num_heads, num_splits, head_dim]`` (each split's
    normalized output, 0 for a split with no token) and ``[num_seqs, num_heads, num_splits]`` (its
    log-sum-exp, ``-inf`` for a split with no token). Writes into ``partial`` / ``lse`` when given.
    Inputs and errors as :func:`paged_decode`.
    """
    require_triton()
    validate_decode_inputs(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    num_seqs, num_heads, head_dim = query.shape
    if partial is None:
        partial = torch.empty(
            num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
        )
    if lse is None:
        lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    if num_seqs:
        _launch(
            query,
            key_cache,
            value_cache,
            block_tables,
            context_lens,
            scale,
            num_splits,
            partial,
            lse,
        )
    return partial, lse


def merge_splits(partial: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The second pass of split-K: merge each row's splits into one output.

    Args:
        partial: float32 ``[..., P, D]``: split ``i``'s normalized output ``o_i``.
        lse: float32 ``[..., P]``: split ``i``'s log-sum-exp of its scores, ``log sum_t exp(x_t)``;
            ``-inf`` for a split that held no token, whose ``partial`` may then hold anything (NaN included).

    Returns:
        ``(out, lse_total)``: float32 ``[..., D]``, the output of one softmax over all the splits' tokens, and
        ``[...]``, the log-sum-exp of all of them. A row whose splits are all empty gives ``out = 0`` and
        ``lse_total = -inf`` (never NaN). Log-sum-exps may be in the hundreds: never ``exp`` one unshifted.
        An empty split may stand at any position; the inputs are not modified.
    """
    # BEGIN SOLUTION ch04.ex4 -- one output and one lse from the splits' (partial, lse)
    # STUB: # Spot the bug: this merge runs and looks right, and it passes some of its checks, but one
    # STUB: # case of the docstring goes wrong (chapter 04 shows the symptom). Fix it; the region counts
    # STUB: # only when every one of its checks passes.
    # STUB: top = lse.amax(dim=-1, keepdim=True)
    # STUB: top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    # STUB: w = torch.exp(lse - top)
    # STUB: total = w.sum(dim=-1)
    # STUB: summed = (w[..., None] * partial).sum(dim=-2)
    # STUB: return summed / torch.where(total > 0, total, 1.0)[..., None], torch.log(total) + top[..., 0]
    # HINT: Run the chapter's symptom cell: which split is empty, what does its partial hold, and what is its
    # HINT+ weight times that?
    # HINT: 0 * NaN is NaN: keep an empty split's partial out of the sum (torch.where(w > 0, partial, 0)) instead
    # HINT+ of trusting its weight of 0.
    top = lse.amax(dim=-1, keepdim=True)
    top = torch.where(
        torch.isfinite(top), top, torch.zeros_like(top)
    )  # every split empty: any finite shift
    w = torch.exp(lse - top)  # [..., P]; an empty split: exp(-inf) = 0
    total = w.sum(dim=-1)
    summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(
        dim=-2
    )  # 0 * NaN would be NaN
    out = summed / torch.where(total > 0, total, 1.0)[..., None]
    return out, torch.log(total) + top[..., 0]
    # END SOLUTION


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention over the paged pool with :func:`_decode_kernel` (and :func:`merge_splits` for
    ``num_splits > 1``): the contract of ``paged.kernels.paged_attention_decode`` and of
    ``paged_course.kernel_lab.teaching_decode``.

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` float16, bfloat16 or float32.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype and strides.
        block_tables: int32 ``[num_seqs, W]``; entries past a context are never read.
        context_lens: int32 ``[num_seqs]``, ``0 <= context_len <= W * block_size``.
        scale: softmax scale, default ``head_dim ** -0.5``.
        num_splits: ``1`` (or ``None``), or split-K over that many ranges of the table's width.
        out: write the result here (``[num_seqs, num_heads, head_dim]``, the query's dtype) when given.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query's dtype (fp32 accumulation); 0 for a context of 0.

    Raises:
        ValueError: the contract's bad inputs (``validate_decode_inputs``), with the numbers;
        ``TritonUnavailableError`` without Triton.
    """
    require_triton()
    num_splits = num_splits or 1  # None: one pass (this kernel has no split heuristic)
    validate_decode_inputs(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    out = torch.empty_like(query) if out is None else out
    if query.shape[0] == 0:
        return out
    if num_splits == 1:
        _launch(query, key_cache, value_cache, block_tables, context_lens, scale, 1, out, None)
        return out
    partial, lse = decode_splits(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    merged, _ = merge_splits(partial, lse)
    out.copy_(merged)
    return out
