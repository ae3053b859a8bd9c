"""Execute the chapter notebooks from their paired ``py:percent`` sources, and check the pairs agree.

Each chapter is written as ``chapters/src/NN_slug.py`` (jupytext percent format, reviewable diffs) and
committed with its executed twin ``chapters/NN_slug.ipynb`` (outputs render on GitHub). The sources sit
in a subfolder so that JupyterLab's file browser shows one entry per chapter (jupytext would open a
``.py`` beside the notebook as a second copy of it). ``execute``
rebuilds the notebook from the ``.py`` and runs it top to bottom on this machine (Triton's interpreter
when there is no GPU, progress bars off, fixed seeds in the chapters); ``check`` fails when a ``.py``
and its ``.ipynb`` hold different cells (CI runs it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CHAPTERS = Path(__file__).resolve().parents[2] / "chapters"
SOURCES = CHAPTERS / "src"
FORMATS = "ipynb,src//py:percent"  # jupytext pairing: chapters/NN.ipynb <-> chapters/src/NN.py


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


def _body(text: str) -> str:
    """A ``py:percent`` text without its YAML header (which names jupytext's version)."""
    return text.split("# ---\n", 2)[-1]


def chapter_sources(names: list[str] | None = None) -> list[Path]:
    paths = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    if names:
        paths = [
            p
            for p in paths
            if any(p.stem.startswith(n) or p.name == n or str(p) == n for n in names)
        ]
    return paths


def notebook_path(source: Path) -> Path:
    """``chapters/src/NN_slug.py`` -> ``chapters/NN_slug.ipynb``."""
    return CHAPTERS / (source.stem + ".ipynb")


def execute(
    paths: list[Path],
    timeout: int = 600,
    impl: str = "solutions",
    write: bool = True,
    silence: float = 60.0,
) -> dict[str, float]:
    """Run each chapter and write ``NN_slug.ipynb`` with outputs; return seconds per chapter.

    A written chapter run on the reference also records its seconds in ``chapters/src/runtimes.json``
    (CI's time budget per chapter). A kernel that sends no message for ``silence`` seconds while not
    computing restarts that chapter once; a second stall raises ``kernel_watch.KernelStall`` (chapter, phase).

    ``impl``: the parts the chapters build on (``PAGED_IMPL``): the committed notebooks are executed on the
    reference (``solutions``); ``exercises`` with ``write=False`` runs them on the learner's files (CI: the
    untouched stubs) and raises ``nbclient.exceptions.CellExecutionError`` on the first cell that fails.
    """
    import jupytext
    import torch

    from paged_course.publish import runtimes
    from paged_course.publish.kernel_watch import run_notebook

    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    os.environ["PAGED_IMPL"] = impl
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    seconds = {}
    for path in paths:
        nb = jupytext.read(path)
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nb.metadata.setdefault("jupytext", {})["formats"] = FORMATS
        start = time.perf_counter()
        # a kernel silent for `silence` s while not computing restarts the chapter once (kernel_watch.py)
        nb = run_notebook(nb, path.stem, cwd=CHAPTERS, timeout=timeout, silence=silence)
        seconds[path.stem] = time.perf_counter() - start
        if not write:
            print(f"{path.stem}: ran on {impl}/ in {seconds[path.stem]:.1f} s (not written)")
            continue
        for i, cell in enumerate(
            nb.cells
        ):  # keep diffs small: stable cell ids, no per-run timestamps
            cell["id"] = f"cell-{i:03d}"
            cell.metadata.pop("execution", None)
        jupytext.write(nb, notebook_path(path), fmt="ipynb")
        if impl == "solutions":
            runtimes.record({path.stem: seconds[path.stem]})
        print(f"{path.stem}: executed in {seconds[path.stem]:.1f} s")
    return seconds


def check(paths: list[Path]) -> list[str]:
    """Names of chapters whose ``.ipynb`` is missing or holds other cells than the ``.py``."""
    import jupytext
    import nbformat

    bad = []
    for path in paths:
        ipynb = notebook_path(path)
        executed = nbformat.read(ipynb, as_version=4) if ipynb.exists() else None
        if executed is None or _cells(jupytext.read(path)) != _cells(executed):
            bad.append(path.stem)
        elif _body(jupytext.writes(executed, fmt="py:percent")) != _body(path.read_text()):
            # JupyterLab's jupytext refuses to open a notebook newer than its differing .py twin
            bad.append(
                path.stem + " (its .py is not what jupytext writes: blank lines between cells)"
            )
        elif any(
            c.cell_type == "code"
            and c.source.strip()
            and not c.get("outputs")
            and c.execution_count is None
            for c in executed.cells
        ):
            bad.append(path.stem + " (not executed)")
    return bad


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m paged course notebooks")
    parser.add_argument("action", choices=["execute", "check"])
    parser.add_argument("chapters", nargs="*", help="chapter numbers or names (default: all)")
    parser.add_argument(
        "--impl",
        choices=["solutions", "exercises"],
        default="solutions",
        help="parts the chapters build on (default: the reference, as committed)",
    )
    parser.add_argument(
        "--no-write", action="store_true", help="run only (CI: every chapter on the stubs)"
    )
    args = parser.parse_args(argv)
    paths = chapter_sources(args.chapters)
    if not paths:
        print("no chapter matched")
        return 1
    if args.action == "execute":
        from paged_course.publish.kernel_watch import KernelStall

        try:
            execute(paths, impl=args.impl, write=not args.no_write)
        except KernelStall as stall:
            print(f"notebooks execute failed: {stall}")
            return 1
        return 0
    bad = check(paths)
    if bad:
        print(
            "notebooks out of sync with their .py source (run `python -m paged course notebooks "
            "execute NN`): " + ", ".join(bad)
        )
        return 1
    print(f"{len(paths)} notebooks in sync")
    return 0
