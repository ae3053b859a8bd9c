"""Grade the exercises: ``python -m paged grade [chNN ...] [--impl exercises|solutions] [--report DIR] [--timeout S]``.

The graded tests (``tests/exercises``, each marked ``@pytest.mark.exercise("chNN.exK", points=P)``)
run in a *subprocess* with pytest-timeout's per-test ``--timeout``: an infinite loop in learner code
fails that one test; a crash of the whole test process (segfault, ``os._exit``) fails only the test
that was running, and the remaining tests run in a fresh process. This module is also the pytest
plugin (``-p paged_course.grading``) that writes one JSON line per event to ``$PAGED_GRADE_LOG``.

``grade(...)`` returns a ``Report``; ``--report DIR`` writes ``results.json`` (Gradescope's
autograder format: https://gradescope-autograders.readthedocs.io/en/latest/specs/ ; a skipped test
counts as failed, with its reason), ``junit.xml`` and ``summary.md``. Learners always get exit code 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

ROOT = Path(__file__).resolve().parents[1]
_LOG_ENV, _CHAPTERS_ENV = "PAGED_GRADE_LOG", "PAGED_GRADE_CHAPTERS"


# ----------------------------------------------------------------------------- pytest plugin side
def _log(event: dict) -> None:
    with open(os.environ[_LOG_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def _exercise(item) -> tuple[str, int] | None:
    marker = item.get_closest_marker("exercise")
    if marker is None:
        return None
    ex_id = marker.kwargs.get("id", marker.args[0] if marker.args else "?")
    points = marker.kwargs.get("points", marker.args[1] if len(marker.args) > 1 else 1)
    return str(ex_id), int(points)


def pytest_collection_modifyitems(config, items):
    if _LOG_ENV not in os.environ:
        return
    wanted = [c for c in os.environ.get(_CHAPTERS_ENV, "").split(",") if c]
    keep, drop = [], []
    for item in items:
        ex = _exercise(item)
        ok = ex is not None and (not wanted or ex[0].split(".")[0] in wanted)
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    for item in keep:
        ex_id, points = _exercise(item)
        _log({"event": "collected", "nodeid": item.nodeid, "id": ex_id, "points": points})


def pytest_runtest_logstart(nodeid, location):
    if _LOG_ENV in os.environ:
        _log({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    if _LOG_ENV not in os.environ:
        return
    if report.when == "call" or report.outcome != "passed":  # setup/teardown only matter when they fail
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            text = f"skipped: {reason}"
        else:
            text = report.longreprtext
        _log({"event": "result", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
              "output": text[-4000:], "duration": report.duration})


# ----------------------------------------------------------------------------- parent side
@dataclass
class TestResult:
    """One graded test: its exercise id and points, and what happened (passed/failed/skipped/timeout/crashed)."""

    nodeid: str
    exercise: str
    points: int
    status: str = "failed"
    output: str = ""

    @property
    def chapter(self) -> str:
        return self.exercise.split(".")[0]

    @property
    def score(self) -> int:
        return self.points if self.status == "passed" else 0

    @property
    def reason(self) -> str:
        """A one-line explanation: the last ``SomeError: message`` line of the output, else its first line."""
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        errors = [ln.removeprefix("E").strip() for ln in lines if re.match(r"^E\s+\w+(Error|Exception|Failed)", ln)]
        return (errors[0] if errors else (lines[0] if lines else self.status))[:160]


@dataclass
class Report:
    tests: list[TestResult] = field(default_factory=list)
    impl: str = "exercises"

    @property
    def score(self) -> int:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> int:
        return sum(t.points for t in self.tests)

    def by_chapter(self) -> dict[str, tuple[int, int]]:
        """``{"ch01": (earned, possible), ...}`` in chapter order."""
        table: dict[str, tuple[int, int]] = {}
        for t in sorted(self.tests, key=lambda t: t.exercise):
            earned, possible = table.get(t.chapter, (0, 0))
            table[t.chapter] = (earned + t.score, possible + t.points)
        return table

    def table(self) -> str:
        rows = [f"{'chapter':<8} {'points':>9}  tests", "-" * 34]
        for chapter, (earned, possible) in self.by_chapter().items():
            tests = [t for t in self.tests if t.chapter == chapter]
            passed = sum(t.status == "passed" for t in tests)
            rows.append(f"{chapter:<8} {earned:>4}/{possible:<4}  {passed}/{len(tests)} passed")
        rows += ["-" * 34, f"{'total':<8} {self.score:>4}/{self.max_score:<4}"]
        return "\n".join(rows)

    def gradescope(self) -> dict:
        return {"score": self.score, "max_score": self.max_score,
                "tests": [{"name": f"{t.exercise} {t.nodeid.split('::')[-1]}", "score": t.score,
                           "max_score": t.points, "status": "passed" if t.status == "passed" else "failed",
                           "output": t.output if t.status != "passed" else "passed"} for t in self.tests]}

    def junit(self) -> str:
        suite = ET.Element("testsuite", name=f"paged-grade-{self.impl}", tests=str(len(self.tests)),
                           failures=str(sum(t.status != "passed" for t in self.tests)))
        for t in self.tests:
            classname, _, name = t.nodeid.rpartition("::")
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            ET.SubElement(ET.SubElement(case, "properties"), "property", name="points", value=str(t.points))
            if t.status != "passed":
                ET.SubElement(case, "failure", message=t.reason).text = t.output
        return ET.tostring(suite, encoding="unicode")

    def summary_md(self) -> str:
        lines = [f"# Grading summary ({self.impl})", "", f"Score: **{self.score} / {self.max_score}**", "",
                 "| chapter | points |", "|---|---|"]
        lines += [f"| {c} | {e} / {p} |" for c, (e, p) in self.by_chapter().items()]
        lines += ["", "| exercise | test | status | points | reason |", "|---|---|---|---|---|"]
        for t in self.tests:
            reason = "" if t.status == "passed" else t.reason.replace("|", "\\|")
            lines.append(f"| {t.exercise} | `{t.nodeid.split('::')[-1]}` | {t.status} | {t.score}/{t.points} "
                         f"| {reason} |")
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(self.gradescope(), indent=2))
        (folder / "junit.xml").write_text(self.junit())
        (folder / "summary.md").write_text(self.summary_md())


def normalize_chapter(name: str) -> str:
    """``"ch01"``, ``"01"`` or ``"1"`` -> ``"ch01"``; raises ValueError for anything else."""
    match = re.fullmatch(r"(?:ch)?(\d{1,2})", name.strip().lower())
    if not match:
        raise ValueError(f"chapter: expected names like ch01, 01 or 1, got {name!r}")
    return f"ch{int(match[1]):02d}"


def _run_pytest(targets: list[str], impl: str, timeout: float, chapters: list[str], root: Path,
                log: Path) -> None:
    """One pytest subprocess; a watchdog kills it when a test runs far past ``timeout`` (C-level hang)."""
    env = dict(os.environ, **{_LOG_ENV: str(log), _CHAPTERS_ENV: ",".join(chapters)})
    env.setdefault("TQDM_DISABLE", "1")
    cmd = [sys.executable, "-m", "pytest", *targets, "-p", "paged_course.grading", f"--impl={impl}",
           f"--timeout={timeout:g}", "-q", "--no-header", "-p", "no:cacheprovider"]
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last_change, size = time.monotonic(), -1
    while proc.poll() is None:
        time.sleep(0.1)
        now_size = log.stat().st_size if log.exists() else 0
        if now_size != size:
            last_change, size = time.monotonic(), now_size
        elif time.monotonic() - last_change > 2 * timeout + 120:  # pytest-timeout could not interrupt it
            proc.kill()
            proc.wait()


def grade(chapters: list[str] | None = None, impl: str = "exercises", report_dir: Path | None = None,
          timeout: float = 60, tests_dir: Path | None = None, root: Path | None = None) -> Report:
    """Run the graded tests for ``chapters`` (default: all) against ``impl`` and return the ``Report``.

    Args:
        chapters: e.g. ``["ch01", "3"]``; None or empty grades every chapter.
        impl: ``"exercises"`` (the learner's files) or ``"solutions"``.
        report_dir: when given, write results.json, junit.xml and summary.md there.
        timeout: seconds per test (pytest-timeout); a test past it fails, the others still run.
        tests_dir: folder of graded tests (default ``<root>/tests/exercises``).
        root: the working directory of the pytest subprocess (default: the repository root).

    Raises:
        ValueError: a bad chapter name, impl or timeout.
    """
    if impl not in ("exercises", "solutions"):
        raise ValueError(f"impl must be 'exercises' or 'solutions', got {impl!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    wanted = sorted({normalize_chapter(c) for c in chapters or []})
    root = Path(root or ROOT)
    tests_dir = Path(tests_dir or root / "tests" / "exercises")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "events.jsonl"
        targets, results, collected = [str(tests_dir)], {}, {}
        while True:  # each round either finishes or settles at least the test that crashed
            log.write_text("")
            _run_pytest(targets, impl, timeout, wanted, root, log)
            events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            started = None
            for ev in events:
                if ev["event"] == "collected":
                    collected.setdefault(ev["nodeid"], TestResult(ev["nodeid"], ev["id"], ev["points"]))
                elif ev["event"] == "start":
                    started = ev["nodeid"]
                elif ev["event"] == "result":
                    _record(results, ev)
            pending = [n for n in collected if n not in results]
            if not pending:
                break
            if started in pending:  # the process died while this test ran
                results[started] = ("crashed", f"the test process crashed or hung while running {started} "
                                               f"(no result within the time limit)")
                pending.remove(started)
            elif pending:  # it died outside any test (a session fixture, a conftest): no retry can help
                for nodeid in pending:
                    results[nodeid] = ("crashed", "the test process ended before this test could run")
                pending = []
            if not pending:
                break
            targets = pending
    report = Report(impl=impl)
    for nodeid, test in collected.items():
        test.status, test.output = results.get(nodeid, ("failed", "no result recorded"))
        report.tests.append(test)
    if report_dir is not None:
        report.write(Path(report_dir))
    return report


def _record(results: dict, ev: dict) -> None:
    nodeid, outcome, output = ev["nodeid"], ev["outcome"], ev["output"]
    if outcome == "passed":
        results.setdefault(nodeid, ("passed", ""))
        return
    status = "skipped" if outcome == "skipped" else "failed"
    if "Timeout" in output and ">" in output:
        status = "timeout"
    if ev["when"] != "call":
        output = f"[{ev['when']}] {output}"
    if results.get(nodeid, ("passed",))[0] == "passed":  # the first failure wins (call before teardown)
        results[nodeid] = (status, output)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged grade", description="Grade the exercises in a subprocess.")
    parser.add_argument("chapters", nargs="*", help="chapters to grade, e.g. ch01 ch03 (default: all)")
    parser.add_argument("--impl", choices=["exercises", "solutions"], default="exercises",
                        help="grade your exercises/ (default) or the reference solutions/")
    parser.add_argument("--report", type=Path, metavar="DIR", help="write results.json, junit.xml, summary.md")
    parser.add_argument("--timeout", type=float, default=60, metavar="S", help="seconds per test (default 60)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every failing test's output")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 unless every graded test passed (GitHub Classroom awards points on exit 0)")
    args = parser.parse_args(argv)
    try:
        report = grade(args.chapters, args.impl, args.report, args.timeout)
    except ValueError as err:
        parser.error(str(err))
    if not report.tests:
        print(f"no graded tests found for {' '.join(args.chapters) or 'any chapter'} in tests/exercises")
        return 1
    print(f"grading {args.impl}/ ({len(report.tests)} tests, {args.timeout:g} s per test)\n")
    print(report.table())
    failing = [t for t in report.tests if t.status != "passed"]
    if failing and not args.verbose:
        print("\nnot yet passing (one line per exercise; -v shows every test and its output):")
        for ex_id in sorted({t.exercise for t in failing}):
            tests = [t for t in report.tests if t.exercise == ex_id]
            bad = [t for t in tests if t.status != "passed"]
            reason = bad[0].reason
            stub = re.search(r"NotImplementedError: (ch\d\d\.ex\d+[a-z]?):", reason)
            if stub and stub.group(1) != ex_id:  # this exercise calls an unfinished one
                reason = f"needs {stub.group(1)} first ({reason})"
            print(f"  {ex_id:<9} {len(bad)}/{len(tests)} failing, e.g. {bad[0].status}: {reason}")
    for t in failing if args.verbose else []:
        print(f"\n{t.exercise} {t.nodeid}: {t.status}")
        print("\n".join("    " + ln for ln in t.output.splitlines()[-30:]))
    if args.report:
        print(f"\nreport written to {args.report}/ (results.json, junit.xml, summary.md)")
    return int(args.strict and report.score < report.max_score)
