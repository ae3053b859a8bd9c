"""Graded: chapter 07, the prompt chunks' attention and the sampler (exercises/ex07_engine.py).

Prefill attention is compared with contiguous causal SDPA (float64) on random chunkings of random
sequences: every chunk position of a packed step, GQA groups 1, 2 and 4, block sizes 4 and 16, shuffled
block tables whose unused entries hold -1 or ids past the pool, NaN in every pool slot no sequence uses.
The sampler is compared token for token with the reference (``paged/worker/sampler.py``) under fixed
seeds, checked statistically (frequencies against the filtered distribution), and at every row position
of a batch for its edge cases (top_k=1, a tiny top_p, greedy rows among sampled ones). Every test also
checks that its inputs come back unchanged.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged.core.sequence import SamplingParams
from paged.worker.sampler import Sampler as ReferenceSampler
from paged.worker.sampler import filter_top_k_top_p as reference_filter

SCALE = 0.41  # not head_dim ** -0.5
HEAD_DIM = 8


def _pool(lengths, num_kv_heads, block_size, seed):
    """Random K/V for each sequence in shuffled blocks of a NaN pool; tables padded with junk ids."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + 2
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(need) + 1
    tables = torch.tensor(
        [[(-1, num_blocks + 3)[(s + j) % 2] for j in range(width)] for s in range(len(lengths))],
        dtype=torch.int32,
    )
    shape = (num_blocks, block_size, num_kv_heads, HEAD_DIM)
    key_cache, value_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    clean = []
    for s, n in enumerate(lengths):
        table = [ids.pop() for _ in range(need[s])]
        tables[s, : need[s]] = torch.tensor(table, dtype=torch.int32)
        k = torch.randn(n, num_kv_heads, HEAD_DIM, generator=gen)
        v = torch.randn(n, num_kv_heads, HEAD_DIM, generator=gen)
        for p in range(n):
            key_cache[table[p // block_size], p % block_size] = k[p]
            value_cache[table[p // block_size], p % block_size] = v[p]
        clean.append((k, v))
    return key_cache, value_cache, tables, clean


def _causal_reference(q, k, v, scale):
    """Contiguous causal SDPA in float64 for a chunk q [n, H, D] that ends a sequence k/v [L, KVH, D]."""
    n, heads, _ = q.shape
    length, kv_heads = k.shape[:2]
    group = heads // kv_heads
    qq = q.double().transpose(0, 1)[None]  # [1, H, n, D]
    kk = k.double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    vv = v.double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    mask = torch.ones(n, length, dtype=torch.bool).tril(diagonal=length - n)
    return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale)[0].transpose(
        0, 1
    )


def _snapshot(*tensors):
    return [t.clone() for t in tensors]


def _unchanged(before, after):
    for b, a in zip(before, after):
        assert torch.equal(b.nan_to_num(7.0), a.nan_to_num(7.0)) and b.dtype == a.dtype, (
            "an input was modified"
        )


# ---------------------------------------------------------------- ch07.ex2: a sequence's K/V


@pytest.mark.exercise("ch07.ex2", points=2)
@pytest.mark.parametrize("block_size", [4, 16])
def test_sequence_kv_reads_each_position_through_the_table(impl, block_size):
    mod = impl("ex07_engine")
    lengths = [1, block_size, block_size + 1, 3 * block_size - 1, 2 * block_size]
    key_cache, value_cache, tables, clean = _pool(lengths, 2, block_size, seed=block_size)
    before = _snapshot(key_cache, value_cache, tables)
    for s, n in enumerate(lengths):
        key, value = mod.sequence_kv(key_cache, value_cache, tables[s], n)
        assert tuple(key.shape) == (n, 2, HEAD_DIM) and tuple(value.shape) == (n, 2, HEAD_DIM), (
            f"sequence {s} of {n} tokens: got {list(key.shape)} and {list(value.shape)}"
        )
        assert torch.equal(key, clean[s][0]) and torch.equal(value, clean[s][1]), (
            f"sequence {s} (length {n}, block size {block_size}): position p must be the K/V its table "
            "puts at position p"
        )
    _unchanged(before, [key_cache, value_cache, tables])


@pytest.mark.exercise("ch07.ex2", points=1)
def test_sequence_kv_of_a_prefix_and_in_half_precision(impl):
    mod = impl("ex07_engine")
    key_cache, value_cache, tables, clean = _pool([13], 1, 4, seed=3)
    key_cache, value_cache = key_cache.half(), value_cache.half()
    for length in (
        5,
        8,
        9,
        13,
    ):  # a sequence read only up to a prefix: the table is longer than needed
        key, value = mod.sequence_kv(key_cache, value_cache, tables[0], length)
        assert key.dtype == torch.float16, (
            f"float16 caches give float16 K/V: the first {length} of 13 tokens came back {key.dtype}"
        )
        assert torch.equal(key, clean[0][0][:length].half()), (
            f"the first {length} of 13 tokens (block size 4, a longer table): key position p must be the "
            "one its table puts at position p"
        )
        assert torch.equal(value, clean[0][1][:length].half()), (
            f"the first {length} of 13 tokens (block size 4, a longer table): value position p must be "
            "the one its table puts at position p"
        )


# ---------------------------------------------------------------- ch07.ex3: one chunk's attention


@pytest.mark.exercise("ch07.ex3", points=2)
@pytest.mark.parametrize("group", [1, 2, 4])
def test_attend_chunk_is_causal_from_the_chunk_offset(impl, group):
    mod = impl("ex07_engine")
    gen = torch.Generator().manual_seed(group)
    kv_heads = 2
    for length, n in [(1, 1), (9, 9), (9, 1), (17, 5), (30, 12)]:
        q = torch.randn(n, kv_heads * group, HEAD_DIM, generator=gen)
        k = torch.randn(length, kv_heads, HEAD_DIM, generator=gen)
        v = torch.randn(length, kv_heads, HEAD_DIM, generator=gen)
        before = _snapshot(q, k, v)
        out = mod.attend_chunk(q, k, v, SCALE)
        want = _causal_reference(q, k, v, SCALE)
        assert out.dtype == q.dtype and tuple(out.shape) == tuple(q.shape), (
            f"chunk of {n} tokens ending a sequence of {length} (group {group}): the output has the "
            f"query's dtype and shape {q.dtype} {list(q.shape)}, got {out.dtype} {list(out.shape)}"
        )
        err = (out.double() - want).abs().max().item()
        assert err < 1e-5, (
            f"chunk of {n} tokens ending a sequence of {length} (group {group}): max error {err:.2e}"
        )
        _unchanged(before, [q, k, v])


@pytest.mark.exercise("ch07.ex3", points=1)
def test_attend_chunk_in_half_precision_with_large_scores(impl):
    mod = impl("ex07_engine")
    gen = torch.Generator().manual_seed(5)
    q = (torch.randn(6, 4, HEAD_DIM, generator=gen) * 8).half()
    k = (torch.randn(20, 2, HEAD_DIM, generator=gen) * 8).half()
    v = torch.randn(20, 2, HEAD_DIM, generator=gen).half()
    out = mod.attend_chunk(q, k, v, 1.0)  # scores in the hundreds: fp16 softmax would overflow
    assert out.dtype == torch.float16 and torch.isfinite(out).all(), (
        f"float16 q/k with scores in the hundreds: the output must be float16 and finite (no fp16 "
        f"overflow in the softmax), got {out.dtype} with {int((~torch.isfinite(out)).sum())} non-finite"
    )
    want = _causal_reference(q.float(), k.float(), v.float(), 1.0)
    assert (out.double() - want).abs().max().item() < 5e-3, (
        f"float16 chunk of 6 tokens over 20 (group 2, scale 1.0): max error "
        f"{(out.double() - want).abs().max().item():.2e} against float64 SDPA, tolerance 5e-3"
    )


# ---------------------------------------------------------------- the part: every chunk of a step


@st.composite
def _steps(draw):
    block_size = draw(st.sampled_from([4, 16]))
    group = draw(st.sampled_from([1, 2, 4]))
    num_chunks = draw(st.integers(1, 4))
    lengths, chunks = [], []
    for _ in range(num_chunks):
        length = draw(st.integers(1, 40))
        lengths.append(length)
        chunks.append(draw(st.integers(1, length)))
    return block_size, group, lengths, chunks, draw(st.integers(0, 2**16))


@pytest.mark.exercise("ch07.ex3", points=2, uses=("ch07.ex2", "ch07.ex9"))
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(step=_steps())
def test_prefill_attention_matches_causal_sdpa_on_random_chunkings(impl, step):
    mod = impl("ex07_engine")
    block_size, group, lengths, chunks, seed = step
    kv_heads = 2
    key_cache, value_cache, tables, clean = _pool(lengths, kv_heads, block_size, seed)
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(sum(chunks), kv_heads * group, HEAD_DIM, generator=gen)
    query_start = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    context_lens = torch.tensor(lengths, dtype=torch.int32)
    before = _snapshot(query, key_cache, value_cache, tables, query_start, context_lens)
    out = mod.prefill_attention(
        query, key_cache, value_cache, tables, query_start, context_lens, max(chunks), SCALE
    )
    _unchanged(before, [query, key_cache, value_cache, tables, query_start, context_lens])
    for c, (length, n) in enumerate(zip(lengths, chunks)):
        first = int(query_start[c])
        want = _causal_reference(query[first : first + n], *clean[c], SCALE)
        err = (out[first : first + n].double() - want).abs().max().item()
        assert err < 1e-5, (
            f"chunk {c} of {len(chunks)} ({n} new tokens, context {length}, block size {block_size}, "
            f"group {group}): max error {err:.2e}"
        )


# ---------------------------------------------------------------- ch07.ex9: the packed layout, checked


def _layout(chunks, contexts, *, width=3, block_size=4, heads=4, kv_heads=2, head_dim=HEAD_DIM):
    """A packed step's tensors: ``chunks[c]`` query rows and ``contexts[c]`` tokens for chunk ``c``."""
    query = torch.zeros(sum(chunks), heads, head_dim)
    cache = torch.zeros(6, block_size, kv_heads, head_dim)
    tables = torch.zeros(len(contexts), width, dtype=torch.int32)
    starts = torch.tensor([0, *torch.tensor(chunks, dtype=torch.int64).cumsum(0).tolist()])
    return [query, cache, cache.clone(), tables, starts.int(), torch.tensor(contexts).int()]


def _spans(mod, args):
    before = _snapshot(*args)
    got = mod.prefill_layout(*args)
    _unchanged(before, args)
    return [tuple(int(x) for x in span) for span in got]


def _refused(mod, args, what):
    before = _snapshot(*args)
    with pytest.raises(ValueError):
        mod.prefill_layout(*args)
        pytest.fail(f"{what}: must raise ValueError")
    _unchanged(before, args)


@pytest.mark.exercise("ch07.ex9", points=2)
def test_layout_spans_of_valid_steps(impl):
    mod = impl("ex07_engine")
    # blocks of 4, tables of 3 blocks: a context of 12 tokens fills its table exactly
    cases = {
        "one whole prompt": ([5], [5]),
        "a chunk after a cached prefix, an empty chunk, a full table": ([3, 0, 12], [7, 4, 12]),
        "three decodes": ([1, 1, 1], [12, 1, 9]),
        "empty chunks first and last": ([0, 2, 0], [3, 2, 12]),
    }
    for what, (chunks, contexts) in cases.items():
        starts = [0]
        for n in chunks:
            starts.append(starts[-1] + n)
        want = [(starts[c], starts[c + 1], contexts[c]) for c in range(len(chunks))]
        got = _spans(mod, _layout(chunks, contexts))
        assert got == want, f"{what}: (first, stop, context) per chunk must be {want}, got {got}"


@pytest.mark.exercise("ch07.ex9", points=2)
@pytest.mark.parametrize("position", range(3), ids=lambda p: f"chunk {p}")
def test_layout_refuses_a_bad_chunk_at_every_position(impl, position):
    mod = impl("ex07_engine")
    good_chunks, good_contexts = [2, 3, 1], [5, 3, 9]
    assert _spans(mod, _layout(good_chunks, good_contexts)) == [
        (0, 2, 5),
        (2, 5, 3),
        (5, 6, 9),
    ], (
        "chunks of 2, 3, 1 rows over contexts 5, 3, 9 are valid: (first, stop, context) per chunk must "
        "be [(0, 2, 5), (2, 5, 3), (5, 6, 9)]"
    )
    for what, chunk, context in (
        ("a chunk longer than its context (its first token before position 0)", 4, 3),
        ("a context longer than its table (3 blocks of 4 tokens)", 1, 13),
    ):
        chunks, contexts = list(good_chunks), list(good_contexts)
        chunks[position], contexts[position] = chunk, context
        _refused(mod, _layout(chunks, contexts), f"chunk {position}: {what}")
    sizes = [2, 3, 1]
    sizes[
        position
    ] = -1  # offsets that step back once: chunk `position` has -1 rows, the others are fine
    args = _layout([max(n, 0) for n in sizes], [9, 9, 9])
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    args[0], args[4] = torch.zeros(starts[-1], 4, HEAD_DIM), torch.tensor(starts, dtype=torch.int32)
    _refused(mod, args, f"offsets {starts}: chunk {position} has a negative length")


@pytest.mark.exercise("ch07.ex9", points=2)
def test_layout_refuses_offsets_that_do_not_partition_the_rows(impl):
    mod = impl("ex07_engine")
    for what, starts in (
        ("offsets that do not start at 0", [1, 3, 6]),
        ("offsets that stop short of T = 6", [0, 3, 5]),
        ("offsets past T = 6", [0, 3, 7]),
    ):
        args = _layout([3, 3], [3, 3])
        args[4] = torch.tensor(starts, dtype=torch.int32)
        _refused(mod, args, what)
    for what, starts, tables in (
        ("one offset too few", [0, 6], 2),
        ("one table row too few", [0, 3, 6], 1),
    ):
        args = _layout([3, 3], [3, 3])
        args[4] = torch.tensor(starts, dtype=torch.int32)
        args[3] = args[3][:tables]
        _refused(mod, args, what)


@pytest.mark.exercise("ch07.ex9", points=2)
def test_layout_refuses_shapes_that_disagree(impl):
    mod = impl("ex07_engine")
    args = _layout([2], [2], heads=6, kv_heads=4)
    _refused(mod, args, "6 query heads over 4 KV heads (not a multiple)")
    args = _layout([2], [2])
    args[2] = torch.zeros(6, 4, 2, HEAD_DIM + 1)
    _refused(mod, args, "a value cache of another head_dim than the key cache")
    args = _layout([2], [2])
    args[0] = torch.zeros(2, 4, HEAD_DIM * 2)
    _refused(mod, args, "a query head_dim that is not the cache's")
    args = _layout([2], [2], heads=8, kv_heads=2)
    assert _spans(mod, args) == [(0, 2, 2)], (
        "8 query heads over 2 KV heads (groups of 4) is valid: one chunk of 2 rows over a context of 2, "
        "span [(0, 2, 2)]"
    )


# ---------------------------------------------------------------- ch07.ex4: top-k and top-p


def _filter_row(logits_row, top_k, top_p):
    """One row, plainly: softmax over the top_k largest, then the smallest prefix reaching top_p."""
    values, order = logits_row.double().sort(descending=True)
    probs = torch.zeros_like(values)
    k = min(top_k, len(values))
    probs[:k] = values[:k].softmax(dim=0)
    kept, mass = torch.zeros_like(probs), 0.0
    for r in range(k):
        if r > 0 and mass >= top_p:
            break
        kept[r] = probs[r]
        mass += probs[r].item()
    return kept / kept.sum(), order


def _rows_with(case, row, num_rows, vocab, gen):
    """A batch with ``case`` = (top_k, top_p) at ``row`` and mild filters elsewhere."""
    logits = torch.randn(num_rows, vocab, generator=gen) * 2
    top_k = torch.full((num_rows,), vocab, dtype=torch.int64)
    top_p = torch.full((num_rows,), 1.0)
    top_k[row], top_p[row] = case
    return logits, top_k, top_p


@pytest.mark.exercise("ch07.ex4", points=2)
@pytest.mark.parametrize("case", [(1, 1.0), (3, 1.0), (50, 1e-6), (50, 0.6), (5, 0.5), (2, 0.999)])
def test_filter_at_every_row_of_a_batch(impl, case):
    mod = impl("ex07_engine")
    gen = torch.Generator().manual_seed(11)
    num_rows, vocab = 4, 50
    for row in range(num_rows):
        logits, top_k, top_p = _rows_with(case, row, num_rows, vocab, gen)
        before = _snapshot(logits, top_k, top_p)
        probs, order = mod.filter_top_k_top_p(logits, top_k, top_p)
        _unchanged(before, [logits, top_k, top_p])
        for s in range(num_rows):
            want, want_order = _filter_row(logits[s], int(top_k[s]), float(top_p[s]))
            assert torch.equal(order[s], want_order), f"row {s}: order must be the descending sort"
            err = (probs[s].double() - want).abs().max().item()
            assert err < 1e-5, (
                f"top_k={int(top_k[s])}, top_p={float(top_p[s])} at row {s} of {num_rows} "
                f"(case at row {row}): max error {err:.2e}"
            )


@pytest.mark.exercise("ch07.ex4", points=1)
def test_filter_top_p_over_what_top_k_left(impl):
    mod = impl("ex07_engine")
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0, 0.0, 0.0, 0.0, 0.0]])
    # over the top 2 the first holds ~0.52 of the mass, so top_p 0.4 keeps it alone; measured over all 8
    # tokens it would hold ~0.34 < 0.4 and the second would be kept too: the order of the filters decides.
    probs, _ = mod.filter_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.4]))
    assert (probs[0] > 0).sum().item() == 1, "top-p measures the mass over the tokens top-k kept"
    probs, _ = mod.filter_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.55]))
    assert (probs[0] > 0).sum().item() == 2, (
        "top_k=2, top_p=0.55: the first token holds ~0.52 of the top 2's mass, under 0.55, so both are "
        f"kept; {(probs[0] > 0).sum().item()} kept"
    )
    assert abs(probs[0].sum().item() - 1) < 1e-6, "the kept probabilities are renormalized"


