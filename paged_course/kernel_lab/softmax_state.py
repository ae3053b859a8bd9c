"""The online-softmax state in PyTorch: folding one block in, and merging the states of split-K (chapter 04).

These are the reference answers that chapter 04 falls back on until the learner's own pass their checks
(``exercises/ex04_online_softmax.py``); the teaching kernel (``decode_teaching.py``) does the same math
inside Triton, and ``paged.kernels`` merges its splits with ``paged.kernels.split_merge``.

State of a softmax-weighted sum over the scores seen so far, per query row: the running max ``m``, the
denominator ``l`` relative to it and the unnormalized sum ``acc`` of values relative to it (Milakov &
Gimelshein 2018, "Online normalizer calculation for softmax"; Dao et al. 2022, FlashAttention). A split of
split-K ends with its normalized output and log-sum-exp ``m + log l`` (Dao et al. 2023, "Flash-Decoding
for long-context inference"; vLLM ``vllm/attention/ops/merge_attn_states.py`` in 0.10.2,
``vllm/v1/attention/ops/`` by 0.34.0).
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature
from __future__ import annotations

import torch


def online_softmax_update(
    m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block into the state; returns the new ``(m, l, acc)``.

    ``m``, ``l`` ``[N]``, ``acc`` ``[N, D]``, ``scores`` ``[N, B]`` (``-inf`` = masked slot), ``values``
    ``[B, D]``, float32. The empty state is ``(-inf, 0, 0)``; a block whose scores are all ``-inf`` leaves a
    row unchanged.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1))
    shift = torch.where(
        torch.isfinite(m_new), m_new, torch.zeros_like(m_new)
    )  # nothing seen yet: any finite
    alpha = torch.exp(m - shift)
    p = torch.exp(scores - shift[:, None])
    return m_new, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ values


def merge_splits(partial: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge split-K partial results: ``partial`` ``[..., P, D]`` (each split's normalized output) and ``lse``
    ``[..., P]`` (its log-sum-exp, ``-inf`` for a split with no token, whose partial may hold anything) give
    ``(out [..., D], lse [..., ])``; all splits empty give ``(0, -inf)``."""
    top = lse.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w = torch.exp(lse - top)
    total = w.sum(dim=-1)
    summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(dim=-2)
    return summed / torch.where(total > 0, total, 1.0)[..., None], torch.log(total) + top[..., 0]
