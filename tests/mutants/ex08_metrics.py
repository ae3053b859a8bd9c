"""Planted wrong answers for ``solutions/ex08_metrics.py`` (``python -m paged course mutants``)."""

_REPORT = """
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
"""


def _report(old: str, new: str) -> str:
    assert _REPORT.count(old) == 1, old
    return _REPORT.replace(old, new)


MUTANTS = {
    "ch08.ex1": {
        "nearest rank instead of interpolation": """
            ordered = sorted(values)
            return ordered[round(q / 100 * (len(ordered) - 1))]
        """,
        "position q / 100 * n (one rank too far)": """
            ordered = sorted(values)
            position = min(q / 100 * len(ordered), len(ordered) - 1)
            low = math.floor(position)
            high = min(low + 1, len(ordered) - 1)
            return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
        """,
        "sorts the caller's list in place": """
            values.sort()
            position = q / 100 * (len(values) - 1)
            low = math.floor(position)
            high = min(low + 1, len(values) - 1)
            return values[low] + (values[high] - values[low]) * (position - low)
        """,
        "the lower of the two ranks, no interpolation": """
            ordered = sorted(values)
            return ordered[math.floor(q / 100 * (len(ordered) - 1))]
        """,
    },
    "ch08.ex2": {
        "TPOT as the mean of the pooled gaps (the ITL)": _report(
            '"tpot": summary(tpot),', '"tpot": summary(itl),'
        ),
        "TPOT divides by every token, not the tokens after the first": _report(
            "own_tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0",
            "own_tpot = (times[-1] - times[0]) / len(times)",
        ),
        "one-token requests enter the TPOT statistics with 0": _report(
            "    if len(times) > 1:\n        tpot.append(own_tpot)", "    tpot.append(own_tpot)"
        ),
        "goodput over the requests that produced a token only": _report(
            "good / len(requests)", "good / max(1, len(ttft))"
        ),
        "TTFT from the clock's 0, not the arrival": _report(
            "ttft.append(times[0] - request.arrival)", "ttft.append(times[0])"
        ),
        "throughput over the sum of the requests' durations": _report(
            '"throughput": tokens / span if tokens and span > 0 else 0.0,',
            '"throughput": tokens / sum(e2e) if e2e and sum(e2e) > 0 else 0.0,',
        ),
        "the gap from arrival to the first token counted as an ITL": _report(
            "itl.extend(later - earlier for earlier, later in zip(times, times[1:]))",
            "itl.extend(later - earlier for earlier, later in zip((request.arrival, *times), times))",
        ),
    },
}
