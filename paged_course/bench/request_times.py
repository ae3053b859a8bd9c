"""When each request's tokens came out of the engine, and the latency report made from those times.

``record_request_times`` runs prompts through an ``LLM``'s engine step by step (every request added at
once; ``max_num_seqs`` decides how many run together, the rest queue) and returns, per request, its arrival
and the time of each of its output tokens, read where the engine itself takes its TTFT / ITL times
(``EngineStats.on_tokens``, ``paged/engine/stats.py``): one clock, ``time.perf_counter``. ``latency_report``
is the reference of chapter 08's exercise (``exercises/ex08_metrics.py`` states its contract), after vLLM's
serving benchmark (``vllm/benchmarks/serve.py``, 0.10.2).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from paged.engine.stats import percentile


@dataclass(frozen=True)
class RequestTimes:
    """One request: ``arrival`` and the times of its output ``tokens`` (seconds, one clock)."""

    arrival: float
    tokens: tuple[float, ...]


def record_request_times(llm, prompts: list[list[int]], params) -> list[RequestTimes]:
    """Run ``prompts`` (token-id lists) with ``params`` (one ``SamplingParams`` per prompt) through
    ``llm.engine`` until all finish; one ``RequestTimes`` per prompt, in order (the first sequence of each
    request). The engine's own counters and latencies are kept as ``generate`` keeps them."""
    engine, times = llm.engine, {}
    stats_on_tokens = engine.metrics.on_tokens

    def on_tokens(seqs, now):
        stats_on_tokens(seqs, now)
        for seq in seqs:
            if seq is seq.group.seqs[0]:
                times[seq.group.request_id].append(now)

    engine.metrics.on_tokens = on_tokens  # this engine only, until the run ends
    try:
        engine.metrics.new_window()
        arrivals = {}
        for prompt, sp in zip(prompts, params):
            arrival = time.perf_counter()
            request_id = engine.add_request(prompt, sp)
            arrivals[request_id], times[request_id] = arrival, []
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        del engine.metrics.on_tokens
    return [RequestTimes(arrivals[r], tuple(times[r])) for r in arrivals]


def latency_report(
    requests: list[RequestTimes],
    percentiles: tuple[float, ...] = (50, 99),
    slo_ttft: float | None = None,
    slo_tpot: float | None = None,
) -> dict:
    """TTFT, TPOT, ITL and E2E (mean and percentiles), throughput and goodput of ``requests``: the
    contract of ``latency_report`` in ``exercises/ex08_metrics.py``."""
    if not requests:
        raise ValueError("a latency report needs at least one request")
    with_tokens = [r for r in requests if r.tokens]

    def per_token(r):
        return (r.tokens[-1] - r.tokens[0]) / (len(r.tokens) - 1) if len(r.tokens) > 1 else 0.0

    def summary(values):
        if not values:
            return None
        return {"mean": sum(values) / len(values)} | {
            f"p{q:g}": percentile(values, q / 100) for q in percentiles
        }

    good = sum(
        (slo_ttft is None or r.tokens[0] - r.arrival <= slo_ttft)
        and (slo_tpot is None or per_token(r) <= slo_tpot)
        for r in with_tokens
    )
    tokens = sum(len(r.tokens) for r in requests)
    span = max((r.tokens[-1] for r in with_tokens), default=0.0) - min(r.arrival for r in requests)
    return {
        "ttft": summary([r.tokens[0] - r.arrival for r in with_tokens]),
        "tpot": summary([per_token(r) for r in with_tokens if len(r.tokens) > 1]),
        "itl": summary([b - a for r in with_tokens for a, b in zip(r.tokens, r.tokens[1:])]),
        "e2e": summary([r.tokens[-1] - r.arrival for r in with_tokens]),
        "requests": len(requests),
        "output_tokens": tokens,
        "throughput": tokens / span if tokens and span > 0 else 0.0,
        "goodput": None if slo_ttft is None and slo_tpot is None else good / len(requests),
    }
