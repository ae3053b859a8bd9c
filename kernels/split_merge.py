r"""Split-K's second kernel: merge the partial outputs of a sequence's splits by their log-sum-exp.

Split ``i`` of query head ``h`` wrote a partial output :math:`o_i` (normalised over its own tokens) and
:math:`\mathrm{lse}_i = \log \sum_{t \in i} e^{s_t}`. The exact result is
:math:`o = \sum_i w_i o_i / \sum_i w_i` with :math:`w_i = e^{\mathrm{lse}_i - \max_j \mathrm{lse}_j}`
(subtracting the maximum keeps every exponent <= 0). A split with no token has
:math:`\mathrm{lse} = -\infty`, weight 0: it merges as a no-op, and all splits empty give 0, not NaN.
One program per (sequence, query head). Used by the tuned decode kernel and by chapter 04's teaching
kernel (``paged_course.kernel_lab``). Source: Dao et al., "Flash-Decoding for long-context inference"
(2023); vLLM v1's ``merge_attn_states`` (``vllm/v1/attention/ops/merge_attn_states.py``,
0.15.1). Written from the math above.
"""

# ruff: noqa: E741 -- O is the output, as in the decode kernel
from __future__ import annotations

import torch

from ._triton import jit, tl, triton


@jit
def _merge_splits_kernel(
    O_PART,
    LSE,
    O,
    num_splits,
    stride_p_seq,
    stride_p_head,
    stride_p_split,
    stride_lse_seq,
    stride_lse_head,
    stride_o_seq,
    stride_o_head,
    SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    seq, head = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    s_mask = offs_s < num_splits
    lse = tl.load(
        LSE + seq * stride_lse_seq + head * stride_lse_head + offs_s,
        mask=s_mask,
        other=float("-inf"),
    )
    lse_max = tl.max(lse, axis=0)
    # all splits empty: avoid -inf - -inf
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp(lse - lse_max)  # empty split: exp(-inf) = 0, a no-op in both sums
    part = tl.load(
        O_PART
        + seq * stride_p_seq
        + head * stride_p_head
        + offs_s[:, None] * stride_p_split
        + offs_d[None, :],
        mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    w_sum = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(w_sum > 0, w_sum, 1.0)
    tl.store(
        O + seq * stride_o_seq + head * stride_o_head + offs_d,
        out.to(O.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def launch_merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge ``part`` ``[num_seqs, num_heads, num_splits, head_dim]`` (fp32 partial outputs) with their
    ``lse`` ``[num_seqs, num_heads, num_splits]`` (fp32, natural log) into ``out``
    ``[num_seqs, num_heads, head_dim]`` (any float dtype, ``stride(-1) == 1``); returns ``out``. Unchecked."""
    num_seqs, num_heads, num_splits, head_dim = part.shape
    _merge_splits_kernel[(num_seqs, num_heads)](
        part,
        lse,
        out,
        num_splits,
        *part.stride()[:3],
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        SPLITS_P2=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=max(16, triton.next_power_of_2(head_dim)),
    )
    return out
