"""Sampler: greedy, temperature, top-k, top-p support sets and per-request seeded reproducibility."""

from __future__ import annotations

import pytest
import torch

from paged.core.sequence import SamplingParams
from paged.worker.sampler import Sampler, filter_top_k_top_p, make_generator


def _logits(rows=4, vocab=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=gen)


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9], [5.0, -5.0, 0.0, 4.0]])
    assert Sampler(0).sample(logits, [SamplingParams(), SamplingParams()]) == [1, 0], (
        "greedy must take the argmax"
    )


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = _logits(8, 50)
    params = [SamplingParams(temperature=1.5, top_k=1)] * 4 + [
        SamplingParams(temperature=1.5, top_p=1e-6)
    ] * 4
    assert Sampler(1).sample(logits, params) == logits.argmax(-1).tolist(), (
        "top_k=1 and top_p -> 0 keep only the most likely token"
    )


def test_filter_keeps_exact_support():
    # probabilities 0.5, 0.25, 0.125, 0.125 (log-space logits)
    logits = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25]]))
    probs, order = filter_top_k_top_p(logits, torch.tensor([4]), torch.tensor([0.7]))
    kept = sorted(order[0][probs[0] > 0].tolist())
    assert kept == [1, 3], f"top_p=0.7 must keep tokens 1 (0.5) and 3 (0.25), kept {kept}"
    assert probs[0, :2].tolist() == pytest.approx([2 / 3, 1 / 3]), "kept mass must be renormalized"
    probs, order = filter_top_k_top_p(logits, torch.tensor([3]), torch.tensor([1.0]))
    kept = set(order[0][probs[0] > 0].tolist())
    assert len(kept) == 3 and {1, 3} <= kept, f"top_k=3 keeps the 3 most likely tokens, kept {kept}"


def test_samples_stay_in_top_k_support():
    logits = _logits(1, 40, seed=3).repeat(200, 1)
    allowed = set(logits[0].topk(5).indices.tolist())
    tokens = Sampler(7).sample(logits, [SamplingParams(temperature=2.0, top_k=5)] * 200)
    assert set(tokens) <= allowed, f"tokens {set(tokens) - allowed} are outside the top-5 set"
    assert len(set(tokens)) >= 3, "temperature 2 over 5 tokens should visit several of them"


def test_sampling_frequencies_follow_probabilities():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().repeat(3000, 1)
    tokens = torch.tensor(Sampler(11).sample(logits, [SamplingParams(temperature=1.0)] * 3000))
    freq = torch.bincount(tokens, minlength=3).float() / 3000
    assert torch.allclose(freq, probs, atol=0.03), f"empirical {freq.tolist()} vs {probs.tolist()}"


def test_seeded_rows_reproducible_whatever_the_batch():
    logits = _logits(6, 64, seed=5)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    runs = []
    for batch_seed, others in ((0, 5), (99, 2)):
        sampler = Sampler(batch_seed)
        gens = [make_generator(1234)] + [None] * others
        params = [seeded] + [SamplingParams(temperature=1.0)] * others
        runs.append(sampler.sample(logits[: others + 1], params, gens)[0])
    assert runs[0] == runs[1], "a seeded request must draw the same token in any batch"
    gen_a, gen_b = make_generator(42), make_generator(42)
    seq_a = [Sampler(0).sample(logits[:1], [seeded], [gen_a])[0] for _ in range(10)]
    seq_b = [Sampler(9).sample(logits[:1], [seeded], [gen_b])[0] for _ in range(10)]
    assert seq_a == seq_b, "same seed, same token stream"


def test_row_count_mismatch_raises():
    with pytest.raises(ValueError, match="2 logit rows"):
        Sampler().sample(_logits(2), [SamplingParams()])
