"""Graded: chapter 01, waste accounting for a trace (exercises/ex01_fragmentation.py).

Each test compares with a plain-Python reference written here, on seeded random ragged lengths
that include 0, exact multiples of the block size and lengths one past a multiple.
"""

from __future__ import annotations

import numpy as np
import pytest

BLOCK_SIZES = (1, 3, 16, 32)


def _trace(seed: int, block_size: int, n: int = 200) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40 * block_size, size=n)
    lengths[:6] = [0, 1, block_size, block_size + 1, 2 * block_size - 1, 3 * block_size]
    rng.shuffle(lengths)
    return lengths


def _ref_blocks(length: int, block_size: int) -> int:
    blocks = 0
    while blocks * block_size < length:
        blocks += 1
    return blocks


@pytest.mark.exercise("ch01.ex1", points=2)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_num_blocks(impl, block_size):
    ex = impl("ex01_fragmentation")
    lengths = _trace(block_size, block_size)
    got = np.asarray(ex.num_blocks(lengths, block_size))
    expected = np.array([_ref_blocks(int(n), block_size) for n in lengths])
    assert got.shape == lengths.shape, "one block count per request"
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, (f"num_blocks is ceil(length / block_size): length {lengths[bad[0]]} with block_size "
                           f"{block_size} needs {expected[bad[0]]} blocks, got {got[bad[0]]}")
    assert list(np.asarray(ex.num_blocks([5, 0], block_size))) == [_ref_blocks(5, block_size), 0], "lists work too"


@pytest.mark.exercise("ch01.ex2", points=3)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_internal_waste(impl, block_size):
    ex = impl("ex01_fragmentation")
    lengths = _trace(100 + block_size, block_size)
    got = np.asarray(ex.internal_waste(lengths, block_size))
    expected = np.array([_ref_blocks(int(n), block_size) * block_size - int(n) for n in lengths])
    assert got.shape == lengths.shape, "one waste value per request"
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, (f"waste = allocated slots - tokens: length {lengths[bad[0]]}, block_size {block_size}: "
                           f"expected {expected[bad[0]]}, got {got[bad[0]]}")
    assert got.max() <= block_size - 1 and got.min() >= 0, "paged waste per request is in [0, block_size - 1]"


def _ref_fit(lengths, block_size: int, pool: int) -> int:
    used = 0
    for count, n in enumerate(lengths):
        need = _ref_blocks(int(n), block_size)
        if used + need > pool:
            return count
        used += need
    return len(lengths)


@pytest.mark.exercise("ch01.ex3", points=3)
@pytest.mark.parametrize("block_size", (4, 16))
def test_requests_that_fit(impl, block_size):
    ex = impl("ex01_fragmentation")
    assert ex.requests_that_fit([20, 5, 40], 16, 4) == 2, "docstring example: 2 + 1 blocks fit, 3 more do not"
    rng = np.random.default_rng(7 + block_size)
    for _ in range(40):
        lengths = rng.integers(1, 10 * block_size, size=int(rng.integers(1, 30)))
        pool = int(rng.integers(0, 3 * lengths.sum() // block_size + 2))
        expected = _ref_fit(lengths, block_size, pool)
        got = ex.requests_that_fit(lengths, block_size, pool)
        assert got == expected, (f"first-come first-served admission: lengths {lengths.tolist()}, block_size "
                                 f"{block_size}, pool {pool} blocks -> {expected} requests fit, got {got}")
    # the whole queue fits, and an empty pool admits nothing with tokens
    assert ex.requests_that_fit([1, 1, 1], block_size, 3) == 3, "a pool with room for all admits all"
    assert ex.requests_that_fit([1, 2], block_size, 0) == 0, "an empty pool admits nothing"
