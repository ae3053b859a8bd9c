"""Exercise 08: the latency report of a serving run (chapter 08).

A serving engine is judged by what each request sees: how long until its first token, how fast the rest
arrive, how long the whole answer takes, and how many requests meet a service-level objective (SLO). You
write ``percentile`` (ch08.ex1) and ``latency_report`` (ch08.ex2) from the times at which each request's
tokens reached the caller; chapter 08 runs the engine on a workload, records those times, and reads the
report. Before that, ``kv_capacity`` (ch08.ex3) answers the operator's first question: how many requests one
KV budget holds at once, static slots against paged blocks, over a trace of a million requests.

The definitions are those of vLLM's serving benchmark (``vllm/benchmarks/serve.py``, 0.10.2, function
``calculate_metrics``): time to first token (TTFT), time per output token (TPOT, per request: the time after
the first token over the tokens after the first), inter-token latency (ITL, every gap between two
consecutive tokens of a request, pooled over the requests), and goodput (requests that meet every SLO given;
a request with one output token has a TPOT of 0 there). vLLM v1's engine metrics (``vllm/v1/metrics/
stats.py``, 0.10.2) measure TTFT and ITL the same way, from the request's arrival and between its outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestTimes:
    """One request's times in seconds on one clock: ``arrival`` (when the engine got it) and ``tokens``,
    when each of its output tokens reached the caller, in order (non-decreasing, each ``>= arrival``;
    empty when the request produced no token, e.g. it was ignored)."""

    arrival: float
    tokens: tuple[float, ...]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (``0 <= q <= 100``) of ``values`` by linear interpolation between the two
    nearest ranks: sorted ``v``, position ``p = q / 100 * (n - 1)``, ``v[floor(p)]`` plus the fraction
    ``p - floor(p)`` of the step to the next value (``numpy.percentile``'s default, which vLLM's benchmark
    uses). ``values`` is not modified.

    Raises:
        ValueError: ``values`` is empty or ``q`` is outside ``[0, 100]`` (the message gives them).
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    # BEGIN SOLUTION ch08.ex1 -- linear interpolation between the two nearest ranks of the sorted values
    # HINT: Sort a copy. For n values, percentile 0 is the smallest and 100 the largest: which position,
    # HINT+ possibly between two values, is percentile q?
    # HINT: p = q / 100 * (n - 1); low = floor(p); the answer is v[low] + (v[low + 1] - v[low]) * (p - low),
    # HINT+ with low + 1 kept inside the list.
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
    # END SOLUTION


def latency_report(
    requests: list[RequestTimes],
    percentiles: tuple[float, ...] = (50, 99),
    slo_ttft: float | None = None,
    slo_tpot: float | None = None,
) -> dict:
    """What a run's requests saw, in seconds.

    Returns a dict:
        ``"ttft"``, ``"tpot"``, ``"itl"``, ``"e2e"``: each ``{"mean": m, "p50": ..., "p99": ...}`` (one
            ``pNN`` per entry of ``percentiles``, ``NN`` its value as written, e.g. ``p99.9``), or ``None``
            when the metric has no value. TTFT: first token minus arrival; E2E: last token minus arrival;
            TPOT: ``(last - first) / (n - 1)`` for each request of ``n >= 2`` tokens; ITL: every gap
            between consecutive tokens of one request, all requests' gaps in one list. Requests without a
            token count in none of them.
        ``"requests"``: ``len(requests)``; ``"output_tokens"``: all their tokens.
        ``"throughput"``: output tokens per second from the first arrival to the last token (0.0 when no
            token was produced or that span is 0).
        ``"goodput"``: with an SLO given, the fraction of all requests that produced a token and meet
            every SLO given (``ttft <= slo_ttft``, ``tpot <= slo_tpot`` with a TPOT of 0 for a one-token
            request); ``None`` without an SLO (``1.0`` would be a claim nobody measured).

    The inputs are not modified.

    Raises:
        ValueError: ``requests`` is empty.
    """
    if not requests:
        raise ValueError("a latency report needs at least one request")
    # BEGIN SOLUTION ch08.ex2 -- per-request TTFT, TPOT, E2E; pooled ITL; goodput over every request
    # HINT: Collect four lists (only requests with tokens count, TPOT only those with two or more), then
    # HINT+ summarize each; goodput's denominator is every request. Which tokens does TPOT divide by?
    # HINT: ttft = t[0] - arrival, e2e = t[-1] - arrival, tpot = (t[-1] - t[0]) / (n - 1), itl += the gaps
    # HINT+ t[i + 1] - t[i]; summarize with the mean and percentile(values, q) for each q; throughput
    # HINT+ divides the token count by max(last token) - min(arrival).
    ttft, tpot, itl, e2e, good = [], [], [], [], 0
    for request in requests:
        times = request.tokens
        if not times:
            continue
        ttft.append(times[0] - request.arrival)
        e2e.append(times[-1] - request.arrival)
        own_tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        if len(times) > 1:
            tpot.append(own_tpot)
        itl.extend(later - earlier for earlier, later in zip(times, times[1:]))
        good += (slo_ttft is None or ttft[-1] <= slo_ttft) and (
            slo_tpot is None or own_tpot <= slo_tpot
        )

    def summary(values):
        if not values:
            return None
        stats = {"mean": sum(values) / len(values)}
        stats.update({f"p{q:g}": percentile(values, q) for q in percentiles})
        return stats

    tokens = sum(len(r.tokens) for r in requests)
    span = max((r.tokens[-1] for r in requests if r.tokens), default=0.0) - min(
        r.arrival for r in requests
    )
    return {
        "ttft": summary(ttft),
        "tpot": summary(tpot),
        "itl": summary(itl),
        "e2e": summary(e2e),
        "requests": len(requests),
        "output_tokens": tokens,
        "throughput": tokens / span if tokens and span > 0 else 0.0,
        "goodput": None if slo_ttft is None and slo_tpot is None else good / len(requests),
    }
    # END SOLUTION


def kv_capacity(
    final_lens: np.ndarray, block_size: int, budget_blocks: int, static_len: int
) -> dict:
    """How many requests of a trace one KV budget holds at once: static slots against paged blocks.

    Args:
        final_lens: int ``[n]``, each request's final length in tokens (prompt and output), every one
            ``>= 1``, in arrival order.
        block_size: tokens per block.
        budget_blocks: the blocks the KV budget buys; it holds ``budget_blocks * block_size`` token slots.
        static_len: the token slots static pre-allocation reserves for every request (its ``max_seq_len``).

    Returns a dict:
        ``"static"``: int, the requests static pre-allocation holds: the budget's slots over ``static_len``,
            rounded down, whatever their lengths.
        ``"paged"``: int64 ``[m]``. A paged request holds ``ceil(final_len / block_size)`` blocks. For every
            start ``i`` (in order), how many consecutive requests ``i, i+1, ...`` fit in ``budget_blocks``
            together at their final lengths: as many as fit, stopping at the first that does not (0 when
            request ``i`` alone is too large). Only starts whose window the budget closes: the requests
            from ``i`` to the end of the trace need at least ``budget_blocks`` blocks. A window cut short by
            the trace's end measures the trace, not the budget. ``m`` may be 0.
        ``"static_token_share"``: the tokens of all requests over the slots static pre-allocation ties up
            for them (``n * static_len``).
        ``"paged_token_share"``: the tokens of all requests over the slots of all their blocks.

    Cost: a million requests in well under a second, with windows of hundreds of requests: ``O(n log n)``
    with NumPy, no Python loop over the requests. ``final_lens`` is not modified.

    Source: the capacity argument of the PagedAttention paper (Kwon et al., SOSP 2023, §3 and Fig. 2: memory
    reserved for the maximum length vs allocated on demand); the window count is this course's measure.

    Raises:
        ValueError: ``final_lens`` empty, not 1-D or holding a length below 1, or a size below 1 (the
            message gives them).
    """
    final_lens = np.asarray(final_lens)
    if final_lens.ndim != 1 or final_lens.size == 0 or int(final_lens.min()) < 1:
        raise ValueError(
            f"final_lens must be a non-empty 1-D array of lengths >= 1, got shape {final_lens.shape}"
        )
    if min(block_size, budget_blocks, static_len) < 1:
        raise ValueError(
            f"block_size, budget_blocks and static_len must be >= 1, got {block_size}, "
            f"{budget_blocks}, {static_len}"
        )
    # BEGIN SOLUTION ch08.ex3 -- every full window of requests the budget holds, counted at once with NumPy
    # HINT: A window starting at i ends where the blocks of requests i, i+1, ... first exceed the budget. If you knew
    # HINT+ the blocks of all requests before each position, how would you find that end for every i at once,
    # HINT+ without walking the window? Which windows does the trace's end cut short?
    # HINT: Turn the blocks into a running sum that starts at 0. Window i ends at the last entry of that sum
    # HINT+ within cum[i] + budget_blocks: one sorted search finds it for every i (mind which side a tie falls
    # HINT+ on: a window that fills the budget exactly holds its last request). Keep the starts whose window the
    # HINT+ budget closes, not the trace's end.
    blocks = -(-final_lens.astype(np.int64) // block_size)
    cum = np.concatenate(([0], np.cumsum(blocks)))
    ends = cum[:-1] + budget_blocks
    fit = np.searchsorted(cum, ends, side="right") - 1 - np.arange(len(blocks))
    tokens = float(final_lens.sum())
    return {
        "static": budget_blocks * block_size // static_len,
        "paged": fit[ends <= cum[-1]].astype(np.int64),
        "static_token_share": tokens / (len(blocks) * static_len),
        "paged_token_share": tokens / float(cum[-1] * block_size),
    }
    # END SOLUTION
