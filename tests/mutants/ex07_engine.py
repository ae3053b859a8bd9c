"""Planted wrong answers for ``solutions/ex07_engine.py`` (``python -m paged course mutants``)."""

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
}