# ---------------------------------------------------------------- ch07.ex5: the draw


def _mixed_params(num_rows, rng):
    kinds = [
        SamplingParams(),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-6),
        SamplingParams(temperature=2.0, top_k=20, top_p=0.9),
    ]
    return [rng.choice(kinds) for _ in range(num_rows)]


def _generators(num_rows, rng, seed):
    out = []
    for i in range(num_rows):
        if rng.random() < 0.5:
            out.append(torch.Generator().manual_seed(seed * 100 + i))
        else:
            out.append(None)
    return out


@pytest.mark.exercise("ch07.ex5", points=3, uses=("ch07.ex4",))
@pytest.mark.parametrize("seed", range(6))
def test_sampler_equals_the_reference_token_for_token(impl, seed):
    mod = impl("ex07_engine")
    rng = random.Random(seed)
    vocab, num_rows = 64, 7
    yours, ref = mod.Sampler(seed), ReferenceSampler(seed)
    mine_gens, ref_gens = _generators(num_rows, rng, seed), None
    ref_gens = [
        None if g is None else torch.Generator().set_state(g.get_state()) for g in mine_gens
    ]
    for step in range(12):
        logits = torch.randn(
            num_rows, vocab, generator=torch.Generator().manual_seed(seed * 50 + step)
        )
        params = _mixed_params(num_rows, rng)
        before = logits.clone()
        got = yours.sample(logits, params, mine_gens)
        want = ref.sample(logits, params, ref_gens)
        assert torch.equal(logits, before), "the logits were modified"
        assert got == want, (
            f"seed {seed}, step {step}: your tokens {got}, the reference's {want} for params "
            f"{[(p.temperature, p.top_k, p.top_p) for p in params]}"
        )


