"""Planted wrong answers for ``solutions/ex08_metrics.py`` (``python -m paged course mutants``)."""

from paged_course.grading.mutants import variant


def _report(old: str, new: str) -> str:
    return variant("ex08_metrics.py", "ch08.ex2", old, new)


def _capacity(old: str, new: str) -> str:
    return variant("ex08_metrics.py", "ch08.ex3", old, new)


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
    "ch08.ex3": {
        "a window that fills the budget exactly loses its last request (side='left')": _capacity(
            'side="right"', 'side="left"'
        ),
        "windows the trace's end cuts short counted too": _capacity(
            '"paged": fit[ends <= cum[-1]].astype(np.int64),', '"paged": fit.astype(np.int64),'
        ),
        "only windows that run past the budget (an exact fill to the trace's end dropped)": _capacity(
            "fit[ends <= cum[-1]]", "fit[ends < cum[-1]]"
        ),
        "blocks rounded down (a partial last block holds nothing)": _capacity(
            "blocks = -(-final_lens.astype(np.int64) // block_size)",
            "blocks = final_lens.astype(np.int64) // block_size",
        ),
        "paged share over the budget's slots, not the slots of the requests' blocks": _capacity(
            '"paged_token_share": tokens / float(cum[-1] * block_size),',
            '"paged_token_share": tokens / float(budget_blocks * block_size),',
        ),
        "a Python loop over the starts, each window summed again": """
            blocks = -(-final_lens.astype(np.int64) // block_size)
            fit = []
            for i in range(len(blocks)):
                if blocks[i:].sum() < budget_blocks:
                    continue
                used = count = 0
                for b in blocks[i:]:
                    if used + b > budget_blocks:
                        break
                    used, count = used + b, count + 1
                fit.append(count)
            tokens = float(final_lens.sum())
            return {
                "static": budget_blocks * block_size // static_len,
                "paged": np.array(fit, dtype=np.int64),
                "static_token_share": tokens / (len(blocks) * static_len),
                "paged_token_share": tokens / float(blocks.sum() * block_size),
            }
        """,
    },
}
