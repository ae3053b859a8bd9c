"""Exercise 07: two more parts of the engine, the prompt chunks' attention and the sampler (chapter 07).

1. ``prefill_attention`` = ``sequence_kv`` (region ch07.ex2) + ``attend_chunk`` (ch07.ex3): every prompt
   chunk of a step attends to its sequence's cached prefix and, causally, to itself, all read from the
   paged pool (vLLM v1's chunked prefill; the packed interface of ``paged.kernels.launch_prefill``).
2. ``Sampler`` = ``filter_top_k_top_p`` (ch07.ex4) + the draw in ``Sampler.sample`` (ch07.ex5): greedy,
   temperature, top-k, top-p and per-request generators on one packed logits tensor (the reference is
   ``paged/worker/sampler.py``; vLLM's ``vllm/v1/sample/sampler.py`` applies the same steps).

Everything outside the marked regions (input checks, the loop over a step's chunks) is written for you.
``PART_REGIONS`` tells the course which regions make each engine part; the capstone runs them. Check one
step in the chapter with ``check("ch07.ex2")``, or all of them with ``python -m paged grade ch07``.
"""

from __future__ import annotations

import torch

from paged.core.sequence import SamplingParams

# engine part -> the graded regions it is made of (read by paged_course.capstone)
PART_REGIONS = {
    "prefill_attention": ("ch07.ex2", "ch07.ex3"),
    "Sampler": ("ch07.ex4", "ch07.ex5"),
}


def sequence_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's first ``length`` keys and values, read through its block table.

    Args:
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        table: int ``[W]``, the sequence's physical blocks in logical order. Entries past
            ``ceil(length / block_size)`` may hold anything (``-1`` padding, ids past the pool): never read them.
        length: tokens of the sequence to read, ``1 <= length <= W * block_size``.

    Returns:
        ``(key, value)``, each ``[length, num_kv_heads, head_dim]`` in the cache's dtype: row ``p`` is
        position ``p`` of the sequence. The inputs are not modified.
    """
    block_size = key_cache.shape[1]
    # BEGIN SOLUTION ch07.ex2 -- the sequence's K/V, position by position, from the blocks it uses
    # HINT: How many entries of the table does a sequence of this length use, and what do you get when you index
    # HINT+ the pool with just those?
    # HINT: Take the first ceil(length / block_size) entries as a long index, select those whole blocks from each
    # HINT+ cache, merge the block and slot dimensions into one position dimension, then cut it to length rows.
    used = table[: -(-length // block_size)].long()
    key = key_cache.index_select(0, used).flatten(0, 1)[:length]
    value = value_cache.index_select(0, used).flatten(0, 1)[:length]
    return key, value
    # END SOLUTION


def attend_chunk(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of a chunk's ``n`` new tokens to their sequence's first ``L`` positions.

    Args:
        query: ``[n, H, D]``, the chunk's tokens; they sit at positions ``L - n .. L - 1`` of the sequence.
        key, value: ``[L, KVH, D]``, the sequence's positions ``0 .. L - 1`` (cached prefix, then the chunk's
            own K/V), ``L >= n >= 1``; ``H`` is a multiple of ``KVH``.
        scale: the softmax scale.

    Invariants: the chunk's token ``i`` attends to positions ``0 .. L - n + i`` and to none after (the
    positions after it are the future, even though their K/V are already in the pool); query head ``h`` reads
    KV head ``h // (H // KVH)`` (GQA); scores and softmax in float32.

    Returns:
        ``[n, H, D]`` in the query's dtype. The inputs are not modified.
    """
    n, num_heads, head_dim = query.shape
    length, num_kv_heads = key.shape[:2]
    # BEGIN SOLUTION ch07.ex3 -- softmax(scale * q . k) over positions up to each token's own, GQA, in float32
    # HINT: The chunk is the last n of L positions: where does its token i sit, and which positions can it see?
    # HINT+ And which query heads share a KV head?
    # HINT: Token i's position is L - n + i; a key at position t is visible when t is at most that. Compare a column
    # HINT+ of the query positions with a row of the key positions to get the mask, give hidden scores minus
    # HINT+ infinity before the softmax, and view the query heads as KVH groups so each group meets its own KV head.
    group = num_heads // num_kv_heads
    q = query.float().view(n, num_kv_heads, group, head_dim)
    scores = torch.einsum("nkgd,lkd->kgnl", q, key.float()) * scale
    positions = torch.arange(length - n, length, device=query.device)
    hidden = torch.arange(length, device=query.device)[None, :] > positions[:, None]  # [n, L]
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    out = torch.einsum("kgnl,lkd->nkgd", probs, value.float())
    return out.reshape(n, num_heads, head_dim).to(query.dtype)
    # END SOLUTION


def prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    """Attention of every prompt chunk of a step over the paged pool (the engine's ``prefill_attention`` part).

    Args:
        query: ``[T, H, D]``, the packed new tokens of ``C`` chunks; chunk ``c`` owns rows
            ``query_start[c] .. query_start[c + 1] - 1``.
        key_cache, value_cache: ``[num_blocks, block_size, KVH, D]``; every chunk's new K/V are already in them.
        block_tables: int ``[C, W]``, row ``c`` the blocks of chunk ``c``'s sequence (entries past its context
            may be anything).
        query_start: int ``[C + 1]``, ``query_start[0] == 0``, ``query_start[C] == T``, non-decreasing.
        context_lens: int ``[C]``, each sequence's tokens after this step (cached prefix + chunk).
        max_query_len: the longest chunk (the Triton kernel sizes its grid with it; unused here).
        scale: the softmax scale.

    Chunk ``c``'s token ``i`` attends to positions ``0 .. context_lens[c] - q_c + i`` of its own sequence
    (``q_c`` its length). Returns ``[T, H, D]`` in the query's dtype; the inputs are not modified.

    Raises:
        ValueError: mismatched shapes, ``H % KVH != 0``, offsets that are not a partition of ``0 .. T``, or a
            chunk longer than its context or a context longer than its table.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, kv_dim = key_cache.shape
    if value_cache.shape != key_cache.shape or kv_dim != head_dim:
        raise ValueError(
            f"query {list(query.shape)}, key_cache {list(key_cache.shape)}, value_cache "
            f"{list(value_cache.shape)}: head_dim and cache shapes must agree"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    num_chunks = context_lens.shape[0]
    if tuple(query_start.shape) != (num_chunks + 1,) or block_tables.shape[0] != num_chunks:
        raise ValueError(
            f"{num_chunks} chunks need query_start [{num_chunks + 1}] and block_tables [{num_chunks}, W], "
            f"got {list(query_start.shape)} and {list(block_tables.shape)}"
        )
    starts, lens = query_start.tolist(), context_lens.tolist()
    if starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(f"query_start must run from 0 to T={num_tokens}, got {starts}")
    capacity = block_tables.shape[1] * block_size
    for c, (first, last, length) in enumerate(zip(starts, starts[1:], lens)):
        if not 0 <= last - first <= length <= capacity:
            raise ValueError(
                f"chunk {c}: {last - first} tokens (rows {first}..{last - 1}), context {length}, table of "
                f"{block_tables.shape[1]} blocks x {block_size} tokens"
            )
    out = torch.empty_like(query)
    for c, (first, last, length) in enumerate(zip(starts, starts[1:], lens)):
        if last > first:
            key, value = sequence_kv(key_cache, value_cache, block_tables[c], length)
            out[first:last] = attend_chunk(query[first:last], key, value, scale)
    return out


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's probabilities after top-k and top-p, in descending-logit order.

    Args:
        logits: float32 ``[S, V]`` (already divided by each row's temperature).
        top_k: int64 ``[S]``, ``1 <= top_k[s]``; ``V`` or more keeps every token.
        top_p: float32 ``[S]`` in ``(0, 1]``; ``1`` keeps every token.

    Returns:
        ``(probs, order)``, both ``[S, V]``: ``order[s, r]`` is the token of rank ``r`` in row ``s`` (as
        ``logits.sort(dim=-1, descending=True)`` orders them, ties included) and ``probs[s, r]`` its
        probability after filtering, renormalized so that each row sums to 1. A token survives when its rank
        is below ``top_k`` *and* the softmax mass of the tokens ranked above it, among those top-k, is below
        ``top_p`` (so the token that crosses ``top_p`` is kept). The most likely token always survives.

    The inputs are not modified; each row's filters are its own.
    """
    # BEGIN SOLUTION ch07.ex4 -- sort, cut each row to its top_k, then to its nucleus, renormalize
    # HINT: Sorting once puts both filters in terms of rank. Which one must come first for the nucleus to be
    # HINT+ measured over the tokens top-k left? And how do you find "the mass of the tokens ranked above"?
    # HINT: After a descending sort, hide ranks at or past top_k by giving them minus infinity, take the softmax, and
    # HINT+ subtract each probability from its running cumulative sum; zero the tokens where that exceeds top_p
    # HINT+ (never rank 0), then divide each row by its sum.
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True), order
    # END SOLUTION


