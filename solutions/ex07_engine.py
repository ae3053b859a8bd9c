"""Exercise 07: two more parts of the engine, the prompt chunks' attention and the sampler (chapter 07).

1. ``prefill_attention`` = ``sequence_kv`` (region ch07.ex2) + ``attend_chunk`` (ch07.ex3) +
   ``prefill_layout`` (ch07.ex9): every prompt chunk of a step attends to its sequence's cached prefix and,
   causally, to itself, all read from the paged pool (vLLM v1's chunked prefill; the packed interface of
   ``paged.kernels.launch_prefill``), once the packed layout is checked safe to read.
2. ``Sampler`` = ``filter_top_k_top_p`` (ch07.ex4) + the draw in ``Sampler.sample`` (ch07.ex5): greedy,
   temperature, top-k, top-p and per-request generators on one packed logits tensor (the reference is
   ``paged/worker/sampler.py``; vLLM's ``vllm/v1/sample/sampler.py`` applies the same steps).

3. ``prepare_inputs`` = ``step_inputs`` (ch07.ex6): one step's scheduled sequences packed into the
   integers the forward needs (positions, slots, offsets, padded tables, the rows that sample).
4. ``update_from_output`` = ``update_sequence`` (ch07.ex7) + the step's update (ch07.ex8): append the sampled
   tokens, finish sequences on their stop rules, fork ``n`` samples, free finished sequences.

Everything outside the marked regions (the loop over a step's chunks, the other input checks) is written
for you. ``PART_REGIONS`` tells the course which regions make each engine part; the capstone runs them.
Check one step in the chapter with ``check("ch07.ex2")``, or all of them with ``python -m paged grade ch07``.
"""

from __future__ import annotations

import array
from typing import NamedTuple

import torch

from paged.core.block_table import slot_mapping as reference_slot_mapping
from paged.core.scheduler_outputs import SchedulerOutputs, StepResult
from paged.core.sequence import SamplingParams, Sequence, SequenceStatus
from paged.worker.attention import StepLayout

