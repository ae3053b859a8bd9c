"""Graded: chapter 08, the latency report (exercises/ex08_metrics.py).

ch08.ex1 (``percentile``) is compared with ``numpy.percentile`` (linear interpolation) on lists of 1 to 200
values, shuffled, with ties, at percentiles from 0 to 100 (fractional ones included). ch08.ex2
(``latency_report``) is compared with a plain reference written here, on hand-made runs (a request without a
token and one with a single token at every position, a run where the mean TPOT and the mean ITL differ) and
on random runs; goodput with each SLO alone and both.
"""

from __future__ import annotations

import random

import numpy as np
import pytest


def _times(ex, arrival, tokens):
    return ex.RequestTimes(arrival, tuple(tokens))


# ============================================================ ch08.ex1: percentile


@pytest.mark.exercise("ch08.ex1", points=2)
@pytest.mark.parametrize("n", [1, 2, 5, 37, 200], ids=lambda n: f"{n} values")
def test_percentile_equals_numpys_linear_interpolation(impl, n):
    ex = impl("ex08_metrics")
    rng = random.Random(n)
    values = [round(rng.expovariate(3.0), 2) for _ in range(n)]  # rounded: ties
    kept = list(values)
    for q in (0, 1, 10, 25, 50, 62.5, 90, 99, 99.9, 100):
        got = ex.percentile(values, q)
        expected = float(np.percentile(values, q))
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), (
            f"percentile of {n} values at q={q}: got {got}, linear interpolation gives {expected}"
        )
    assert values == kept, "percentile must not sort or change the caller's list"


@pytest.mark.exercise("ch08.ex1", points=2)
def test_percentile_between_two_values(impl):
    ex = impl("ex08_metrics")
    values = [40.0, 10.0, 30.0, 20.0]  # sorted 10, 20, 30, 40: positions 0..3
    cases = {0: 10.0, 100: 40.0, 50: 25.0, 25: 17.5, 90: 37.0, 99: 39.7}
    for q, expected in cases.items():
        got = ex.percentile(values, q)
        assert got == pytest.approx(expected), (
            f"{values} at q={q}: position {q / 100 * 3:g} of the sorted values gives {expected}, got {got}"
        )


# ============================================================ ch08.ex2: latency_report


def _reference(requests, percentiles=(50, 99), slo_ttft=None, slo_tpot=None):
    def summary(values):
        if not values:
            return None
        return {"mean": float(np.mean(values))} | {
            f"p{q:g}": float(np.percentile(values, q)) for q in percentiles
        }

    with_tokens = [r for r in requests if r.tokens]
    ttft = [r.tokens[0] - r.arrival for r in with_tokens]
    e2e = [r.tokens[-1] - r.arrival for r in with_tokens]
    tpot = [
        (r.tokens[-1] - r.tokens[0]) / (len(r.tokens) - 1) for r in with_tokens if len(r.tokens) > 1
    ]
    itl = [b - a for r in with_tokens for a, b in zip(r.tokens, r.tokens[1:])]
    tokens = sum(len(r.tokens) for r in requests)
    span = max((r.tokens[-1] for r in with_tokens), default=0.0) - min(r.arrival for r in requests)
    good = None
    if slo_ttft is not None or slo_tpot is not None:
        ok = 0
        for r in with_tokens:
            own = (r.tokens[-1] - r.tokens[0]) / (len(r.tokens) - 1) if len(r.tokens) > 1 else 0.0
            ok += (slo_ttft is None or r.tokens[0] - r.arrival <= slo_ttft) and (
                slo_tpot is None or own <= slo_tpot
            )
        good = ok / len(requests)
    return {
        "ttft": summary(ttft),
        "tpot": summary(tpot),
        "itl": summary(itl),
        "e2e": summary(e2e),
        "requests": len(requests),
        "output_tokens": tokens,
        "throughput": tokens / span if tokens and span > 0 else 0.0,
        "goodput": good,
    }


def _compare(got, expected, what):
    assert isinstance(got, dict) and set(got) == set(expected), (
        f"{what}: the report's keys must be {sorted(expected)}, got {sorted(got) if isinstance(got, dict) else got}"
    )
    for key, want in expected.items():
        have = got[key]
        if isinstance(want, dict):
            assert isinstance(have, dict) and set(have) == set(want), (
                f"{what}: {key} must be {sorted(want)}, got {have}"
            )
            for stat, value in want.items():
                assert have[stat] == pytest.approx(value, rel=1e-9, abs=1e-12), (
                    f"{what}: {key} {stat} is {have[stat]}, expected {value}"
                )
        elif want is None:
            assert have is None, f"{what}: {key} must be None, got {have}"
        else:
            assert have == pytest.approx(want, rel=1e-9, abs=1e-12), (
                f"{what}: {key} is {have}, expected {want}"
            )


