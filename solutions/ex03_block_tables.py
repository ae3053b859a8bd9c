"""Exercise 03: three parts of the engine, built on the paged KV pool (chapter 03).

The KV pool of one layer is ``key_cache``/``value_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. A sequence's block table lists the physical blocks
that hold its logical blocks 0, 1, 2, ... in order; flattened to ``[num_blocks * block_size]`` rows, the
pool has one row, a *slot*, per token. You write, with the engine's exact interfaces
(``paged/engine/parts.py``):

1. ``slot_mapping`` (region ch03.ex1): the slot of every token one engine step computes, for a packed
   batch of prompt chunks and decodes (vLLM builds the same list in ``vllm/v1/worker/block_table.py``,
   ``compute_slot_mapping``).
2. ``write_kv`` (ch03.ex2): store one layer's new keys and values at those slots (vLLM's
   ``reshape_and_cache_flash``, ``csrc/cache_kernels.cu``).
3. ``decode_attention`` = ``gather_kv`` (ch03.ex3) + the attention itself (ch03.ex4): one query token per
   sequence attends to its whole paged context (the PagedAttention paper, Kwon et al. 2023, section 4.1).

Everything outside the marked regions (input checks, the call of ``gather_kv``) is written for you.
``PART_REGIONS`` below tells the course which regions make each engine part; chapter 03 ends by running
your three parts inside the engine. Check one step in the chapter with ``check("ch03.ex1")``, or all of
them from a terminal with ``python -m paged grade ch03``.
"""

from __future__ import annotations

import torch

# engine part -> the graded regions it is made of (read by paged_course.capstone)
PART_REGIONS = {
    "slot_mapping": ("ch03.ex1",),
    "write_kv": ("ch03.ex2",),
    "decode_attention": ("ch03.ex3", "ch03.ex4"),
}


