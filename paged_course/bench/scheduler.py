"""``python -m paged bench scheduler``: cost of one ``schedule()`` call at 64, 256 and 1024 running requests.

Each size admits ``n`` requests (32-token prompts, block size 16) in one step, then times decode steps:
``schedule()`` alone is timed; a fake model appends one token per sequence between calls (not timed).
Every 16 steps each request crosses into a new block, so the timed calls include block allocation.
What to look for: the cost grows at most linearly with the number of running requests (the time
per request against the 64-request run stays near 1). Reported: Python function calls per request per step (cProfile:
the amount of work, exact and free of timing noise), the fastest call and the median.

Measuring on a shared machine: a call at 1024 requests takes milliseconds, one at 64 a few hundred
microseconds, so other processes interrupt the long calls far more often, and a minimum over a few
dozen calls of one run can still be a disturbed one (a single run on a busy machine can report
1.7-3.1x per request at 1024, where an idle machine gives about 1.0-1.1x with the same code). So the sizes are run in
several interleaved rounds and each keeps its fastest call over all rounds. The work per request is
constant (the same calls per request per step at every size); what remains of the rise from 64 to
1024 requests is CPU caches (a few percent to ~15%, machine-dependent).

Writes ``scheduler.png`` into ``out``: microseconds per call against running requests, fastest and
median, with the linear reference line through the 64-request point.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from pathlib import Path

from matplotlib.figure import Figure

from paged.config import CacheConfig, SchedulerConfig
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup
from paged_course.engine_views import decodes


def _time_schedule(
    num_running: int, num_steps: int, prompt_len: int = 32, block_size: int = 16
) -> list[float]:
    """Seconds of each timed ``schedule()`` call with ``num_running`` requests decoding."""
    blocks = num_running * (-(-(prompt_len + num_steps + 1) // block_size) + 1)
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=num_running,
            max_model_len=prompt_len + num_steps + 8,
            max_num_batched_tokens=max(num_running * prompt_len, 2048),
        ),
        CacheConfig(block_size=block_size, num_gpu_blocks=blocks, watermark=0.0),
    )
    for i in range(num_running):
        prompt = [(i * 7 + j) % 30_000 + 1 for j in range(prompt_len)]
        sched.add_request(
            SequenceGroup(
                f"r{i}", [Sequence(i, prompt, block_size)], SamplingParams(max_tokens=num_steps + 4)
            )
        )
    seconds = []
    for step in range(num_steps + 1):
        t0 = time.perf_counter()
        out = sched.schedule()
        dt = time.perf_counter() - t0
        if step:  # step 0 is the prefill of every request
            seconds.append(dt)
            assert len(decodes(out)) == num_running, "every request must decode in every timed step"
        for s in out.scheduled:
            s.seq.append_token_id(1)
    return seconds


def _calls_per_request(num_running: int, num_steps: int = 16) -> float:
    """Python function calls per request per step (deterministic; the work, free of timing noise)."""
    prof = cProfile.Profile()
    prof.runcall(_time_schedule, num_running, num_steps)
    return pstats.Stats(prof).total_calls / (num_running * (num_steps + 1))


def run(quick: bool, out: Path) -> dict:
    sizes = [64, 256, 1024] if quick else [64, 256, 1024, 4096]
    num_steps = 32 if quick else 96
    rounds = 3 if quick else 5
    secs: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):  # interleaved: a busy spell on the shared machine hits every size alike
        for n in sizes:
            secs[n] += _time_schedule(n, num_steps)
    rows = [
        {
            "running": n,
            "us_per_call_min": min(secs[n]) * 1e6,
            "us_per_call_median": statistics.median(secs[n]) * 1e6,
            "calls_per_request": _calls_per_request(n) if n <= 1024 else None,
        }
        for n in sizes
    ]
    base = rows[0]["us_per_call_min"] / rows[0]["running"]
    print(
        f"{'running':>8} {'us/call (min)':>14} {'us/call (median)':>17} {'us/request':>11} {'vs 64':>6} "
        f"{'py calls/request':>17}"
    )
    for r in rows:
        r["us_per_request"] = r["us_per_call_min"] / r["running"]
        r["per_request_ratio_vs_64"] = r["us_per_request"] / base
        print(
            f"{r['running']:>8} {r['us_per_call_min']:>14.0f} {r['us_per_call_median']:>17.0f} "
            f"{r['us_per_request']:>11.2f} {r['per_request_ratio_vs_64']:>6.2f} "
            f"{r['calls_per_request'] or float('nan'):>17.1f}"
        )
    by_n = {r["running"]: r["us_per_call_min"] for r in rows}
    growth = by_n[1024] / by_n[64]
    print(
        f"1024 vs 64 requests: {growth:.1f}x the time for 16x the requests; "
        f"{num_steps} decode steps x {rounds} interleaved rounds each, pure Python on CPU"
    )
    result = {
        "rows": rows,
        "growth_1024_vs_64": growth,
        "num_steps": num_steps,
        "rounds": rounds,
        "device": "cpu (pure Python)",
    }
    if 4096 in by_n:
        result["growth_4096_vs_1024"] = by_n[4096] / by_n[1024]
        print(
            f"4096 vs 1024 requests: {result['growth_4096_vs_1024']:.1f}x the time for 4x the requests"
        )
    result["plot"] = str(plot_results(rows, Path(out) / "scheduler.png"))
    print(f"plot: {result['plot']}")
    return result


def plot_results(rows: list[dict], path: Path) -> Path:
    """Save us per call against running requests as a PNG at ``path`` (a bare ``Figure``: pyplot untouched)."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    running = [r["running"] for r in rows]
    ax.plot(
        running, [r["us_per_call_min"] for r in rows], "o-", color="#2a9d8f", label="fastest call"
    )
    ax.plot(
        running,
        [r["us_per_call_median"] for r in rows],
        "s--",
        color="#8d99ae",
        label="median call",
    )
    base = rows[0]["us_per_call_min"] / running[0]
    ax.plot(
        running,
        [base * n for n in running],
        ":",
        color="#d62828",
        label=f"linear from {running[0]} requests ({base:.2f} us each)",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="running requests (decoding)",
        ylabel="us per schedule() call",
        title="scheduler cost per decode step (CPU, pure Python)",
    )
    ax.set_xticks(running, [str(n) for n in running])
    ax.minorticks_off()
    ax.set_xlim(running[0] / 1.5, running[-1] * 3)
    ax.set_ylim(rows[0]["us_per_call_min"] / 2.5, None)
    for r in rows:
        ax.annotate(
            f"{r['us_per_call_min']:,.0f} us\n({r['per_request_ratio_vs_64']:.2f}x per request)",
            (r["running"], r["us_per_call_min"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, -22),
        )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
