# Generated from solutions/ex01_fragmentation.py by `python -m paged course sync`. Edit only the marked regions;
# grade with `python -m paged grade`.

"""Exercise 01: waste accounting for a trace of requests (chapter 01).

A paged KV cache stores each request in blocks of ``block_size`` token slots. Given the final token
count of every request, you compute how many blocks each one holds, how many of their slots are
wasted (the slack in the last block: PagedAttention paper §4.3), and how many requests of a queue fit
in a pool of ``num_blocks`` blocks. All functions take a sequence of lengths (a list or a 1-D NumPy
array of non-negative ints) and must work on a whole trace at once (NumPy, no per-token loop).

Check your answers with ``python -m paged grade ch01``.
"""

from __future__ import annotations

import numpy as np


def _lengths(lengths) -> np.ndarray:
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.ndim != 1 or (arr < 0).any():
        raise ValueError(f"lengths must be a 1-D sequence of non-negative token counts, got {lengths!r}")
    return arr


def num_blocks(lengths, block_size: int) -> np.ndarray:
    """Blocks each request holds: ``ceil(length / block_size)``; a 0-token request holds 0 blocks.

    Returns an int64 array shaped like ``lengths``. Raises ValueError when ``block_size <= 0``.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    n = _lengths(lengths)
    raise NotImplementedError("ch01.ex1: ceil division without floats: (n + block_size - 1) // block_size")


def internal_waste(lengths, block_size: int) -> np.ndarray:
    """Slots allocated but never filled, per request: ``num_blocks * block_size - length``.

    Always between 0 and ``block_size - 1`` (claim C3). Returns an int64 array like ``lengths``.
    """
    n = _lengths(lengths)
    raise NotImplementedError("ch01.ex2: allocated slots minus real tokens; reuse num_blocks()")


def requests_that_fit(lengths, block_size: int, num_blocks_in_pool: int) -> int:
    """How many requests, taken in queue order from the head, fit in the pool together.

    Admission stops at the first request whose blocks do not fit (first-come first-served, no
    skipping ahead). Example: lengths ``[20, 5, 40]``, block_size 16, pool of 4 blocks -> 2
    (2 + 1 blocks fit, 3 more do not).
    """
    if num_blocks_in_pool < 0:
        raise ValueError(f"num_blocks_in_pool must be >= 0, got {num_blocks_in_pool}")
    blocks = num_blocks(lengths, block_size)
    raise NotImplementedError("ch01.ex3: running total of blocks (np.cumsum); count the prefix that stays <= the pool")