class Sampler:
    """Batched greedy / temperature / top-k / top-p sampling with per-row generators (the engine's
    ``sampler`` part; the interface of ``paged.worker.sampler.Sampler``).

    Args:
        seed: seed of the shared CPU generator used by rows without their own (``None``: 0).
    """

    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator()
        self.generator.manual_seed(0 if seed is None else int(seed))

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None] | None = None,
    ) -> list[int]:
        """One token id per row of ``logits`` (float32 ``[S, V]``).

        Row ``s`` follows ``params[s]``: ``temperature == 0`` (``params[s].greedy``) takes the first maximal
        logit; otherwise the row's logits are divided by its temperature, filtered by its ``top_k``
        (``-1``: off) and ``top_p`` as :func:`filter_top_k_top_p` does, and sampled by inverse CDF: the
        token is the first in sorted order whose cumulative probability reaches ``u`` times the row's total,
        for one uniform ``u = torch.rand(1, generator=g)``. ``g`` is ``generators[s]`` when given, else the
        shared generator. Exactly one uniform is drawn per sampled row, in row order, and none for a greedy
        row: this is what makes a seeded request's tokens independent of its batch and equal to the
        reference's, token for token.

        Returns:
            ``S`` ints. The inputs are not modified.

        Raises:
            ValueError: ``len(params)`` or ``len(generators)`` differs from the number of rows.
        """
        num_rows, vocab = logits.shape
        generators = generators if generators is not None else [None] * num_rows
        if len(params) != num_rows or len(generators) != num_rows:
            raise ValueError(
                f"sample: {num_rows} logit rows but {len(params)} params and {len(generators)} generators"
            )
        # BEGIN SOLUTION ch07.ex5 -- greedy rows by argmax; the others scaled, filtered and drawn, one uniform each
        # HINT: Only the sampled rows need temperatures, filters and a uniform; gather them into one batch. Where does
        # HINT+ each row's uniform come from, and where does it land in the row's CDF?
        # HINT: Start from the argmax of every row; for the rows that are not greedy, build top-k (off = V) and top-p
        # HINT+ tensors, filter the scaled logits, draw one uniform per row from its own generator or the shared one,
        # HINT+ search the cumulative sum for u times its last entry (clamped to V - 1), map the sorted position back
        # HINT+ through order and write those tokens into their rows.
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            temps = torch.tensor([params[i].temperature for i in random_rows], device=logits.device)
            top_k = torch.tensor(
                [params[i].top_k if params[i].top_k > 0 else vocab for i in random_rows],
                device=logits.device,
            )
            top_p = torch.tensor([params[i].top_p for i in random_rows], device=logits.device)
            probs, order = filter_top_k_top_p(logits[rows].float() / temps[:, None], top_k, top_p)
            uniforms = torch.cat(
                [torch.rand(1, generator=generators[i] or self.generator) for i in random_rows]
            )
            cdf = probs.cumsum(dim=-1)
            target = (uniforms.to(cdf.device) * cdf[:, -1])[:, None]
            pick = torch.searchsorted(cdf, target).clamp_(max=vocab - 1)
            tokens[rows] = order.gather(1, pick).squeeze(1)
        return tokens.tolist()
        # END SOLUTION
