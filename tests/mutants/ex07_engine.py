"""Planted wrong answers for ``solutions/ex07_engine.py`` (``python -m paged course mutants``)."""

from paged_course.grading.mutants import variant


def _layout(old: str, new: str) -> str:
    return variant("ex07_engine.py", "ch07.ex9", old, new)


_ATTEND = """
    group = num_heads // num_kv_heads
    q = query.float().view(n, num_kv_heads, group, head_dim)
    scores = torch.einsum("nkgd,lkd->kgnl", q, key.float()) * scale
    positions = torch.arange(length - n, length, device=query.device)
    hidden = torch.arange(length, device=query.device)[None, :] > positions[:, None]
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    out = torch.einsum("kgnl,lkd->nkgd", probs, value.float())
    return out.reshape(n, num_heads, head_dim).to(query.dtype)
"""

_FILTER = """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True), order
"""

_DRAW = """
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
"""

_INPUTS = """
    starts = [context - query for context, query in zip(context_lens, query_lens)]
    positions = [p for start, query in zip(starts, query_lens) for p in range(start, start + query)]
    slots = list(slot_mapping(block_tables, starts, query_lens, block_size))
    query_start = [0]
    for query in query_lens:
        query_start.append(query_start[-1] + query)
    sample_rows = [query_start[s + 1] - 1 for s in keep]
    tables = [list(table) + [0] * (width - len(table)) for table in block_tables]
    return StepInputs(positions, slots, sample_rows, query_start, tables)
"""

_UPDATE_SEQ = """
    seq.append_token_id(token)
    if token in seq.group.stop_token_ids:
        seq.status = SequenceStatus.FINISHED_STOPPED
    elif (
        len(seq) - seq.num_prompt_tokens >= seq.group.sampling_params.max_tokens
        or len(seq) >= max_model_len
    ):
        seq.status = SequenceStatus.FINISHED_LENGTH
"""

_UPDATE_STEP = """
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
"""


def _swap(code: str, old: str, new: str) -> str:
    """``code`` with one snippet replaced (the snippet must be there: a stale mutant fails loudly)."""
    assert old in code, old
    return code.replace(old, new)


