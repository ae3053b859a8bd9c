"""One timed trial of the engine in the source tree on ``PYTHONPATH``; prints ``RESULT {json}``.

``python trial.py micro``: ``schedule()`` at 64 / 256 / 1,024 running requests (median microseconds of
32 decode steps), ``BlockSpaceManager`` allocate + free of 256 sequences x 64 blocks (best of 3, seconds)
and ``BlockAllocator`` one block at a time (ns per block), from ``paged_course.bench``.
``python trial.py engine big``: ``LLM.generate`` on the ``bench engine --big`` workload (128 requests,
Llama 8 x 512, 6,541 tokens), wall-clock and CPU seconds of the call; ``engine ref``: the 48-request
reference workload (Llama 4 x 256, 2,143 tokens). One torch thread.
"""

import json
import statistics
import sys

import torch

torch.set_num_threads(1)
what = sys.argv[1]
result = {}
if what == "engine":
    from paged_course.bench.engine import bench_model, make_workload, run_paged

    big = len(sys.argv) > 2 and sys.argv[2] == "big"
    model = bench_model(big=big)
    work = make_workload(128 if big else 48)
    tokens, seconds, stats = run_paged(model, work)
    result = {"engine_s": seconds, "cpu_s": stats["cpu_seconds"], "tokens": sum(map(len, tokens))}
else:
    from paged_course.bench.allocator import allocator_vs_deque, manager_allocate_free
    from paged_course.bench.scheduler import _time_schedule

    for n in (64, 256, 1024):
        result[f"schedule_{n}_us"] = statistics.median(_time_schedule(n, 32)) * 1e6
    result["manager_256_s"] = manager_allocate_free(256)["seconds"]
    result["allocator_single_ns"] = allocator_vs_deque(2048, 100)["ours_single"]
print("RESULT " + json.dumps(result))