@pytest.mark.exercise("ch08.ex2", points=3)
def test_a_small_run_by_hand(impl):
    # A: arrives at 0, tokens at 1, 2, 3, 7; B: arrives at 1, one token at 4; C: arrives at 2, no token.
    ex = impl("ex08_metrics")
    run = [_times(ex, 0.0, [1, 2, 3, 7]), _times(ex, 1.0, [4]), _times(ex, 2.0, [])]
    report = ex.latency_report(run)
    assert report["ttft"]["mean"] == pytest.approx(2.0), "TTFT: A 1 s, B 3 s (C has no token)"
    assert report["e2e"]["mean"] == pytest.approx(5.0), "E2E: A 7 s, B 3 s"
    assert report["tpot"] == {"mean": 2.0, "p50": 2.0, "p99": 2.0}, (
        f"TPOT: A only, (7 - 1) / 3 = 2 s per token after the first; got {report['tpot']}"
    )
    assert report["itl"]["mean"] == pytest.approx(2.0) and report["itl"]["p50"] == pytest.approx(
        1.0
    ), f"ITL: A's gaps 1, 1, 4; got {report['itl']}"
    assert report["requests"] == 3 and report["output_tokens"] == 5, (
        "3 requests (C without a token counts too), 5 output tokens (A 4, B 1)"
    )
    assert report["throughput"] == pytest.approx(5 / 7), (
        "5 tokens from the first arrival (0) to the last token (7)"
    )
    assert report["goodput"] is None, "no SLO given: goodput is None"
    _compare(report, _reference(run), "the run by hand")


@pytest.mark.exercise("ch08.ex2", points=2)
def test_tpot_is_per_request_not_the_mean_gap(impl):
    # A long request with short gaps and a short one with a long gap: the mean of the per-request TPOTs
    # weighs each request once; the mean ITL weighs each gap once.
    ex = impl("ex08_metrics")
    run = [_times(ex, 0.0, [0.5 + 0.1 * k for k in range(11)]), _times(ex, 0.0, [0.5, 2.5])]
    report = ex.latency_report(run)
    assert report["tpot"]["mean"] == pytest.approx((0.1 + 2.0) / 2), (
        f"mean TPOT over the 2 requests is 1.05 s; got {report['tpot']['mean']} (the mean ITL is "
        f"{(10 * 0.1 + 2.0) / 11:.3f})"
    )
    assert report["itl"]["mean"] == pytest.approx((10 * 0.1 + 2.0) / 11), (
        "mean ITL weighs each of the 11 gaps once: (10 * 0.1 + 2.0) / 11 s"
    )


@pytest.mark.exercise("ch08.ex2", points=2)
@pytest.mark.parametrize("position", [0, 1, 2, 3], ids=lambda p: f"rotated by {p}")
def test_a_request_without_tokens_and_one_with_a_single_token_at_every_position(impl, position):
    ex = impl("ex08_metrics")
    run = [
        _times(ex, 0.0, [0.3, 0.4, 0.6]),
        _times(ex, 0.1, [0.9, 1.0]),
        _times(ex, 0.2, []),
        _times(ex, 0.3, [0.5]),
    ]
    run = run[position:] + run[:position]
    kept = list(run)
    for slo in ({}, {"slo_ttft": 0.35}, {"slo_tpot": 0.12}, {"slo_ttft": 0.35, "slo_tpot": 0.12}):
        report = ex.latency_report(run, percentiles=(50, 90, 99.9), **slo)
        _compare(
            report,
            _reference(run, (50, 90, 99.9), **slo),
            f"rotation {position}, {slo or 'no SLO'}",
        )
    assert run == kept, "latency_report must not change the list of requests"


