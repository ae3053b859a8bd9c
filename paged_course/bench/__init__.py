"""Benchmarks: ``python -m paged bench {sim,allocator,prefix,scheduler,kernel,engine,all} [--quick] [--out DIR]``
(``bench kernel --impl {solutions,exercises}``: the learner's kernel of chapter 04's "make it faster" exercise;
``bench kernel --compile [--jobs N] [--update-static]``: every engine kernel compiled for sm_80 and sm_90
without a GPU, registers / spills / shared memory / load widths checked (``kernel_compile.py``);
``bench kernel --roofline``: decode's byte floor at A100 / H100 / H200 bandwidth, a model, beside a GPU run
when there is one (``kernel_roofline.py``);
``bench engine --big``: also the Llama 8x512 workload, ``--profile``: where the engine's time goes).

``python -m paged bench`` with no name lists the benchmarks (it runs nothing and writes nothing).

Each benchmark lives in ``paged_course/bench/<name>.py`` with ``run(quick: bool, out: Path) -> dict``; it
prints its table, returns JSON-able results, and reports every figure as a ratio against a baseline
measured in the same run, or as an absolute time marked with its device. This module records the
machine and versions with the results and writes ``<out>/<name>.json``.

Sub-package ``bench`` owns measuring: each benchmark computes and returns data and may import ``sim`` and
``reference``; it never imports ``grading``, ``publish`` or ``tools``, and ``viz``
only where a benchmark still draws its own figure (listed in ``tests/unit/test_package_layout.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from importlib import import_module, metadata
from pathlib import Path

BENCHMARKS = ["sim", "allocator", "prefix", "scheduler", "kernel", "engine"]
ABOUT = {  # one line per benchmark, for the listing that ``python -m paged bench`` prints
    "sim": "fragmentation simulator: KV memory holding real tokens, static vs contiguous vs paged (C1-C3)",
    "allocator": "what the block allocator and the block manager cost per call on this CPU",
    "prefix": "prefix caching: what a cached allocate costs, blocks saved by 100 requests sharing a prompt (C5)",
    "scheduler": "cost of one schedule() call against the number of running requests",
    "kernel": "Triton decode kernel (GPU: bandwidth, paged vs contiguous; CPU: interpreter correctness only)",
    "engine": "the paged engine against generate, generate_batch and vLLM when installed, same tokens (C6); "
    "--big, --profile",
}
QUICK_TIME = (  # measured: /usr/bin/time python -m paged bench all --quick, 2026-12-02
    "all six in 56 s at load average 3.7-4.5 on 2 shared vCPUs, 27 s of CPU time, most of it `engine`"
)


def environment() -> dict:
    """Machine, versions and device: stored beside every result and printed by ``python -m paged info`` and
    ``doctor`` (``paged_course.tools.doctor`` formats this dict; there is no second report).

    Versions are read from the installed metadata (``None`` when a package is missing), never by importing:
    importing triton before ``paged.kernels`` would fix it in compiled mode.
    """
    import os

    import torch

    cuda = torch.cuda.is_available()
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "cuda_devices": torch.cuda.device_count() if cuda else 0,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    for name in ("triton", "transformers", "numpy", "paged"):
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name] = None
    return env


def timing_threads() -> int:
    """Set torch to ``$PAGED_BENCH_THREADS`` threads (default 1) for a timed comparison on CPU; return the count.

    On a small shared machine extra threads wait on each other and turn both sides' timings into noise;
    ``bench engine`` and ``python -m paged demo`` call this before timing on CPU.
    """
    import os

    import torch

    threads = int(os.environ.get("PAGED_BENCH_THREADS", "1"))
    torch.set_num_threads(threads)
    return threads


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paged bench",
        description="Benchmarks: tables printed, JSON and PNG written. "
        "With no NAME, list the benchmarks and run nothing.",
    )
    parser.add_argument(
        "name",
        nargs="?",
        choices=BENCHMARKS + ["all"],
        metavar="NAME",
        help=f"one of {', '.join(BENCHMARKS)}, or all (each in turn); omitted: list them",
    )
    parser.add_argument("--quick", action="store_true", help=f"small sizes ({QUICK_TIME})")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-results"), help="folder for JSON and plots"
    )
    parser.add_argument(
        "--impl",
        choices=["solutions", "exercises"],
        help="kernel only: time the learner's kernel of ex04_fast_decode.py from this package",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="kernel only: compile every engine kernel for sm_80 and sm_90 (no GPU needed), write "
        "kernels.json / kernels.md, exit 1 on a compile error, a spill, narrow K/V loads or a regression",
    )
    parser.add_argument(
        "--roofline",
        action="store_true",
        help="kernel only: decode's byte floor at A100 / H100 / H200 bandwidth (a model), beside "
        "the GPU run in --out (or the newest committed one) when there is one",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="with --compile: compile processes (default: CPUs, <= 4)",
    )
    parser.add_argument(
        "--update-static",
        action="store_true",
        help="with --compile: also write the committed report docs/gpu/static/ (no regression check)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="engine only: where our time goes (cProfile)"
    )
    parser.add_argument(
        "--big", action="store_true", help="engine only: also the Llama 8x512, 128-request workload"
    )
    args = parser.parse_args(argv)
    if args.name is None:
        print("benchmarks (python -m paged bench NAME [--quick] [--out DIR]):")
        for name in BENCHMARKS:
            print(f"  {name:<10} {ABOUT[name]}")
        print(f"  {'all':<10} each of the above in turn (with --quick: {QUICK_TIME})")
        return 0
    if (args.impl or args.compile or args.roofline) and args.name != "kernel":
        parser.error("--impl, --compile and --roofline apply to `bench kernel` only")
    if (args.jobs or args.update_static) and not args.compile:
        parser.error("--jobs and --update-static apply to `bench kernel --compile` only")
    if args.compile:
        from paged_course.bench import kernel_compile

        return kernel_compile.main(args.out, args.jobs, args.update_static)
    if args.roofline:
        from paged_course.bench import kernel_roofline

        return kernel_roofline.main(args.out)
    if (args.profile or args.big) and args.name != "engine":
        parser.error("--profile and --big apply to `bench engine` only")
    args.out.mkdir(parents=True, exist_ok=True)
    names = BENCHMARKS if args.name == "all" else [args.name]
    env = environment()
    for name in names:
        print(f"== bench {name} ({'quick' if args.quick else 'full'}) on {env['device']} ==")
        start = time.perf_counter()
        extra = {"impl": args.impl} if args.impl else {}
        extra.update({k: True for k in ("profile", "big") if getattr(args, k)})
        results = import_module(f"paged_course.bench.{name}").run(
            quick=args.quick, out=args.out, **extra
        )
        record = {
            "benchmark": name,
            "quick": args.quick,
            "environment": env,
            "wall_seconds": round(time.perf_counter() - start, 2),
            "results": results,
        }
        (args.out / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
        print(f"-> {args.out / (name + '.json')} ({record['wall_seconds']} s)\n")
    return 0