def slot_mapping(
    block_tables: list[list[int]],
    start_positions: list[int],
    num_tokens: list[int],
    block_size: int,
) -> list[int]:
    """Slots of the tokens one engine step computes, for a packed batch.

    Sequence ``s`` computes the ``num_tokens[s]`` tokens at positions ``start_positions[s]``,
    ``start_positions[s] + 1``, ...: a prompt (or a chunk of it, with chunked prefill) starts wherever its
    computed tokens end; a decode computes one token, at position ``len - 1``. The result lists the slots
    of sequence 0's tokens, then sequence 1's, and so on (the packed order of the step).

    Args:
        block_tables: one list of physical block ids per sequence, logical block 0 first.
        start_positions, num_tokens: one int per sequence, ``>= 0``.
        block_size: tokens per block, ``> 0``.

    Returns:
        ``sum(num_tokens)`` ints. Example: tables ``[[10, 11, 12]]``, start ``[7]``, 2 tokens, block size 4
        -> ``[47, 48]`` (positions 7 and 8 are offset 3 of block 11 and offset 0 of block 12).

    Raises:
        ValueError: mismatched list lengths, ``block_size <= 0``, or a position past the end of its table.

    The inputs are not modified (the scheduler reads them again after this call); a sequence with no tokens
    contributes no slot, wherever it stands in the batch.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    if not len(block_tables) == len(start_positions) == len(num_tokens):
        raise ValueError(
            f"one entry per sequence: {len(block_tables)} tables, {len(start_positions)} starts, "
            f"{len(num_tokens)} token counts"
        )
    for s, (table, start, n) in enumerate(zip(block_tables, start_positions, num_tokens)):
        if start < 0 or n < 0 or start + n > len(table) * block_size:
            raise ValueError(
                f"sequence {s}: positions {start}..{start + n - 1} do not fit its table of "
                f"{len(table)} blocks x {block_size} tokens"
            )
    # BEGIN SOLUTION ch03.ex1 -- the slot of every token this step computes, in batch order
    # HINT: Which logical block and which offset hold position p? And where does the table say that logical block
    # HINT+ lives?
    # HINT: The positions run from start to start + n - 1. Position p sits at offset p % block_size of logical
    # HINT+ block p // block_size; the table names the physical block, whose first slot is its id times block_size.
    slots = []
    for table, start, n in zip(block_tables, start_positions, num_tokens):
        for p in range(start, start + n):
            slots.append(table[p // block_size] * block_size + p % block_size)
    return slots
    # END SOLUTION


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store token ``i``'s key and value at slot ``slot_mapping[i]`` of one layer's caches, in place.

    Args:
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous (the
            engine's pool views are).
        key, value: ``[T, num_kv_heads, head_dim]``, any float dtype (stored in the cache's dtype).
        slot_mapping: int64 ``[T]``; slot ``-1`` means "store nothing for this token" (vLLM pads with it),
            every other slot in ``[0, num_blocks * block_size)`` and none twice.

    Slot ``x`` is offset ``x % block_size`` of block ``x // block_size``. Nothing but the given slots may
    change, and a slot of ``-1`` must not write anywhere (in PyTorch, index ``-1`` means "the last row").

    Raises:
        ValueError: shapes that do not match, a slot mapping that is not int64 ``[T]``, or a slot outside
            ``[-1, num_blocks * block_size)`` (checked before anything is written).

    ``key``, ``value`` and ``slot_mapping`` are not modified; a ``-1`` may stand anywhere in the batch.
    """
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache {list(value_cache.shape)} != key_cache {list(key_cache.shape)}"
        )
    for name, t in (("key", key), ("value", value)):
        if (
            t.dim() != 3
            or tuple(t.shape[1:]) != (num_kv_heads, head_dim)
            or t.shape[0] != slot_mapping.shape[0]
        ):
            raise ValueError(
                f"{name} must be [T={slot_mapping.shape[0]}, {num_kv_heads}, {head_dim}], "
                f"got {list(t.shape)}"
            )
    if slot_mapping.dim() != 1 or slot_mapping.dtype != torch.int64:
        raise ValueError(
            f"slot_mapping must be int64 [T], got {slot_mapping.dtype} {list(slot_mapping.shape)}"
        )
    if (
        slot_mapping.numel()
        and not -1 <= int(slot_mapping.min()) <= int(slot_mapping.max()) < num_blocks * block_size
    ):
        raise ValueError(
            f"slots {int(slot_mapping.min())}..{int(slot_mapping.max())} outside [-1, "
            f"{num_blocks * block_size}) ({num_blocks} blocks x {block_size} slots)"
        )
    # BEGIN SOLUTION ch03.ex2 -- every token's K/V at its slot, in place; slot -1 stores nothing
    # STUB: # Spot the bug: this write_kv runs, writes in place and passes some of its checks, but one promise
    # STUB: # of the docstring does not hold (chapter 03 shows the symptom). Fix it; the region counts only
    # STUB: # when every one of its checks passes.
    # STUB: flat_k = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    # STUB: flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    # STUB: flat_k[slot_mapping] = key.to(key_cache.dtype)
    # STUB: flat_v[slot_mapping] = value.to(value_cache.dtype)
    # HINT: Run the chapter's symptom cell: which slot changed that no token of the step was given? Which
    # HINT+ slot does a row index of -1 name in PyTorch?
    # HINT: Keep only the tokens whose slot is not negative (a boolean mask over the slots), and copy those
    # HINT+ tokens' keys and values, in the pool's dtype, into the rows their slots name; the padding writes nothing.
    keep = slot_mapping >= 0  # -1: padding, store nothing
    slots = slot_mapping[keep]
    flat_k = key_cache.view(
        num_blocks * block_size, num_kv_heads, head_dim
    )  # row = slot; shares memory
    flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_k.index_copy_(0, slots, key[keep].to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value[keep].to(value_cache.dtype))
    # END SOLUTION