@pytest.mark.exercise("ch08.ex2", points=2)
def test_goodput_counts_every_request(impl):
    ex = impl("ex08_metrics")
    run = [
        _times(ex, 0.0, [0.2, 0.3]),
        _times(ex, 0.0, [0.2]),
        _times(ex, 0.0, [2.0, 2.5]),
        _times(ex, 0.0, []),
    ]
    assert ex.latency_report(run, slo_ttft=1.0)["goodput"] == pytest.approx(2 / 4), (
        "TTFT <= 1 s: the first two of 4 requests (the one without a token fails every SLO)"
    )
    assert ex.latency_report(run, slo_tpot=0.2)["goodput"] == pytest.approx(2 / 4), (
        "TPOT <= 0.2 s: the first (0.1 s) and the one-token request (TPOT 0), of 4"
    )
    assert ex.latency_report(run, slo_ttft=1.0, slo_tpot=0.05)["goodput"] == pytest.approx(1 / 4), (
        "both SLOs: only the one-token request meets TTFT <= 1 s and TPOT <= 0.05 s"
    )


@pytest.mark.exercise("ch08.ex2", points=1)
def test_runs_where_a_metric_has_no_value(impl):
    ex = impl("ex08_metrics")
    singles = [_times(ex, 0.0, [1.0]), _times(ex, 0.5, [1.0])]
    _compare(ex.latency_report(singles), _reference(singles), "one token each (no TPOT, no ITL)")
    nothing = [_times(ex, 0.0, []), _times(ex, 1.0, [])]
    _compare(
        ex.latency_report(nothing, slo_ttft=1.0),
        _reference(nothing, slo_ttft=1.0),
        "no token at all",
    )


@pytest.mark.exercise("ch08.ex2", points=2)
@pytest.mark.parametrize("seed", range(3), ids=lambda s: f"seed {s}")
def test_random_runs(impl, seed):
    ex = impl("ex08_metrics")
    rng = random.Random(seed)
    run = []
    for _ in range(rng.randint(5, 40)):
        arrival = rng.uniform(0, 5)
        t, tokens = arrival + rng.expovariate(2.0), []
        for _ in range(rng.choice([0, 1, 2, 3, 10, 30])):
            tokens.append(t)
            t += rng.choice([0.0, rng.expovariate(20.0)])  # 0: two tokens in one step
        run.append(_times(ex, arrival, tokens))
    slo = {"slo_ttft": 0.5, "slo_tpot": 0.04}
    _compare(ex.latency_report(run, **slo), _reference(run, **slo), f"random run {seed}")


# ============================================================ ch08.ex3: kv_capacity


