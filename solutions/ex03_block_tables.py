"""Exercise 03: slot mapping for a batch, and gather-based paged attention for one decode step (chapter 03).

The KV pool of one layer is ``key_cache``/``value_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. Token position ``p`` of a sequence lives in
physical block ``block_table[p // block_size]`` at offset ``p % block_size``, i.e. at the flat *slot*

    slot = block_table[p // block_size] * block_size + p % block_size

You write three functions:

1. ``slot_mapping``: the slots of this step's tokens for a whole batch (vLLM builds the same tensor in
   ``vllm/v1/worker/gpu_model_runner.py`` and hands it to ``reshape_and_cache``).
2. ``gather_kv``: every sequence's keys and values, gathered through its block table into padded
   ``[num_seqs, max_len, num_kv_heads, head_dim]`` tensors, with a mask of the real positions.
3. ``paged_attention_decode``: one query token per sequence attends to its context (GQA: query head
   ``h`` uses KV head ``h // (num_heads // num_kv_heads)``), softmax in float32, and nothing stored past
   the context (stale values, NaN, inf) may reach the output.

Check your answers with ``python -m paged grade ch03``.
"""

from __future__ import annotations

import torch


def slot_mapping(block_tables: list[list[int]], start_positions: list[int], num_tokens: list[int],
                 block_size: int) -> torch.Tensor:
    """Slots of the tokens computed this step, for a packed batch.

    Sequence ``s`` computes the ``num_tokens[s]`` tokens at positions ``start_positions[s]``,
    ``start_positions[s] + 1``, ...: a prefill starts at 0 (``num_tokens`` = prompt length), a decode
    step computes one token at position ``len - 1``. The result concatenates the sequences in order.

    Args:
        block_tables: one list of physical block ids per sequence.
        start_positions, num_tokens: one int per sequence, ``>= 0``.
        block_size: tokens per block, ``> 0``.

    Returns:
        int64 tensor ``[sum(num_tokens)]``. Example: tables ``[[10, 11, 12]]``, start ``[7]``, 2 tokens,
        block size 4 -> ``[47, 48]`` (positions 7 and 8 are offset 3 of block 11 and offset 0 of block 12).

    Raises:
        ValueError: mismatched list lengths, ``block_size <= 0``, or a position past the end of its table.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    if not len(block_tables) == len(start_positions) == len(num_tokens):
        raise ValueError(f"one entry per sequence: {len(block_tables)} tables, {len(start_positions)} starts, "
                         f"{len(num_tokens)} token counts")
    for s, (table, start, n) in enumerate(zip(block_tables, start_positions, num_tokens)):
        if start < 0 or n < 0 or start + n > len(table) * block_size:
            raise ValueError(f"sequence {s}: positions {start}..{start + n - 1} do not fit its table of "
                             f"{len(table)} blocks x {block_size} tokens")
    # BEGIN SOLUTION ch03.ex1 -- each sequence, each position p: table[p // bs] * bs + p % bs
    slots = []
    for table, start, n in zip(block_tables, start_positions, num_tokens):
        for p in range(start, start + n):
            slots.append(table[p // block_size] * block_size + p % block_size)
    return torch.tensor(slots, dtype=torch.int64)
    # END SOLUTION


def gather_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
              context_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather each sequence's K/V through its block table (vectorized: no loop over sequences).

    Args:
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: int ``[num_seqs, max_blocks_per_seq]``; entries past a sequence's last used block
            may hold anything (-1, stale ids): do not index the pool with them.
        context_lens: int ``[num_seqs]``, tokens per sequence (>= 1).

    Returns:
        ``(key, value, valid)``: ``key``/``value`` ``[num_seqs, L, num_kv_heads, head_dim]`` with
        ``L = max_blocks_per_seq * block_size`` (or any ``L >= max(context_lens)``), position ``p`` of
        sequence ``s`` at ``[s, p]``; ``valid`` bool ``[num_seqs, L]``, True where ``p < context_lens[s]``.
    """
    block_size = key_cache.shape[1]
    # BEGIN SOLUTION ch03.ex2 -- entries past a context may be -1 or stale: index with valid ids only
    width = block_tables.shape[1]
    lens = context_lens.long()
    used = torch.arange(width, device=lens.device) < ((lens + block_size - 1) // block_size)[:, None]
    table = torch.where(used, block_tables.long(), 0)
    key = key_cache[table].flatten(1, 2)  # [S, width, bs, KVH, D] -> [S, width * bs, KVH, D]
    value = value_cache[table].flatten(1, 2)
    valid = torch.arange(width * block_size, device=lens.device) < lens[:, None]
    return key, value, valid
    # END SOLUTION


def paged_attention_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """One decode step of attention over the paged pool, through ``gather_kv``.

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` (float32, float16 or bfloat16).
        key_cache, value_cache, block_tables, context_lens: as in ``gather_kv``; same dtype as query.
        scale: softmax scale, default ``head_dim ** -0.5``.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query dtype, computed in float32.
    """
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    scale = head_dim ** -0.5 if scale is None else scale
    key, value, valid = gather_kv(key_cache, value_cache, block_tables, context_lens)
    # BEGIN SOLUTION ch03.ex3 -- q.view(S, KVH, group, D); torch.where K/V to 0 and scores to -inf off valid
    group = num_heads // num_kv_heads
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
    keep = valid[:, :, None, None]
    k = torch.where(keep, key.float(), 0.0)
    v = torch.where(keep, value.float(), 0.0)
    scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("skgl,slkd->skgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
    # END SOLUTION