@pytest.mark.exercise("ch07.ex5", points=1, uses=("ch07.ex4",))
def test_sampler_edge_cases_at_every_row(impl):
    mod = impl("ex07_engine")
    vocab, num_rows = 40, 5
    logits = torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(1)) * 3
    top = logits.argmax(dim=-1).tolist()
    for case in (
        SamplingParams(),
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-7),
    ):
        for row in range(num_rows):
            params = [SamplingParams(temperature=1.0)] * num_rows
            params[row] = case
            for draw in range(5):
                tokens = mod.Sampler(draw).sample(logits, params)
                assert len(tokens) == num_rows and all(isinstance(t, int) for t in tokens), (
                    f"sample() returns one Python int per row: {num_rows} rows, got {tokens!r}"
                )
                assert tokens[row] == top[row], (
                    f"{case} at row {row} of {num_rows} must give the argmax {top[row]}, got {tokens[row]}"
                )
    with pytest.raises(ValueError):
        mod.Sampler().sample(logits, [SamplingParams()] * (num_rows - 1))


@pytest.mark.exercise("ch07.ex5", points=1, uses=("ch07.ex4",))
def test_a_seeded_row_does_not_depend_on_its_batch(impl):
    mod = impl("ex07_engine")
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=1.0, seed=5)] * 4
    alone = mod.Sampler(0).sample(logits[2:3], params[:1], [torch.Generator().manual_seed(5)])
    others = [None, torch.Generator().manual_seed(9), torch.Generator().manual_seed(5), None]
    batched = mod.Sampler(123).sample(logits, params, others)
    assert batched[2] == alone[0], "row 2's own generator decides its token, whatever the batch"


