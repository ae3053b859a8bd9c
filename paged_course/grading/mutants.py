"""Prove that the graded tests bite: ``python -m paged course mutants [chNN ...]``.

For every graded region of ``solutions/`` (a ``# BEGIN SOLUTION chNN.exK`` region whose tests carry
points), ``tests/mutants/exNN_topic.py`` keeps plausible wrong answers as data::

    MUTANTS = {"ch02.ex1": {"hands out the back of the queue": '''
        block_id = self.free_list.pop()
        ...'''}}

Each mutant replaces the region's body (indentation is fixed up), in a copy of ``solutions/``; the
region's graded tests then run against that copy (``--impl DIR``, in this process) and must fail: the
mutant is *killed* (the run stops at its first failing test: one is enough, and the line printed names
it). The last line printed is ``mutants: K of M killed``; the exit status is 1 unless every mutant is
killed and every graded region has at least ``MIN_MUTANTS`` of them. ``--jobs N`` splits the chapters
over N processes (a chapter's mutants stay in one process; their lines print per chapter).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from paged_course.check import ROOT, run_check
from paged_course.publish.sync import BEGIN, END

MIN_MUTANTS = 3
MUTANTS_DIR = ROOT / "tests" / "mutants"


def regions(source: str) -> dict[str, tuple[int, int, str]]:
    """``{id: (first body line, end line, indent)}`` of the marked regions (0-based line numbers)."""
    found, open_ = {}, None
    for i, line in enumerate(source.splitlines()):
        if (m := BEGIN.match(line)) is not None:
            open_ = (m["id"], i + 1, m["indent"])
        elif END.match(line) and open_ is not None:
            found[open_[0]] = (open_[1], i, open_[2])
            open_ = None
    return found


def apply(source: str, exercise: str, code: str) -> str:
    """``source`` with the body of region ``exercise`` replaced by ``code`` (re-indented to the region's)."""
    first, end, indent = regions(source)[exercise]
    lines = source.splitlines()
    body = textwrap.indent(textwrap.dedent(code).strip("\n"), indent).splitlines()
    return "\n".join(lines[:first] + body + lines[end:]) + "\n"


def variant(file_name: str, exercise: str, old: str, new: str) -> str:
    """The body of region ``exercise`` of ``solutions/<file_name>`` (without its hint and stub comments,
    dedented) with ``old`` replaced by ``new``: a mutant written as one slip in the reference answer.

    Raises:
        AssertionError: ``old`` is not in the region exactly once (the reference changed under the mutant).
    """
    source = (ROOT / "solutions" / file_name).read_text()
    first, end, _ = regions(source)[exercise]
    lines = source.splitlines()[first:end]
    body = textwrap.dedent(
        "\n".join(x for x in lines if not x.lstrip().startswith(("# HINT", "# STUB")))
    )
    assert body.count(old) == 1, (
        f"{exercise}: the mutant's anchor {old!r} is not in the reference once"
    )
    return body.replace(old, new)


def load_mutants() -> dict[str, dict[str, dict[str, str]]]:
    """``{solutions file name: {exercise id: {mutant name: code}}}`` from ``tests/mutants/*.py``."""
    out = {}
    for path in sorted(MUTANTS_DIR.glob("ex*.py")):
        spec = importlib.util.spec_from_file_location(f"_mutants_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out[path.stem + ".py"] = module.MUTANTS
    return out


def graded_regions() -> dict[str, str]:
    """``{exercise id: solutions file name}`` for every region whose graded tests carry points."""
    from paged_course.grading.collect import collect

    graded = {t["id"] for t in collect(ROOT) if t["points"] > 0}
    found = {}
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        for ex_id in regions(path.read_text()):
            if ex_id in graded:
                found[ex_id] = path.name
    return found


def run(chapters: list[str] | None = None) -> tuple[int, int, list[str]]:
    """Apply every mutant; returns ``(killed, total, problems)`` and prints one line per mutant."""
    mutants, problems = load_mutants(), []
    graded = graded_regions()
    wanted = lambda ex_id: not chapters or ex_id.split(".")[0] in chapters  # noqa: E731
    for ex_id, name in sorted(graded.items()):
        count = len(mutants.get(name, {}).get(ex_id, {}))
        if wanted(ex_id) and count < MIN_MUTANTS:
            problems.append(
                f"{ex_id}: {count} mutants in tests/mutants/{name}, at least {MIN_MUTANTS} needed"
            )
    killed = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for file_name, by_region in mutants.items():
            source = (ROOT / "solutions" / file_name).read_text()
            for ex_id, planted in sorted(by_region.items()):
                if not wanted(ex_id):
                    continue
                for k, (label, code) in enumerate(planted.items()):
                    folder = Path(tmp) / f"{ex_id.replace('.', '_')}_{k}"
                    shutil.copytree(ROOT / "solutions", folder)
                    (folder / file_name).write_text(apply(source, ex_id, code))
                    result = run_check(ex_id, impl=str(folder), stop_at_first=True)
                    total += 1
                    killed += not result.ok
                    by = next((t for t, o in result.outcomes.items() if o == "failed"), "")
                    verdict = (
                        f"killed by {by or 'an error before any check ran'}"
                        if not result.ok
                        else "SURVIVED every check"
                    )
                    print(f"  {ex_id:<9} {label}: {verdict}")
                    if result.ok:
                        problems.append(f"{ex_id}: the mutant '{label}' passes every graded test")
    return killed, total, problems


def run_in_processes(chapters: list[str], jobs: int) -> tuple[int, int, list[str]]:
    """``run(chapters)`` split over ``jobs`` child processes, the chapters dealt out by mutant count
    (most first, each to the lightest process); returns the summed ``(killed, total, problems)``."""
    counts = {}
    for by_region in load_mutants().values():
        for ex_id, planted in by_region.items():
            chapter = ex_id.split(".")[0]
            counts[chapter] = counts.get(chapter, 0) + len(planted)
    for ex_id in graded_regions():
        counts.setdefault(ex_id.split(".")[0], 0)
    shares = [[] for _ in range(jobs)]
    for chapter in sorted(counts, key=counts.get, reverse=True):
        if not chapters or chapter in chapters:
            min(shares, key=lambda share: sum(counts[c] for c in share)).append(chapter)
    command = [sys.executable, "-m", "paged", "course", "mutants"]
    children = {
        tuple(share): subprocess.Popen(command + share, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for share in shares
        if share
    }
    killed = total = 0
    problems = []
    for share, child in children.items():
        out, _ = child.communicate()
        summary = None
        for line in out.splitlines():
            if line.startswith("problem: "):
                problems.append(line.removeprefix("problem: "))
            elif (m := re.fullmatch(r"mutants: (\d+) of (\d+) killed", line)) is not None:
                summary = m
            else:
                print(line)
        if summary is None:
            problems.append(
                f"the run of {' '.join(share)} ended (exit {child.returncode}) with no count"
            )
        else:
            killed, total = killed + int(summary[1]), total + int(summary[2])
    return killed, total, problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paged course mutants", description=__doc__.split("\n")[0]
    )
    parser.add_argument("chapters", nargs="*", help="chapters to check, e.g. ch02 (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="processes to split the chapters over")
    args = parser.parse_args(argv)
    chapters = [c if c.startswith("ch") else f"ch{int(c):02d}" for c in args.chapters]
    if args.jobs > 1:
        killed, total, problems = run_in_processes(chapters, args.jobs)
    else:
        killed, total, problems = run(chapters)
    for line in problems:
        print("problem:", line)
    print(f"mutants: {killed} of {total} killed")
    return 0 if killed == total and not problems and total else 1