MUTANTS = {
    "ch07.ex2": {
        "floor instead of ceiling: the last partial block is never read": """
            used = table[: max(1, length // block_size)].long()
            key = key_cache.index_select(0, used).flatten(0, 1)[:length]
            value = value_cache.index_select(0, used).flatten(0, 1)[:length]
            return key, value
        """,
        "logical block ids used as physical ones (no table lookup)": """
            used = torch.arange(-(-length // block_size))
            key = key_cache.index_select(0, used).flatten(0, 1)[:length]
            value = value_cache.index_select(0, used).flatten(0, 1)[:length]
            return key, value
        """,
        "the whole used blocks returned, tail slots included": """
            used = table[: -(-length // block_size)].long()
            key = key_cache.index_select(0, used).flatten(0, 1)
            value = value_cache.index_select(0, used).flatten(0, 1)
            return key, value
        """,
    },
    "ch07.ex3": {
        "causal from position 0: token i sees positions 0..i, not the cached prefix": _swap(
            _ATTEND,
            "torch.arange(length - n, length, device=query.device)",
            "torch.arange(0, n, device=query.device)",
        ),
        "off by one: a token does not see itself": _swap(
            _ATTEND, "[None, :] > positions[:, None]", "[None, :] >= positions[:, None]"
        ),
        "no mask: the chunk sees its own future": _swap(
            _ATTEND, 'scores.masked_fill(hidden, float("-inf"))', "scores"
        ),
        "GQA by interleaving: head h reads KV head h % KVH": _swap(
            _ATTEND,
            "q = query.float().view(n, num_kv_heads, group, head_dim)",
            "q = query.float().view(n, group, num_kv_heads, head_dim).transpose(1, 2)",
        ),
    },
    "ch07.ex4": {
        "top-p before top-k: the nucleus measured over every token": """
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
            probs = sorted_logits.softmax(dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
            probs = probs.masked_fill(rank >= top_k[:, None], 0.0)
            return probs / probs.sum(dim=-1, keepdim=True), order
        """,
        "the token that crosses top_p is dropped": _swap(
            _FILTER,
            "mass_before = probs.cumsum(dim=-1) - probs",
            "mass_before = probs.cumsum(dim=-1)",
        ),
        "top_k off by one (keeps k + 1)": _swap(
            _FILTER, "rank >= top_k[:, None]", "rank > top_k[:, None]"
        ),
        "not renormalized": _swap(
            _FILTER, "return probs / probs.sum(dim=-1, keepdim=True), order", "return probs, order"
        ),
    },
    "ch07.ex5": {
        "temperature multiplies the logits": _swap(
            _DRAW, "logits[rows].float() / temps[:, None]", "logits[rows].float() * temps[:, None]"
        ),
        "one shared generator: per-request generators ignored": _swap(
            _DRAW, "generator=generators[i] or self.generator", "generator=self.generator"
        ),
        "a uniform drawn for greedy rows too": _swap(
            _DRAW,
            "for i in random_rows]\n        )",
            "for i in range(num_rows)]\n        )[rows]",
        ),
        "top_k of -1 passed through (every token but the first removed)": _swap(
            _DRAW, "params[i].top_k if params[i].top_k > 0 else vocab", "params[i].top_k"
        ),
    },
    "ch07.ex6": {
        "positions from 0: a chunk after a prefix hit or a decode restarts at position 0": _swap(
            _INPUTS, "for p in range(start, start + query)]", "for p in range(query)]"
        ),
        "slots of the first tokens of the sequence, not of its new ones": _swap(
            _INPUTS,
            "slot_mapping(block_tables, starts, query_lens, block_size)",
            "slot_mapping(block_tables, [0] * len(starts), query_lens, block_size)",
        ),
        "a sequence samples at its first new token": _swap(
            _INPUTS, "query_start[s + 1] - 1 for s in keep", "query_start[s] for s in keep"
        ),
        "every sequence samples, keep ignored": _swap(
            _INPUTS, "for s in keep]", "for s in range(len(query_lens))]"
        ),
        "the block manager's tables padded in place": _swap(
            _INPUTS,
            "tables = [list(table) + [0] * (width - len(table)) for table in block_tables]",
            "tables = [table.extend([0] * (width - len(table))) or table for table in block_tables]",
        ),
    },
    "ch07.ex7": {
        "one token too many: max_tokens compared with >": _swap(
            _UPDATE_SEQ,
            ">= seq.group.sampling_params.max_tokens",
            "> seq.group.sampling_params.max_tokens",
        ),
        "the stop token is not appended": _swap(
            _UPDATE_SEQ,
            "    seq.append_token_id(token)\n    if token in seq.group.stop_token_ids:\n"
            "        seq.status = SequenceStatus.FINISHED_STOPPED\n    elif",
            "    if token in seq.group.stop_token_ids:\n"
            "        seq.status = SequenceStatus.FINISHED_STOPPED\n        return\n"
            "    seq.append_token_id(token)\n    if",
        ),
        "max_tokens counts the prompt too": _swap(
            _UPDATE_SEQ, "len(seq) - seq.num_prompt_tokens >=", "len(seq) >="
        ),
        "max_model_len never checked": _swap(
            _UPDATE_SEQ, "\n        or len(seq) >= max_model_len", ""
        ),
    },
    "ch07.ex8": {
        "children forked after the parent's token: each child holds two new tokens": _swap(
            _UPDATE_STEP,
            "        for token in tokens[1:]:",
            "        update_sequence(seq, tokens[0], max_model_len)\n        for token in tokens[1:]:",
        ).replace(
            "            got.append(child)\n        update_sequence(seq, tokens[0], max_model_len)\n",
            "            got.append(child)\n",
        ),
        "children never registered with the scheduler (no shared blocks, never scheduled)": _swap(
            _UPDATE_STEP, "            scheduler.fork_seq(seq, child)\n", ""
        ),
        "finished sequences keep their blocks until the next schedule()": _swap(
            _UPDATE_STEP,
            "    if any(s.is_finished for s in got):\n        scheduler.free_finished()\n",
            "",
        ),
        "ignored and exhausted requests never reported": _swap(
            _UPDATE_STEP, "[*out.ignored, *out.exhausted, *got]", "got"
        ),
        "the first sample's extra tokens dropped: n > 1 returns one output": _swap(
            _UPDATE_STEP, "        for token in tokens[1:]:", "        for token in []:"
        ),
    },
    "ch07.ex9": {
        "offsets never checked to increase (a chunk of negative length passes)": _layout(
            "if not 0 <= stop - first <= length <= capacity:",
            "if not stop - first <= length <= capacity:",
        ),
        "a context that fills its table exactly refused": _layout(
            "if not 0 <= stop - first <= length <= capacity:",
            "if not 0 <= stop - first <= length < capacity:",
        ),
        "an empty chunk refused": _layout(
            "if not 0 <= stop - first <= length <= capacity:",
            "if not 0 < stop - first <= length <= capacity:",
        ),
        "a chunk longer than its context passes (only the table is checked)": _layout(
            "if not 0 <= stop - first <= length <= capacity:",
            "if not (0 <= stop - first and length <= capacity):",
        ),
        "only the first chunk checked": _layout(
            "for c, (first, stop, length) in enumerate(spans):",
            "for c, (first, stop, length) in enumerate(spans[:1]):",
        ),
        "the offsets' ends never compared with T": _layout(
            "if starts[0] != 0 or starts[-1] != num_tokens:", "if starts[0] != 0:"
        ),
        "GQA's head ratio not checked": _layout(
            "if num_heads % num_kv_heads:", "if num_heads < num_kv_heads:"
        ),
    },
}
