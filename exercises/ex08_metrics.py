# Generated from solutions/ex08_metrics.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

"""Exercise 08: the latency report of a serving run (chapter 08).

A serving engine is judged by what each request sees: how long until its first token, how fast the rest
arrive, how long the whole answer takes, and how many requests meet a service-level objective (SLO). You
write ``percentile`` (ch08.ex1) and ``latency_report`` (ch08.ex2) from the times at which each request's
tokens reached the caller; chapter 08 runs the engine on a workload, records those times, and reads the
report.

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
