"""The input contract of paged decode attention, checked once at the boundary.

:func:`validate_decode_inputs` raises ``ValueError`` with the numbers for every input that
:func:`~paged.kernels.paged_attention_decode` (and the teaching kernels of ``paged_course.kernel_lab``,
which share its contract) cannot serve: shapes, dtypes, devices, the GQA ratio, the block size, a context
longer than its table row, a used table entry outside the pool. The launchers themselves check nothing
(no host sync in the engine's step loop).
"""

from __future__ import annotations

import math

import torch

from ._triton import kernel_device

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256


def validate_decode_inputs(
    query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
) -> None:
    """Raise ValueError (with the numbers) unless the inputs satisfy the contract of
    :func:`paged_attention_decode`. Reads ``context_lens`` and ``block_tables`` (one device sync; callers
    that build the inputs themselves and need none can use :func:`launch_decode`)."""
    if query.dim() != 3:
        raise ValueError(
            f"query must be [num_seqs, num_heads, head_dim], got shape {tuple(query.shape)}"
        )
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} != key_cache shape {tuple(key_cache.shape)}"
        )
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not query.dtype == key_cache.dtype == value_cache.dtype:
        raise ValueError(
            f"dtypes differ: query {query.dtype}, key_cache {key_cache.dtype}, "
            f"value_cache {value_cache.dtype}"
        )
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, kv_head_dim = key_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"head_dim differs: query {head_dim}, key/value cache {kv_head_dim}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if block_size < 2 or block_size & (block_size - 1) or block_size > 256:
        raise ValueError(f"block_size must be a power of two in [2, 256], got {block_size}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"GQA needs num_heads % num_kv_heads == 0, got {num_heads} % {num_kv_heads}"
        )
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache must be contiguous in head_dim (stride 1)")
    if block_tables.dim() != 2 or block_tables.dtype not in INDEX_DTYPES:
        raise ValueError(
            "block_tables must be a 2-D int32 (or int64) tensor [num_seqs, max_blocks_per_seq], "
            f"got {block_tables.dtype} of shape {tuple(block_tables.shape)}"
        )
    if context_lens.dim() != 1 or context_lens.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"context_lens must be a 1-D int32 (or int64) tensor [num_seqs], got {context_lens.dtype} "
            f"of shape {tuple(context_lens.shape)}"
        )
    if block_tables.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise ValueError(
            f"num_seqs differs: query {num_seqs}, block_tables {block_tables.shape[0]}, "
            f"context_lens {context_lens.shape[0]}"
        )
    if num_splits is not None and (
        isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1
    ):
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits!r}")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    kernel_device(query, key_cache, value_cache, block_tables, context_lens)
    if num_seqs == 0:
        return
    width = block_tables.shape[1]
    lens = context_lens.long()
    used = (
        torch.arange(width, device=lens.device)[None, :]
        < (lens[:, None] + block_size - 1) // block_size
    )
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    lo, hi, num_bad = torch.stack([lens.min(), lens.max(), bad.sum()]).tolist()  # one device sync
    if lo < 0:
        raise ValueError(f"context_lens must be >= 0, got minimum {lo}")
    if hi > width * block_size:
        raise ValueError(
            f"context_len {hi} exceeds the block table's capacity: {width} blocks x "
            f"{block_size} tokens = {width * block_size}"
        )
    if num_bad:
        seq, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_tables[{seq}, {col}] = {int(block_tables[seq, col])} is outside the pool of "
            f"{num_blocks} blocks (it holds tokens of a context of {int(lens[seq])})"
        )