# engine part -> the graded regions it is made of (read by paged_course.capstone)
PART_REGIONS = {
    "prefill_attention": ("ch07.ex2", "ch07.ex3", "ch07.ex9"),
    "Sampler": ("ch07.ex4", "ch07.ex5"),
    "prepare_inputs": ("ch07.ex6",),
    "update_from_output": ("ch07.ex7", "ch07.ex8"),
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


def prefill_layout(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    context_lens: torch.Tensor,
) -> list[tuple[int, int, int]]:
    """The chunks of one packed step, each ``(first, stop, context)``, after checking that the layout is one
    the attention can read without leaving a chunk's own rows, its own table or the pool's shape.

    Args: as :func:`prefill_attention`: ``query [T, H, D]``, ``key_cache`` / ``value_cache
        [num_blocks, block_size, KVH, D]``, ``block_tables`` int ``[C, W]``, ``query_start`` int ``[C + 1]``,
        ``context_lens`` int ``[C]``.

    Returns:
        ``C`` tuples of ints, in chunk order: chunk ``c`` owns query rows ``first .. stop - 1``
        (``query_start[c]``, ``query_start[c + 1]``) and its sequence has ``context`` tokens after this step
        (``context_lens[c]``). A chunk of 0 rows is allowed (it computes nothing).

    The layout is accepted exactly when all of these hold (every chunk checked, whatever its position):
    the two caches have the same shape and their head dimension is the query's; ``H`` is a multiple of ``KVH``;
    there is one offset more than chunks and one table row per chunk; the offsets start at 0, end at ``T``
    and never decrease; each chunk is no longer than its context (its first token's position,
    ``context - (stop - first)``, is not negative); each context fits its table
    (``context <= W * block_size``). The inputs are not modified.

    Raises:
        ValueError: the first condition that fails; the message names the chunk (for a per-chunk
            condition) and the numbers that disagree.
    """
    # BEGIN SOLUTION ch07.ex9 -- what makes a packed step safe to read: shapes, a partition of 0..T, chunks in tables
    # HINT: The attention trusts these numbers to index the pool and the query. Which of them, if wrong, would
    # HINT+ make it read another chunk's rows, a position before 0, a block past the sequence's table, or a KV head
    # HINT+ that does not exist? An empty chunk and a context that fills its table exactly are legal: keep them.
    # HINT: Check the cache shapes and head_dim, H % KVH, len(query_start) == C + 1 and block_tables' rows, then
    # HINT+ starts[0] == 0 and starts[-1] == T, then for every chunk 0 <= stop - first <= context <= W * block_size.
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, kv_dim = key_cache.shape
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
    spans = list(zip(starts, starts[1:], lens))
    for c, (first, stop, length) in enumerate(spans):
        if not 0 <= stop - first <= length <= capacity:
            raise ValueError(
                f"chunk {c}: {stop - first} tokens (rows {first}..{stop - 1}), context {length}, table of "
                f"{block_tables.shape[1]} blocks x {block_size} tokens"
            )
    return spans
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
        ValueError: a layout :func:`prefill_layout` refuses (mismatched shapes, ``H % KVH != 0``, offsets
            that are not a partition of ``0 .. T``, a chunk longer than its context or a context longer
            than its table).
    """
    spans = prefill_layout(query, key_cache, value_cache, block_tables, query_start, context_lens)
    out = torch.empty_like(query)
    for c, (first, last, length) in enumerate(spans):
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


class StepInputs(NamedTuple):
    """The integers of one step, as plain lists (``step_inputs``)."""

    positions: list[int]
    slot_mapping: list[int]
    sample_rows: list[int]
    query_start: list[int]
    block_tables: list[list[int]]


def step_inputs(
    block_tables: list[list[int]],
    context_lens: list[int],
    query_lens: list[int],
    block_size: int,
    keep: list[int],
    width: int,
    slot_mapping,
) -> StepInputs:
    """What the forward needs to know about a step's ``T`` new tokens, packed sequence after sequence.

    Args:
        block_tables: ``S`` lists of block ids, each covering its sequence's ``context_lens[s]`` tokens.
        context_lens: each sequence's tokens after this step (its cached prefix plus the new ones).
        query_lens: the new tokens of each sequence, ``1 <= query_lens[s] <= context_lens[s]``: its last
            ``query_lens[s]`` tokens (a prompt chunk after a prefix-cache hit or an earlier chunk, or the one
            token of a decode). ``T = sum(query_lens)``.
        block_size: slots per block.
        keep: the sequences whose next token is sampled (a decode, or a prompt's last chunk), increasing.
        width: the number of columns of the table tensor, at least ``len(block_tables[s])`` for every ``s``.
        slot_mapping: the ``slot_mapping`` part, ``(block_tables, start_positions, num_tokens, block_size)
            -> list[int]`` (chapter 03): the pool slot of each of ``num_tokens[s]`` tokens from position
            ``start_positions[s]`` of sequence ``s``, packed.

    Returns:
        ``StepInputs`` of plain lists of ints:
        ``positions`` ``[T]``: each new token's position in its own sequence;
        ``slot_mapping`` ``[T]``: each new token's pool slot (from the ``slot_mapping`` part);
        ``sample_rows`` ``[len(keep)]``: for each sequence of ``keep``, in that order, the packed row of its
        last new token (whose logits sample its next token);
        ``query_start`` ``[S + 1]``: packed row where each sequence's new tokens begin, then ``T``;
        ``block_tables`` ``[S][width]``: each table followed by zeros up to ``width`` (block 0 exists in
        every pool; the attention never reads past a context).

    The inputs are not modified (the tables are the block manager's own lists).
    """
    # BEGIN SOLUTION ch07.ex6 -- the step's positions, slots, offsets, sampled rows and padded tables
    # HINT: A sequence's new tokens are the *last* query_lens[s] of its context_lens[s]: where does the first one
    # HINT+ sit? Once you know that, the slots are the chapter-03 part's job, and each sequence's rows in the
    # HINT+ packed batch follow from the lengths before it.
    # HINT: start = context - query per sequence; positions run start .. context - 1; pass those starts to the
    # HINT+ slot_mapping part; query_start is the running sum of query_lens from 0; a kept sequence samples at
    # HINT+ query_start[s + 1] - 1; pad copies of the tables (never the tables themselves) with zeros.
    starts = [context - query for context, query in zip(context_lens, query_lens)]
    positions = [p for start, query in zip(starts, query_lens) for p in range(start, start + query)]
    slots = list(slot_mapping(block_tables, starts, query_lens, block_size))
    query_start = [0]
    for query in query_lens:
        query_start.append(query_start[-1] + query)
    sample_rows = [query_start[s + 1] - 1 for s in keep]
    tables = [list(table) + [0] * (width - len(table)) for table in block_tables]
    return StepInputs(positions, slots, sample_rows, query_start, tables)
    # END SOLUTION


def prepare_inputs(
    block_tables: list[list[int]],
    context_lens: list[int],
    query_lens: list[int],
    block_size: int,
    keep: list[int] | None = None,
    slot_mapping=None,
    token_ids: list[int] | None = None,
    width: int | None = None,
) -> tuple[torch.Tensor, StepLayout]:
    """The engine's ``prepare_inputs`` part: :func:`step_inputs` packed into one host int64 tensor (one copy
    to the device per step) with the ``StepLayout`` that ``AttentionMetadata.from_buffer`` reads it by.

    Sequences that compute several tokens (chunks) come first, decodes last; ``keep`` defaults to every
    sequence, ``slot_mapping`` to the reference part, ``width`` to the widest table (a CUDA graph's fixed
    buffers pass theirs). The interface of ``paged.worker.attention.prepare_inputs``.

    Raises:
        ValueError: mismatched lengths, a query longer than its context, a table too short for its
            context, a chunk after a decode, or lists of ``step_inputs`` of the wrong length.
    """
    num_seqs = len(block_tables)
    if not (len(context_lens) == len(query_lens) == num_seqs) or num_seqs == 0:
        raise ValueError(
            f"need one block table, context length and query length per sequence, got "
            f"{num_seqs}, {len(context_lens)}, {len(query_lens)}"
        )
    for s, (table, context, query) in enumerate(zip(block_tables, context_lens, query_lens)):
        if not 0 < query <= context or len(table) * block_size < context:
            raise ValueError(
                f"sequence {s}: query {query} tokens, context {context} tokens, block table of "
                f"{len(table)} blocks x {block_size} slots"
            )
    num_chunks = sum(query > 1 for query in query_lens)
    if any(query > 1 for query in query_lens[num_chunks:]):
        raise ValueError("pack the multi-token sequences (chunks) before the one-token decodes")
    decode_width = width or max((len(t) for t in block_tables[num_chunks:]), default=0)
    width = width or max(len(t) for t in block_tables)
    keep = list(range(num_seqs)) if keep is None else list(keep)
    step = step_inputs(
        block_tables,
        context_lens,
        query_lens,
        block_size,
        keep,
        width,
        slot_mapping or reference_slot_mapping,
    )
    num_tokens, token_ids = sum(query_lens), list(token_ids or ())
    want = (num_tokens, num_tokens, len(keep), num_seqs + 1, num_seqs)
    got = tuple(len(field) for field in step)
    if got != want or any(len(row) != width for row in step.block_tables):
        raise ValueError(
            f"step_inputs returned lists of lengths {got} (tables {[len(r) for r in step.block_tables]}), "
            f"expected {want} (tables of {width})"
        )
    flat = array.array("q", token_ids)
    for field in (
        step.positions,
        step.slot_mapping,
        step.sample_rows,
        context_lens,
        step.query_start,
    ):
        flat.extend(field)
    for row in step.block_tables:
        flat.extend(row)
    sizes = (len(token_ids), num_tokens, num_tokens, len(keep), num_seqs, num_seqs + 1)
    layout = StepLayout(
        (*sizes, num_seqs * width), width, decode_width, num_chunks, max(query_lens)
    )
    return torch.frombuffer(flat, dtype=torch.int64), layout


def update_sequence(seq: Sequence, token: int, max_model_len: int) -> None:
    """Append one sampled ``token`` to ``seq`` and decide whether the sequence stops.

    Args:
        seq: a running sequence (``len(seq)`` tokens, of which ``seq.num_prompt_tokens`` are the prompt);
            its request is ``seq.group``.
        token: the token sampled for it.
        max_model_len: the most tokens (prompt and output) a sequence may hold.

    Effects: ``token`` is appended, always (a stop token is part of the output). Then the
    sequence's ``status`` becomes ``SequenceStatus.FINISHED_STOPPED`` when ``token`` is one of
    ``seq.group.stop_token_ids`` (the request's ``stop_token_ids``, plus the model's EOS unless
    ``ignore_eos``); otherwise ``FINISHED_LENGTH`` when the sequence now has
    ``seq.group.sampling_params.max_tokens`` output tokens or ``max_model_len`` tokens in all; otherwise it
    stays as it was. Nothing else changes (no blocks are freed here).
    """
    # BEGIN SOLUTION ch07.ex7 -- append, then the stop rules in order: a stop token, then the two lengths
    # HINT: The token is appended whatever happens. Which count does max_tokens limit, and which one
    # HINT+ max_model_len? Which reason wins when a stop token is also the last token allowed?
    # HINT: Append first; a token in group.stop_token_ids -> FINISHED_STOPPED; else output tokens (len(seq) minus
    # HINT+ the prompt) reaching max_tokens, or len(seq) reaching max_model_len -> FINISHED_LENGTH.
    seq.append_token_id(token)
    if token in seq.group.stop_token_ids:
        seq.status = SequenceStatus.FINISHED_STOPPED
    elif (
        len(seq) - seq.num_prompt_tokens >= seq.group.sampling_params.max_tokens
        or len(seq) >= max_model_len
    ):
        seq.status = SequenceStatus.FINISHED_LENGTH
    # END SOLUTION


def update_from_output(
    scheduler, out: SchedulerOutputs, sampled: dict[int, list[int]]
) -> StepResult:
    """Apply one step's sampled tokens (the engine's ``update`` part; ``Scheduler.update_from_output`` calls
    it, so it is yours whichever scheduler runs).

    Args:
        scheduler: the engine's scheduler; use ``scheduler.config.max_model_len``,
            ``next(scheduler.seq_ids)`` (a fresh sequence id), ``scheduler.fork_seq(parent, child)`` (the child
            shares the parent's blocks and runs from now on; you append it to ``parent.group.seqs``) and
            ``scheduler.free_finished()`` (frees the blocks of every finished running sequence).
        out: the step's ``SchedulerOutputs``: ``out.scheduled`` (entries with ``.seq``), ``out.ignored`` and
            ``out.exhausted`` (sequences the scheduler ended in this step).
        sampled: ``{seq_id: token ids}`` for each scheduled sequence that sampled: one token, or ``n`` at a
            request's first sample.

    Effects: a sequence given ``k > 1`` tokens keeps the first; for each other one, in order, a child
    forked from it *as it was before this step's token* (``seq.fork(new_id)``) gets that token. Every token
    goes through :func:`update_sequence`. When any sequence finished, ``scheduler.free_finished()`` is called
    once, so its blocks are free before the next step.

    Returns:
        ``StepResult(finished, sampled)``: ``finished`` the requests all of whose sequences are finished
        among those touched in this step (the ignored and exhausted ones of ``out`` first, then those that
        got a token), each once, in the order first touched; ``sampled`` the sequences that got a token,
        each child before its parent.
    """
    # BEGIN SOLUTION ch07.ex8 -- fork the extra samples from the parent as it was, update every token, free once
    # HINT: Why must a child be forked before its parent's first token is appended? Which requests can finish in
    # HINT+ a step without sampling anything?
    # HINT: Map seq ids of out.scheduled to sequences; for tokens[1:] fork a child with next(scheduler.seq_ids),
    # HINT+ append it to the group's seqs, call scheduler.fork_seq, update it; then update the parent with
    # HINT+ tokens[0]. Collect groups of out.ignored, out.exhausted and the updated sequences in a dict keyed by
    # HINT+ request id; free once if anything finished.
    by_id = {entry.seq.seq_id: entry.seq for entry in out.scheduled}
    max_model_len = scheduler.config.max_model_len
    got = []
    for seq_id, tokens in sampled.items():
        seq = by_id[seq_id]
        for token in tokens[1:]:
            child = seq.fork(next(scheduler.seq_ids))
            seq.group.seqs.append(child)
            scheduler.fork_seq(seq, child)
            update_sequence(child, token, max_model_len)
            got.append(child)
        update_sequence(seq, tokens[0], max_model_len)
        got.append(seq)
    touched = {s.group.request_id: s.group for s in [*out.ignored, *out.exhausted, *got]}
    if any(s.is_finished for s in got):
        scheduler.free_finished()
    return StepResult([group for group in touched.values() if group.is_finished], got)
    # END SOLUTION