@pytest.mark.exercise("ch07.ex5", points=2, uses=("ch07.ex4",))
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.7),
    ],
)
def test_sampler_frequencies_follow_the_filtered_distribution(impl, params):
    mod = impl("ex07_engine")
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5])
    vocab, draws, rows = len(logits), 4000, 50
    want, order = reference_filter(
        (logits / params.temperature)[None],
        torch.tensor([params.top_k if params.top_k > 0 else vocab]),
        torch.tensor([params.top_p]),
    )
    expected = torch.zeros(vocab, dtype=torch.float64)
    expected[order[0]] = want[0].double()
    sampler = mod.Sampler(7)
    counts = torch.zeros(vocab, dtype=torch.float64)
    batch = logits.repeat(rows, 1)
    for _ in range(draws // rows):
        for t in sampler.sample(batch, [params] * rows):
            counts[t] += 1
    assert counts[expected == 0].sum() == 0, (
        f"tokens the filters remove were drawn: {counts.tolist()}"
    )
    kept = expected > 0
    chi2 = (((counts - draws * expected) ** 2) / (draws * expected))[kept].sum().item()
    dof = int(kept.sum()) - 1
    # fixed seed: deterministic; 99.9% quantile of chi-square is below dof + 4.5 * sqrt(2 dof) + 6 here
    bound = dof + 4.5 * math.sqrt(2 * dof) + 6
    assert chi2 < bound, (
        f"{params}: counts {counts.tolist()} against expected {(draws * expected).tolist()} "
        f"(chi-square {chi2:.1f}, bound {bound:.1f})"
    )
