"""Start kernels and run a notebook N times in a row with the course's executor; count the stalls.

Each run executes the notebook once with ``paged_course.publish.kernel_watch.execute_once`` (the executor behind
``python -m paged course notebooks execute``, with the environment it sets: Triton's interpreter without
a GPU, progress bars off, ``PAGED_IMPL``) and no restart. A run whose kernel sends no shell or iopub
message for ``--silence`` seconds (default 30) while not using CPU is a stall, counted by its phase:
``kernel start``, ``post-start kernel_info``, ``cell N`` or ``shutdown``. The default notebook is cheap:
one cell with every single-line import of the chapters (``chapters/src/NN_*.py``), one that computes a
little and draws a figure. ``--load K`` keeps K busy processes running beside the kernels (a loaded
2-core CI machine).

    python scripts/stress_kernels.py --runs 100 --transport tcp --load 1
    python scripts/stress_kernels.py --runs 100 --transport ipc --load 1 --json out/stress-ipc.json

Not part of the test suite (it takes minutes); docs/notebook_stalls.md records its counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from paged_course.publish import kernel_watch  # noqa: E402


def chapter_imports() -> list[str]:
    """Every distinct single-line ``import``/``from`` statement at the top level of the chapters' sources."""
    lines = []
    for src in sorted((REPO / "chapters" / "src").glob("[0-9][0-9]_*.py")):
        for line in src.read_text().splitlines():
            stmt = line.split("#", 1)[0].rstrip()
            if stmt.startswith(("import ", "from ")) and not stmt.endswith(("(", "\\")):
                if stmt not in lines:
                    lines.append(stmt)
    return lines


def stress_notebook():
    import nbformat

    return nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("\n".join(chapter_imports())),
            nbformat.v4.new_code_cell(
                "import torch, matplotlib.pyplot as plt\n"
                "x = torch.arange(12.0).reshape(3, 4)\n"
                "fig, ax = plt.subplots(figsize=(2, 2)); ax.plot(x.sum(0)); plt.show()\n"
                "print(float(x.sum()))"
            ),
        ]
    )


def _burn() -> None:  # pragma: no cover - runs in a child process until killed
    while True:
        pass


def executor_environment(impl: str = "solutions") -> None:
    """What ``paged_course.publish.notebooks.execute`` sets before it starts kernels."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ["PAGED_IMPL"] = impl
    if not Path("/dev/nvidia0").exists():
        os.environ["TRITON_INTERPRET"] = "1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    parser.add_argument(
        "--silence", type=float, default=30.0, help="seconds of silence that make a stall"
    )
    parser.add_argument("--load", type=int, default=0, help="busy background processes")
    parser.add_argument("--notebook", type=Path, help="an .ipynb to run (default: the cheap one)")
    parser.add_argument("--json", type=Path, help="write the counts and every run here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    import nbformat

    executor_environment()
    base = nbformat.read(args.notebook, as_version=4) if args.notebook else stress_notebook()
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for p in burners:
        p.start()
    runs = []
    t0 = time.monotonic()
    try:
        for i in range(args.runs):
            nb = nbformat.from_dict(json.loads(json.dumps(base)))
            start = time.monotonic()
            watch = kernel_watch.Watch(silence=args.silence)
            row = {"run": i, "started": False, "stall": None, "error": None}
            try:
                kernel_watch.execute_once(
                    nb,
                    f"run {i}",
                    cwd=REPO / "chapters",
                    silence=args.silence,
                    transport=args.transport,
                    watch=watch,
                )
            except kernel_watch.KernelStall as stall:
                row["stall"] = stall.phase
            except Exception as exc:  # noqa: BLE001 - counted and reported, the stress goes on
                row["error"] = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
            row["started"] = watch.pid is not None
            row["seconds"] = round(time.monotonic() - start, 2)
            runs.append(row)
            what = (
                f"STALL in {row['stall']}"
                if row["stall"]
                else (f"ERROR {row['error']}" if row["error"] else "ok")
            )
            print(f"run {i + 1}/{args.runs}: {what} ({row['seconds']:.1f} s)", flush=True)
    finally:
        for p in burners:
            p.kill()
    stalls = collections.Counter(r["stall"] for r in runs if r["stall"])
    seconds = [r["seconds"] for r in runs if not r["stall"] and not r["error"]]
    summary = {
        "transport": args.transport,
        "load": args.load,
        "silence_s": args.silence,
        "runs": len(runs),
        "kernel_starts": sum(r["started"] for r in runs),
        "stalls": sum(stalls.values()),
        "stalls_by_phase": dict(stalls),
        "errors": sum(1 for r in runs if r["error"]),
        "run_seconds_median": round(statistics.median(seconds), 2) if seconds else None,
        "run_seconds_max": max(seconds) if seconds else None,
        "total_seconds": round(time.monotonic() - t0, 1),
        "versions": versions(),
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2) + "\n")
    return 0


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {
        name: version(name)
        for name in ("ipykernel", "jupyter_client", "nbclient", "pyzmq", "tornado")
    }


if __name__ == "__main__":
    sys.exit(main())