def _windows(final_lens, block_size, budget_blocks):
    """Plainly: from every start add requests until the next one does not fit; keep budget-closed windows."""
    blocks = [-(-int(n) // block_size) for n in final_lens]
    out = []
    for i in range(len(blocks)):
        if sum(blocks[i:]) < budget_blocks:
            continue
        used = count = 0
        for b in blocks[i:]:
            if used + b > budget_blocks:
                break
            used, count = used + b, count + 1
        out.append(count)
    return out


def _capacity_checked(ex, lens, block_size, budget_blocks, static_len, what):
    lens = np.asarray(lens)
    kept = lens.copy()
    got = ex.kv_capacity(lens, block_size, budget_blocks, static_len)
    assert np.array_equal(lens, kept) and lens.dtype == kept.dtype, (
        f"{what}: kv_capacity must not change final_lens"
    )
    assert isinstance(got, dict) and set(got) == {
        "static",
        "paged",
        "static_token_share",
        "paged_token_share",
    }, f"{what}: the keys must be static, paged, static_token_share, paged_token_share; got {got}"
    want = _windows(lens, block_size, budget_blocks)
    paged = np.asarray(got["paged"])
    assert paged.dtype == np.int64 and paged.tolist() == want, (
        f"{what}: requests at once from each start whose window the budget closes: got "
        f"{paged.tolist()[:12]} ({paged.dtype}), expected {want[:12]} ({len(want)} windows)"
    )
    blocks = -(-lens // block_size)
    assert int(got["static"]) == budget_blocks * block_size // static_len, (
        f"{what}: static holds {budget_blocks * block_size // static_len}, got {got['static']}"
    )
    assert got["static_token_share"] == pytest.approx(lens.sum() / (len(lens) * static_len)), (
        f"{what}: static token share is the tokens over {static_len} reserved slots per request"
    )
    assert got["paged_token_share"] == pytest.approx(lens.sum() / (blocks.sum() * block_size)), (
        f"{what}: paged token share is the tokens over the slots of every request's blocks"
    )
    return got


@pytest.mark.exercise("ch08.ex3", points=2)
def test_capacity_by_hand(impl):
    # blocks of 4 tokens; lengths 5, 3, 8, 1, 12 hold 2, 1, 2, 1, 3 blocks; a budget of 4 blocks (16 slots).
    ex = impl("ex08_metrics")
    got = _capacity_checked(ex, [5, 3, 8, 1, 12], 4, 4, 10, "by hand")
    assert got["paged"].tolist() == [2, 3, 2, 2], (
        "from request 0: 2 + 1 blocks, the next 2 would make 5; from 1: 1 + 2 + 1 fill the 4 blocks "
        "exactly (a request that fits exactly counts); from 3: 1 + 3, exactly to the trace's end (its "
        "blocks from there reach the budget, so the budget closes it); from 4: 3 blocks to the end, less "
        "than the budget (cut short by the trace, not counted)"
    )
    assert got["static"] == 1 and got["static_token_share"] == pytest.approx(29 / 50), (
        "static: 16 slots hold 1 request of 10; 29 tokens over 5 x 10 reserved slots"
    )
    assert got["paged_token_share"] == pytest.approx(29 / 36), (
        "paged: 29 tokens over the 9 blocks x 4 slots they take"
    )


@pytest.mark.exercise("ch08.ex3", points=2)
@pytest.mark.parametrize("position", range(5), ids=lambda p: f"at position {p}")
def test_a_request_larger_than_the_budget_at_every_position(impl, position):
    ex = impl("ex08_metrics")
    lens = [4, 4, 4, 4, 4]
    lens[position] = (
        21  # 6 blocks of 4 in a budget of 5 blocks: it fits with nobody, alone included
    )
    got = _capacity_checked(ex, lens, 4, 5, 8, f"the 21-token request at position {position}")
    assert len(got["paged"]) == position + 1 and got["paged"][position] == 0, (
        "the windows up to the large request reach the budget, those after it do not (4 blocks left); "
        f"the one that starts at the request larger than the budget holds 0: got {got['paged'].tolist()}"
    )


@pytest.mark.exercise("ch08.ex3", points=2)
@pytest.mark.parametrize("block_size", [1, 3, 16], ids=lambda b: f"block {b}")
def test_capacity_on_random_traces(impl, block_size):
    ex = impl("ex08_metrics")
    rng = np.random.default_rng(block_size)
    for trial in range(20):
        n = int(rng.integers(1, 40))
        lens = rng.integers(1, 60, size=n)
        budget = int(rng.integers(1, 40))
        _capacity_checked(
            ex, lens, block_size, budget, int(rng.integers(1, 80)), f"random trace {trial}"
        )


@pytest.mark.exercise("ch08.ex3", points=1)
def test_a_trace_the_budget_holds_whole_has_no_window(impl):
    ex = impl("ex08_metrics")
    got = _capacity_checked(ex, [3, 3, 3], 4, 10, 4, "3 requests of 1 block, a budget of 10 blocks")
    assert len(got["paged"]) == 0, "every window runs off the trace's end: none is counted"


@pytest.mark.exercise("ch08.ex3", points=2)
def test_a_million_requests_at_once(impl):
    import time

    ex = impl("ex08_metrics")
    rng = np.random.default_rng(0)
    lens = np.minimum(rng.lognormal(6.0, 0.8, size=1_000_000).astype(np.int64) + 1, 4096)
    start = time.perf_counter()
    got = ex.kv_capacity(lens, 16, 7000, 4096)
    seconds = time.perf_counter() - start
    assert seconds < 3.0, (
        f"a million requests (windows of about 170) took {seconds:.1f} s: count every window at once "
        "with NumPy, O(n log n), no Python loop over the requests"
    )
    blocks = -(-lens // 16)
    cum = np.concatenate(([0], np.cumsum(blocks)))
    for i in (0, 1, 123_456, 999_000 - 3000):  # spot checks against the plain count
        count, used = 0, 0
        while used + blocks[i + count] <= 7000:
            used, count = used + blocks[i + count], count + 1
        assert got["paged"][i] == count, f"start {i}: {count} requests fit, got {got['paged'][i]}"
    want = int(np.sum(cum[:-1] + 7000 <= cum[-1]))
    assert len(got["paged"]) == want, (
        f"one count per start whose window the budget of 7000 blocks closes: {want} starts"
    )
