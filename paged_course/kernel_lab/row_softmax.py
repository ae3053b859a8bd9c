r"""Row softmax in Triton, twice: the textbook three-pass version and the online (one-pass) normalizer.

Math. For a row :math:`x_1..x_N`, :math:`\mathrm{softmax}(x)_i = e^{x_i - m} / \sum_j e^{x_j - m}` with
:math:`m = \max_j x_j` (subtracting :math:`m` changes nothing mathematically and keeps every exponent
:math:`\le 0`, so nothing overflows).

* ``softmax``: one program per row loads the whole row into registers (the row must fit in one tile),
  takes the max, exponentiates, sums and divides. Memory passes over the row: 1 read, 1 write.
* ``online_softmax``: the row is read in tiles of ``BLOCK`` elements, so rows of any length work. A
  running max :math:`m` and a running denominator :math:`d` are kept; when a tile raises the max from
  :math:`m` to :math:`m'` the old sum is rescaled, :math:`d' = d\,e^{m-m'} + \sum_{tile} e^{x_j-m'}`.
  After one sweep :math:`(m, d)` are exact; a second sweep writes :math:`e^{x_i-m}/d`. Two reads instead
  of the three (max, sum, write) that a tiled textbook softmax needs. The same update, with a value
  accumulator rescaled alongside :math:`d`, is the heart of the paged-attention kernel.

Sources: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018); Triton tutorial
02 "Fused Softmax". Shapes: ``x`` is ``[rows, cols]`` float16/bfloat16/float32; the result has ``x``'s
dtype; arithmetic is float32.
"""

from __future__ import annotations

import torch

from paged.kernels._triton import jit, kernel_device, require_triton, tl, triton


@jit
def _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # -inf in the padding: it loses every max and contributes exp(-inf) = 0 to the sum
    x = tl.load(X + row * stride_x + cols, mask=mask, other=float("-inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@jit
def _online_softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = float("-inf")  # running max
    d = 0.0  # running denominator, relative to m
    for start in range(0, n_cols, BLOCK):  # sweep 1: (m, d) in one pass
        mask = start + cols < n_cols
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=float("-inf")).to(
            tl.float32
        )
        m_new = tl.maximum(m, tl.max(x, axis=0))  # finite: every tile holds >= 1 real element
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):  # sweep 2: write the normalized row
        mask = start + cols < n_cols
        x = tl.load(X + row * stride_x + start + cols, mask=mask, other=float("-inf")).to(
            tl.float32
        )
        y = tl.exp(x - m) / d
        tl.store(Y + row * stride_y + start + cols, y.to(Y.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor) -> None:
    require_triton()
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [rows, cols], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[1] == 0:
        raise ValueError("x has 0 columns: softmax of an empty row is undefined")
    kernel_device(x)


def softmax(x: torch.Tensor, max_cols: int = 8192) -> torch.Tensor:
    """Row-wise softmax of ``x`` ``[rows, cols]``; one program per row holding the whole row.

    Raises ValueError for a non-2-D or non-float input, or when ``cols > max_cols`` (the row would not
    fit one tile: use :func:`online_softmax`).
    """
    _check(x)
    rows, cols = x.shape
    if cols > max_cols:
        raise ValueError(
            f"row of {cols} columns exceeds one tile of {max_cols}; use online_softmax"
        )
    x = x.contiguous()
    y = torch.empty_like(x)
    _softmax_kernel[(rows,)](
        x, y, cols, x.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(cols)
    )
    return y


def online_softmax(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Row-wise softmax of ``x`` ``[rows, cols]`` computed tile by tile with a running max and sum.

    ``block`` (a power of two) is the tile width in elements; any row length works.
    """
    _check(x)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    rows, cols = x.shape
    x = x.contiguous()
    y = torch.empty_like(x)
    _online_softmax_kernel[(rows,)](x, y, cols, x.stride(0), y.stride(0), BLOCK=block)
    return y
