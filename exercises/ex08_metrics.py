# Generated from solutions/ex08_metrics.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

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
    raise NotImplementedError(
        "ch08.ex1: linear interpolation between the two nearest ranks of the sorted values"
    )


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
    raise NotImplementedError(
        "ch08.ex2: per-request TTFT, TPOT, E2E; pooled ITL; goodput over every request"
    )


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
    raise NotImplementedError(
        "ch08.ex3: every full window of requests the budget holds, counted at once with NumPy"
    )
