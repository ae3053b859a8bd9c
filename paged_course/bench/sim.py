"""``python -m paged bench sim``: the fragmentation simulator on 100,000 requests (``--quick``: 10,000).

One seeded chat-like trace (``paged_course.sim.workload.chat_trace``), all requests queued at step 0, a pool
of 131,072 token slots (Llama-2-7B in fp16: 64 GiB of KV) and ``max_seq_len`` 2048; each manager is
timed separately. Prints the request count, the seconds per manager and the summary table, and
saves ``sim_utilization.png`` (per-step shares of the pool) in ``out``.
"""

from __future__ import annotations

import time
from pathlib import Path

POOL_SLOTS = 131_072
BLOCK_SIZE = 16


def run(quick: bool, out: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from paged_course.sim.fragmentation import MANAGERS, simulate, summary_table
    from paged_course.sim.workload import chat_trace
    from paged_course.viz.fragmentation import plot_utilization

    num_requests = 10_000 if quick else 100_000
    trace = chat_trace(num_requests, seed=0, max_seq_len=2048)
    results, seconds = {}, {}
    cpu_start = time.process_time()
    for manager in MANAGERS:
        start = time.perf_counter()
        results[manager] = simulate(trace, POOL_SLOTS, manager, BLOCK_SIZE)
        seconds[manager] = time.perf_counter() - start
    total, cpu = sum(seconds.values()), time.process_time() - cpu_start
    print(
        f"{num_requests:,} requests, pool {POOL_SLOTS:,} slots, block_size {BLOCK_SIZE}: simulated in "
        f"{total:.2f} s wall, {cpu:.2f} s CPU ("
        + ", ".join(f"{m} {s:.2f} s" for m, s in seconds.items())
        + ")"
    )
    print(summary_table(results))
    plot_utilization(results)
    out.mkdir(parents=True, exist_ok=True)
    plt.savefig(out / "sim_utilization.png", dpi=100, bbox_inches="tight")
    plt.close("all")
    summaries = {m: r.summary() for m, r in results.items()}
    return {
        "num_requests": num_requests,
        "pool_slots": POOL_SLOTS,
        "block_size": BLOCK_SIZE,
        "seconds": {**seconds, "total": total, "cpu": cpu},
        "summary": summaries,
        "plot": str(out / "sim_utilization.png"),
    }