def gather_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather each sequence's K/V through its block table (vectorized: no Python loop over sequences).

    Args:
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: int32 ``[num_seqs, W]``. Entry ``j`` of row ``s`` is used when
            ``j < ceil(context_lens[s] / block_size)``; the entries after may hold anything: ``-1``
            padding or a stale id of a block that no longer exists (``>= num_blocks``). Never index the pool
            with them.
        context_lens: int32 ``[num_seqs]``, tokens per sequence (>= 1).

    Returns:
        ``(key, value, valid)``: ``key``/``value`` ``[num_seqs, L, num_kv_heads, head_dim]`` in the cache's
        dtype with ``L = W * block_size`` (any ``L >= max(context_lens)`` is accepted), position ``p`` of
        sequence ``s`` at ``[s, p]``; what sits at positions past a context is unspecified. ``valid`` is
        bool ``[num_seqs, L]``, True exactly where ``p < context_lens[s]``.

    The inputs are not modified (the table belongs to the engine); each row's count of used entries is its own.
    """
    block_size = key_cache.shape[1]
    # BEGIN SOLUTION ch03.ex3 -- (key, value, valid) for the whole batch at once (see the docstring)
    # HINT: Indexing the pool with the table reads every entry, used or not: which entries are used, row by row, and
    # HINT+ what can stand in for the others?
    # HINT: A table entry is used when its column comes before the number of blocks its context fills (rounded
    # HINT+ up); put a harmless block id, such as 0, in every other entry, index the pool with the whole table at
    # HINT+ once, then merge the block and slot dimensions into one token dimension. Valid is then a position
    # HINT+ before the context length.
    width = block_tables.shape[1]
    lens = context_lens.long()
    used = (
        torch.arange(width, device=lens.device) < ((lens + block_size - 1) // block_size)[:, None]
    )
    table = torch.where(used, block_tables.long(), 0)
    key = key_cache[table].flatten(1, 2)  # [S, W, bs, KVH, D] -> [S, W * bs, KVH, D]
    value = value_cache[table].flatten(1, 2)
    valid = torch.arange(width * block_size, device=lens.device) < lens[:, None]
    return key, value, valid
    # END SOLUTION


def decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One decode step of attention over the paged pool (the engine's ``decode_attention`` part).

    Args:
        query: ``[num_seqs, num_heads, head_dim]``, float32, float16 or bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, the query's dtype.
        block_tables, context_lens: as in :func:`gather_kv`.
        scale: the softmax scale (the model's: not always ``head_dim ** -0.5``).

    Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (GQA). Whatever the pool holds past a
    context (stale keys, NaN, inf) must not reach the output. Scores and softmax in float32.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in the query's dtype. The inputs are not modified (for a float32
        query, ``query.float()`` is the query itself, not a copy). Scores may reach the hundreds.

    Raises:
        ValueError: mismatched shapes, ``num_heads % num_kv_heads != 0``, or a context length outside
            ``[1, W * block_size]``.
    """
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, kv_dim = key_cache.shape
    if value_cache.shape != key_cache.shape or kv_dim != head_dim:
        raise ValueError(
            f"query {list(query.shape)}, key_cache {list(key_cache.shape)}, value_cache "
            f"{list(value_cache.shape)}: head_dim and cache shapes must agree"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if (
        block_tables.dim() != 2
        or block_tables.shape[0] != num_seqs
        or tuple(context_lens.shape) != (num_seqs,)
    ):
        raise ValueError(
            f"{num_seqs} queries need block_tables [{num_seqs}, W] and context_lens [{num_seqs}], got "
            f"{list(block_tables.shape)} and {list(context_lens.shape)}"
        )
    capacity = block_tables.shape[1] * block_size
    if num_seqs and not 1 <= int(context_lens.min()) <= int(context_lens.max()) <= capacity:
        raise ValueError(
            f"context lengths {int(context_lens.min())}..{int(context_lens.max())} outside [1, "
            f"{capacity}] (a table of {block_tables.shape[1]} blocks x {block_size} tokens)"
        )
    key, value, valid = gather_kv(key_cache, value_cache, block_tables, context_lens)
    # BEGIN SOLUTION ch03.ex4 -- softmax(scale * q . k) over each context, GQA, in float32, garbage kept out
    # HINT: Which query heads share a KV head? A view of the query can put each group beside its KV head. And where
    # HINT+ can NaN get into the result, given that 0 * NaN is NaN?
    # HINT: Split the query's heads into one group per KV head and compute in float32. Replace the keys and values
    # HINT+ past each context by zeros (selecting, not multiplying), score every query against every key of its
    # HINT+ group's KV head, set the invalid scores to minus infinity before the softmax, weight the values by it,
    # HINT+ and return the heads in their original layout and the query's dtype.
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
