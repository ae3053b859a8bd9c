"""Grade the exercises: ``python -m paged grade [chNN ...] [--impl exercises|solutions] [--report DIR] [--timeout S]``.

The graded tests (``tests/exercises``, each marked ``@pytest.mark.exercise("chNN.exK", points=P)``)
run in a *subprocess* with pytest-timeout's per-test limit: ``--timeout S`` (default 10 s) for every
test, or a test's own ``@pytest.mark.timeout(N)`` when that is larger (the few tests that import
Triton or warm up torch carry one). An infinite loop fails that one test (``timed out after 10 s``);
a hang that the timeout cannot interrupt (inside C code) is ended by a watchdog a few seconds later
(limit + max(5 s, limit / 2)), and a crash of the whole test process (segfault, ``os._exit``) fails
only the test that was running: the remaining tests run in a fresh process. Once a test of a region times
out inside a function, the region's later tests stop the moment they call that function and are reported
``blocked`` (``B``) instead of waiting out their own limit. This module is also the
pytest plugin (``-p paged_course.grading``) that writes one JSON line per event to
``$PAGED_GRADE_LOG``; the grader reads that log while pytest runs and prints a line per chapter.

A region whose tests carry ``@pytest.mark.exercise(..., all_or_nothing=True)`` (a spot-the-bug region: the
learner gets working-looking code with one planted bug, which passes some of its tests by design) scores 0
unless every one of its tests passes: its passing tests are then *withheld* (score 0, reported failed to
Gradescope and in JUnit, with the reason), see :func:`apply_all_or_nothing`.

``grade(...)`` returns a ``Report``; ``--report DIR`` writes ``results.json`` (Gradescope's
autograder format: https://gradescope-autograders.readthedocs.io/en/latest/specs/ ; a skipped test
counts as failed, with its reason), ``junit.xml`` and ``summary.md``. Learners get exit code 0
(``--strict``: 1 below full marks); Ctrl-C stops the test process and its children, prints the
table of the tests that finished and exits with 130. The test process runs in its own process group,
which the grader kills however it ends; on Linux the kernel also kills it if the grader itself is
killed (``PR_SET_PDEATHSIG``).

Sub-package ``grading`` owns grading: this grader and pytest plugin, the Gradescope bundle
(``autograder``), the GitHub Classroom config (``classroom``) and the planted-bug runner (``mutants``). It may
import ``check`` and ``publish`` (the sync markers, the release builder) but never ``bench``, ``sim``, ``viz``
or ``tools``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from xml.etree import ElementTree as ET

ROOT = Path(__file__).resolve().parents[2]
_LOG_ENV, _CHAPTERS_ENV = "PAGED_GRADE_LOG", "PAGED_GRADE_CHAPTERS"
DEFAULT_TIMEOUT = (
    10.0  # seconds per graded test; a test that needs more carries @pytest.mark.timeout(N)
)
STARTUP_S = 180.0  # pytest start-up and collection (imports torch; slow on a cold laptop disk)
AFTER_TEST_S = 60.0  # between one test's end and the next one's start, or the end of the session
_TIMEOUT_TEXT = (
    "from pytest-timeout"  # pytest-timeout's failure: "Timeout (>10.0s) from pytest-timeout."
)


WATCHDOG_FLOOR_S = 5.0  # the least grace the watchdog gives pytest-timeout after a test's limit


def watchdog_seconds(limit: float) -> float:
    """How long a test may run before the grader kills the test process: ``limit + max(5, limit / 2)``.

    pytest-timeout interrupts Python code at ``limit``; the watchdog only ends hangs it cannot reach
    (a loop inside C code, a deadlock), so it scales with the limit: 15 s for the default 10 s, 90 s
    for a test with its own 60 s.
    """
    return limit + max(WATCHDOG_FLOOR_S, limit / 2)


# ----------------------------------------------------------------------------- pytest plugin side
class BlockedByTimeout(Exception):
    """Raised on entering a function that timed out in an earlier test of the same region: that test is
    reported ``blocked`` at once instead of waiting out its own time limit."""


_exercise_of: dict[str, str] = {}  # nodeid -> exercise id, from collection
_timed_out: dict[
    str, dict
] = {}  # exercise id -> where its first timeout stopped: file, line, func, test


def _timeout_frame(output: str) -> dict | None:
    """``{"file", "line", "func"}`` of the innermost frame outside the tests and pytest where pytest-timeout
    stopped a test, read from its traceback; None when it cannot be told."""
    spot = _timeout_location(output)
    m = re.fullmatch(r"(\S+\.py):(\d+) \(in (\w+)\)", spot or "")
    if m is None or re.match(r"(.*/)?tests/", m[1]):  # stopped in a test's own code: block nothing
        return None
    return {"file": m[1], "line": int(m[2]), "func": m[3]}


def _blocking_tracer(spot: dict):
    """A ``sys.settrace`` function that raises :class:`BlockedByTimeout` when ``spot``'s function is called
    (same name, same file); it traces calls only, never lines."""
    name, file = spot["func"], spot["file"].replace("\\", "/")

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == name and code.co_filename.endswith(file):
            raise BlockedByTimeout(
                f"blocked: calls {name} ({spot['file']}:{spot['line']}), which timed out in "
                f"{spot['test']}; not run again (fix that loop first)"
            )
        return None

    return tracer


def pytest_runtest_setup(item):
    """A later test of a region whose function timed out stops as soon as it calls that function."""
    if _LOG_ENV not in os.environ:
        return
    spot = _timed_out.get(_exercise_of.get(item.nodeid, ""))
    if spot is not None:
        sys.settrace(_blocking_tracer(spot))


def pytest_runtest_teardown(item):
    if _LOG_ENV in os.environ and item.nodeid in _exercise_of:
        sys.settrace(None)


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


def _all_or_nothing(item) -> bool:
    marker = item.get_closest_marker("exercise")
    return bool(marker is not None and marker.kwargs.get("all_or_nothing", False))


def _own_timeout(item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    return float(value) if value is not None else None


def pytest_collection_modifyitems(config, items):
    if _LOG_ENV not in os.environ:
        return
    import pytest

    wanted = [c for c in os.environ.get(_CHAPTERS_ENV, "").split(",") if c]
    keep, drop = [], []
    for item in items:
        ex = _exercise(item)
        ok = ex is not None and (not wanted or ex[0].split(".")[0] in wanted)
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    try:
        default = config.getoption("timeout")  # pytest-timeout's --timeout; None when not given
    except ValueError:  # pytest-timeout not installed (collect-only callers)
        default = None
    default = float(default) if default else None
    for item in keep:
        ex_id, points = _exercise(item)
        own = _own_timeout(item)
        limit = max(x for x in (own, default, 0.0) if x is not None) or None
        if (
            own is not None and limit != own
        ):  # --timeout larger than the test's own limit: the larger wins
            item.add_marker(pytest.mark.timeout(limit), append=False)
        uses = list(item.get_closest_marker("exercise").kwargs.get("uses", ()))
        _exercise_of[item.nodeid] = ex_id
        _log(
            {
                "event": "collected",
                "nodeid": item.nodeid,
                "id": ex_id,
                "points": points,
                "timeout": limit,
                "uses": uses,
                "all_or_nothing": _all_or_nothing(item),
            }
        )


def pytest_runtest_logstart(nodeid, location):
    if _LOG_ENV in os.environ:
        _log({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    if _LOG_ENV not in os.environ:
        return
    if (
        report.when == "call" or report.outcome != "passed"
    ):  # setup/teardown only matter when they fail
        if report.skipped:
            reason = (
                report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            )
            text = f"skipped: {str(reason).removeprefix('Skipped: ')}"
        else:
            text = report.longreprtext
        timed_out = report.failed and _TIMEOUT_TEXT in text and "Timeout (>" in text
        blocked = report.failed and "BlockedByTimeout: blocked:" in text
        ex_id = _exercise_of.get(report.nodeid)
        if timed_out and ex_id and ex_id not in _timed_out:
            spot = _timeout_frame(text)
            if spot is not None:
                _timed_out[ex_id] = dict(spot, test=report.nodeid.rsplit("::", 1)[-1])
        _log(
            {
                "event": "result",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "output": text[-4000:],
                "duration": report.duration,
                "timeout": timed_out,
                "blocked": blocked,
            }
        )


def pytest_runtest_logfinish(nodeid, location):
    if _LOG_ENV in os.environ:
        _log({"event": "finish", "nodeid": nodeid})


# ----------------------------------------------------------------------------- results
_STATUS_WORDS = {
    "passed": "passed",
    "failed": "failed",
    "skipped": "skipped",
    "timeout": "timed out",
    "crashed": "crashed",
    "blocked": "blocked",
}
_SYMBOL = {
    "passed": ".",
    "failed": "F",
    "skipped": "s",
    "timeout": "T",
    "crashed": "C",
    "blocked": "B",
}
_MAX_REASON = (
    1000  # characters; longer reasons keep their head and their end (where expected/got is)
)


def _error_message(output: str) -> str:
    """The exception message of a pytest failure: its ``E`` lines joined, without pytest's own ``assert`` diff.

    ``E   AssertionError: length 17 needs 2 blocks,`` / ``E      got 1`` / ``E   assert 1 == 2`` gives
    ``AssertionError: length 17 needs 2 blocks, got 1``. A message that names neither what was expected nor
    what came out keeps pytest's first comparison line (``...: assert [7, 1, 4] == [7, 1]``). Falls back to
    the first non-blank line.
    """
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"^E\s", line):
            continue
        parts = [line[1:].strip()]
        for more in lines[i + 1 :]:
            if not re.match(r"^E(\s|$)", more):
                break
            text = more[1:].strip()
            if text.startswith("assert ") and not parts[0].startswith("assert "):
                if not re.search(
                    r"\b(?:got|expected)\b", " ".join(parts), re.I
                ):  # pytest shows both
                    parts[-1] += ":"
                    parts.append(text)
                break  # pytest's rewritten comparison after the test's own message
            if text:
                parts.append(text)
        return " ".join(parts)
    stripped = [ln.strip() for ln in lines if ln.strip()]
    return stripped[0] if stripped else ""


def shorten_middle(text: str, limit: int = _MAX_REASON) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and its end around `` ... ``.

    The end is kept because assertion messages end with what was expected and what came out.
    """
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head].rstrip() + " ... " + text[len(text) - (limit - head - 5) :].lstrip()


def _timeout_location(output: str) -> str | None:
    """``path:line (in func)`` where pytest-timeout interrupted the test (its last traceback entry), if any."""
    spots = [
        m
        for m in re.finditer(r"^(\S+\.py):(\d+): ", output, flags=re.MULTILINE)
        if "site-packages" not in m[1] and "pytest_timeout" not in m[1]
    ]
    if not spots:
        return None
    last = spots[-1]
    entry = output[: last.start()].rsplit("\n_ _ ", 1)[
        -1
    ]  # pytest separates traceback entries by "_ _ _"
    funcs = re.findall(r"^\s*(?:async\s+)?def (\w+)\(", entry, flags=re.MULTILINE)
    return f"{last[1]}:{last[2]}" + (f" (in {funcs[-1]})" if funcs else "")


@dataclass
class TestResult:
    """One graded test: its exercise id and points, and what happened.

    ``status`` is ``passed``, ``failed``, ``skipped``, ``timeout`` or ``crashed``; ``limit`` is the
    test's time limit in seconds; ``message`` (set for timeouts and crashes) is the plain-words reason.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    exercise: str
    points: int
    status: str = "failed"
    output: str = ""
    limit: float | None = None
    message: str = ""
    duration: float | None = None  # seconds from start to finish, as the grader saw it
    uses: tuple[str, ...] = ()  # earlier exercises this test runs (the marker's ``uses=``)
    all_or_nothing: bool = False  # its region scores 0 unless every one of its tests passes
    withheld: bool = False  # passed, but another test of its all-or-nothing region did not

    @property
    def chapter(self) -> str:
        return self.exercise.split(".")[0]

    @property
    def score(self) -> int:
        return self.points if self.status == "passed" and not self.withheld else 0

    @property
    def reason(self) -> str:
        """Why the test did not pass, in one (possibly long) line, never cut before its expected/got part."""
        if self.status == "passed" and self.withheld:
            return WITHHELD
        if self.status == "passed":
            return "passed"
        if self.message:
            return self.message
        text = _error_message(self.output) or self.status
        setup = re.match(r"^\[(setup|teardown)\] ", self.output)
        if setup and not text.startswith("["):
            text = f"in {setup.group(1)}: {text}"
        return shorten_middle(text)


WITHHELD = (
    "passed, but its region is graded all or nothing (spot the bug) and another of its tests fails: "
    "0 points until every test of the region passes"
)


def apply_all_or_nothing(
    tests: list[TestResult], unfinished: tuple[str, ...] = ()
) -> list[TestResult]:
    """Withhold the points of every passing test of an all-or-nothing region in which some test did not pass
    (or, in ``unfinished``, did not run); clear the mark elsewhere. Returns ``tests``, changed in place."""
    failing = {t.exercise for t in tests if t.all_or_nothing and t.status != "passed"} | set(
        unfinished
    )
    for t in tests:
        t.withheld = t.all_or_nothing and t.status == "passed" and t.exercise in failing
    return tests


@dataclass
class Report:
    """The graded tests of one run; ``not_run`` holds those an interrupted run (Ctrl-C) never finished."""

    tests: list[TestResult] = field(default_factory=list)
    impl: str = "exercises"
    interrupted: bool = False
    not_run: list[TestResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> int:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> int:
        return sum(t.points for t in self.tests)

    def by_chapter(self) -> dict[str, tuple[int, int]]:
        """``{"ch01": (earned, possible), ...}`` in chapter order, over the tests that finished."""
        table: dict[str, tuple[int, int]] = {}
        for t in sorted(self.tests, key=lambda t: t.exercise):
            earned, possible = table.get(t.chapter, (0, 0))
            table[t.chapter] = (earned + t.score, possible + t.points)
        return table

    def table(self) -> str:
        rows = [f"{'chapter':<8} {'points':>9}  tests", "-" * 34]
        chapters = sorted({t.chapter for t in self.tests} | {t.chapter for t in self.not_run})
        scores = self.by_chapter()
        for chapter in chapters:
            tests = [t for t in self.tests if t.chapter == chapter]
            left = sum(t.chapter == chapter for t in self.not_run)
            if not tests:
                rows.append(f"{chapter:<8} {'-':>9}  not run ({left} test{'s' * (left != 1)})")
                continue
            earned, possible = scores[chapter]
            passed = sum(t.status == "passed" for t in tests)
            rows.append(
                f"{chapter:<8} {earned:>4}/{possible:<4}  {passed}/{len(tests)} passed"
                + (f", {left} not run" if left else "")
            )
        rows += ["-" * 34, f"{'total':<8} {self.score:>4}/{self.max_score:<4}"]
        if self.interrupted:
            rows[-1] += (
                f"  (interrupted: {len(self.tests)} of {len(self.tests) + len(self.not_run)} tests ran)"
            )
        return "\n".join(rows)

    def gradescope(self) -> dict:
        return {
            "score": self.score,
            "max_score": self.max_score,
            "tests": [
                {
                    "name": f"{t.exercise} {t.nodeid.split('::')[-1]}",
                    "score": t.score,
                    "max_score": t.points,
                    "status": "passed" if t.score == t.points else "failed",
                    "output": _feedback(t),
                }
                for t in self.tests
            ],
        }

    def junit(self) -> str:
        suite = ET.Element(
            "testsuite",
            name=f"paged-grade-{self.impl}",
            tests=str(len(self.tests)),
            failures=str(sum(t.status != "passed" or t.withheld for t in self.tests)),
        )
        for t in self.tests:
            classname, _, name = t.nodeid.rpartition("::")
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            ET.SubElement(
                ET.SubElement(case, "properties"), "property", name="points", value=str(t.points)
            )
            if t.status != "passed" or t.withheld:
                ET.SubElement(case, "failure", message=t.reason).text = t.output
        return ET.tostring(suite, encoding="unicode")

    def summary_md(self) -> str:
        lines = [
            f"# Grading summary ({self.impl})",
            "",
            f"Score: **{self.score} / {self.max_score}**",
            "",
            "| chapter | points |",
            "|---|---|",
        ]
        lines += [f"| {c} | {e} / {p} |" for c, (e, p) in self.by_chapter().items()]
        lines += ["", "| exercise | test | status | points | reason |", "|---|---|---|---|---|"]
        for t in self.tests:
            reason = "" if t.score == t.points else t.reason.replace("|", "\\|")
            lines.append(
                f"| {t.exercise} | `{t.nodeid.split('::')[-1]}` | {t.status} | {t.score}/{t.points} "
                f"| {reason} |"
            )
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(self.gradescope(), indent=2))
        (folder / "junit.xml").write_text(self.junit())
        (folder / "summary.md").write_text(self.summary_md())


def _feedback(t: TestResult) -> str:
    if t.status == "passed":
        return WITHHELD if t.withheld else "passed"
    if t.message:
        return t.message + ("\n\n" + t.output if t.output else "")
    return t.output


class GradingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM to the CLI) during ``grade``: the test process was stopped; ``.report`` is partial."""

    def __init__(self, report: Report):
        super().__init__(
            f"grading interrupted after {len(report.tests)} of "
            f"{len(report.tests) + len(report.not_run)} tests"
        )
        self.report = report


def normalize_chapter(name: str) -> str:
    """``"ch01"``, ``"01"`` or ``"1"`` -> ``"ch01"``; raises ValueError for anything else."""
    match = re.fullmatch(r"(?:ch)?(\d{1,2})", name.strip().lower())
    if not match:
        raise ValueError(f"chapter: expected names like ch01, 01 or 1, got {name!r}")
    return f"ch{int(match[1]):02d}"


# ----------------------------------------------------------------------------- progress lines
class Progress:
    """Live progress on a text stream: one line per chapter, a symbol per finished test, then its points.

    ``ch01 ..T.......   23/26 points  (12.4 s)``. Plain characters and newlines only (no ``\\r``, no
    colours), so it reads the same in a terminal, a CI log and a notebook cell.
    """

    WRAP = 50  # symbols per line; a longer chapter continues on an indented line

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.total: dict[str, int] = {}
        self.possible: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.earned: dict[str, int] = {}
        self.finished: dict[str, list[TestResult]] = {}
        self.first_start: dict[str, float] = {}
        self.open: str | None = None
        self.column = 0
        self.began = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def begin(self, tests: list[TestResult]) -> None:
        """Called once the tests are collected: print how many and what the symbols mean."""
        if self.began:
            return
        self.began = True
        for t in tests:
            self.total[t.chapter] = self.total.get(t.chapter, 0) + 1
            self.possible[t.chapter] = self.possible.get(t.chapter, 0) + t.points
        self.width = min(max(self.total.values(), default=1), self.WRAP)
        chapters = len(self.total)
        self._write(
            f"{len(tests)} test{'s' * (len(tests) != 1)} in {chapters} chapter{'s' * (chapters != 1)} "
            "(. passed  F failed  T timed out  B blocked by a timeout  C crashed  s skipped)\n"
        )

    def _open(self, chapter: str) -> None:
        if self.open != chapter:
            self.end_line()
            self._write(f"{chapter:<5}")
            self.open, self.column = chapter, 0

    def start(self, test: TestResult) -> None:
        """A test started: its chapter's line opens (so a slow first test shows which chapter runs)."""
        self.first_start.setdefault(test.chapter, time.monotonic())
        self._open(test.chapter)

    def finish(self, test: TestResult) -> None:
        chapter = test.chapter
        self._open(chapter)
        if self.column == self.WRAP:
            self._write("\n" + " " * 5)
            self.column = 0
        self._write(_SYMBOL.get(test.status, "?"))
        self.column += 1
        self.done[chapter] = self.done.get(chapter, 0) + 1
        self.finished.setdefault(chapter, []).append(test)
        if self.done[chapter] >= self.total.get(chapter, 0):
            # the chapter is complete: an all-or-nothing region's points are known only now
            self.earned[chapter] = sum(
                t.score for t in apply_all_or_nothing(self.finished[chapter])
            )
            seconds = time.monotonic() - self.first_start.get(chapter, time.monotonic())
            pad = " " * max(0, self.width - self.column)
            points = f"{self.earned[chapter]}/{self.possible.get(chapter, 0)}"
            self._write(f"{pad} {points:>7} points  ({seconds:.1f} s)\n")
            self.open = None

    def end_line(self) -> None:
        if self.open is not None:
            self._write("\n")
            self.open = None


# ----------------------------------------------------------------------------- parent side
class _EventTail:
    """Reads the event log as the plugin appends to it: complete JSON lines only."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


@dataclass
class _ChildEnd:
    returncode: int
    running: str | None  # the test that had started but not finished when the process ended
    killed_after: (
        float | None
    )  # seconds the running test had run when the watchdog killed the process
    output_tail: str  # the end of pytest's own output (stdout and stderr)


def _spawn(cmd: list[str], root: Path, env: dict, out) -> subprocess.Popen:
    if (
        os.name == "posix"
    ):  # its own process group: Ctrl-C reaches the grader only, which stops the group
        return subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,  # pragma: no cover
        stdin=subprocess.DEVNULL,
        creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
    )


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the pytest process and everything it started (its process group)."""
    if proc.poll() is None or os.name == "posix":
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:  # pragma: no cover - Windows
                subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


# The graded tests need none of the notebook / property-test plugins the course's dev extra installs;
# not loading them (nor the ini's addopts, which name nbval's options) takes ~3 s off every grader start.
_LEAN = ["-p", "no:nbval", "-p", "no:hypothesispytest", "-p", "no:anyio", "-o", "addopts="]
_PARENT_ENV = "PAGED_GRADE_PARENT"
# The test process runs pytest through this bootstrap. On Linux it first asks the kernel to kill it when
# the grader dies (PR_SET_PDEATHSIG), so even a grader killed with SIGKILL leaves no test process behind.
_BOOT = """
import os, sys
if sys.platform.startswith("linux"):
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get("PAGED_GRADE_PARENT", os.getppid())):
        os._exit(1)  # the grader died before the line above took effect
import pytest
raise SystemExit(pytest.console_main())
"""


def _run_pytest(
    targets: list[str],
    impl: str,
    timeout: float,
    chapters: list[str],
    root: Path,
    log: Path,
    on_event: Callable[[dict], None],
    limit_of: Callable[[str], float],
) -> _ChildEnd:
    """One pytest subprocess; every event goes to ``on_event`` as it is logged.

    A watchdog kills the process group when a test runs past ``watchdog_seconds(its limit)`` (a hang
    that pytest-timeout could not interrupt), when start-up takes longer than ``STARTUP_S``, or when
    nothing happens for ``AFTER_TEST_S`` after a test. However it ends (KeyboardInterrupt included),
    the process group is killed, so nothing the tests started outlives the grader.
    """
    env = dict(os.environ, **{_LOG_ENV: str(log), _CHAPTERS_ENV: ",".join(chapters)})
    env.setdefault("TQDM_DISABLE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env[_PARENT_ENV] = str(os.getpid())
    cmd = [
        sys.executable,
        "-c",
        _BOOT,
        *targets,
        "-p",
        "paged_course.grading",
        f"--impl={impl}",
        f"--timeout={timeout:g}",
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        *_LEAN,
    ]
    log.write_text("")
    out_path = log.with_suffix(".out")
    tail, queue = _EventTail(log), deque()
    running, started_at, killed_after = None, 0.0, None
    with open(out_path, "wb") as out:
        proc = _spawn(cmd, root, env, out)
        deadline = time.monotonic() + STARTUP_S
        try:
            while True:
                ended = proc.poll() is not None
                queue.extend(tail.read())
                while queue:
                    ev = queue.popleft()
                    now = time.monotonic()
                    if ev["event"] == "start":
                        running, started_at = ev["nodeid"], now
                        deadline = now + watchdog_seconds(limit_of(running))
                    elif ev["event"] == "finish":
                        running, deadline = None, now + AFTER_TEST_S
                    on_event(ev)
                if ended:
                    break
                if killed_after is None and time.monotonic() > deadline:
                    killed_after = time.monotonic() - started_at if running else 0.0
                    _kill_tree(proc)
                    continue
                time.sleep(0.05)
        except BaseException:  # Ctrl-C: stop the tests, then count what had finished before it
            _kill_tree(proc)
            queue.extend(tail.read())
            while queue:
                try:
                    on_event(queue.popleft())
                except Exception:  # pragma: no cover - best effort; the interrupt is what matters
                    pass
            raise
        finally:  # also after a normal end: nothing the tests started outlives the grader
            _kill_tree(proc)
    output = out_path.read_text(errors="replace")
    return _ChildEnd(proc.returncode, running, killed_after, output[-8000:])


def _signal_words(returncode: int) -> str:
    """``-11`` -> "a segmentation fault (SIGSEGV)"; ``3`` -> "exit code 3"."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
    words = {
        "SIGSEGV": "a segmentation fault",
        "SIGABRT": "an abort",
        "SIGBUS": "a bus error",
        "SIGFPE": "a floating-point exception",
        "SIGILL": "an illegal instruction",
        "SIGKILL": "SIGKILL, often the system running out of memory",
    }
    return (
        f"{words[name]} ({name})" if name in words and name != "SIGKILL" else words.get(name, name)
    )


def _crash_message(end: _ChildEnd, test: TestResult) -> tuple[str, str]:
    """(status, plain-words message) for the test that was running when the process ended."""
    limit = test.limit or DEFAULT_TIMEOUT
    if end.killed_after is not None:
        return "timeout", (
            f"timed out after {limit:g} s and did not stop (stuck inside C code, or a deadlock?): "
            f"the grader ended the test process after {end.killed_after:.0f} s"
        )
    if (
        "+ Timeout +" in end.output_tail
    ):  # pytest-timeout's thread method (no SIGALRM, e.g. Windows) exits
        return "timeout", f"timed out after {limit:g} s (an infinite loop?)"
    if end.returncode < 0:
        how = f"was killed by {_signal_words(end.returncode)} while this test ran"
    else:
        how = (
            f"exited with code {end.returncode} while this test ran "
            "(os._exit, or a library that ended the process?)"
        )
    return "crashed", f"crashed: the test process {how}; the other tests ran in a fresh process"


def _not_run_message(end: _ChildEnd) -> str:
    """Why pytest ended outside any test: a collection error (file and exception) or how the process ended."""
    text = f"not run: the test process ended ({_signal_words(end.returncode)}) before this test could run"
    files = re.findall(r"ERROR collecting (\S+)", end.output_tail)
    errors = [
        ln[1:].strip()
        for ln in end.output_tail.splitlines()
        if re.match(r"^E\s+\w*(Error|Exception)\b", ln)
    ]
    if files:
        text += f": a collection error in {files[0]}" + (f" ({errors[0]})" if errors else "")
    elif errors:
        text += f": {errors[-1]}"
    return text


def grade(
    chapters: list[str] | None = None,
    impl: str = "exercises",
    report_dir: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    tests_dir: Path | None = None,
    root: Path | None = None,
    progress: TextIO | None = None,
) -> Report:
    """Run the graded tests for ``chapters`` (default: all) against ``impl`` and return the ``Report``.

    Args:
        chapters: e.g. ``["ch01", "3"]``; None or empty grades every chapter.
        impl: ``"exercises"`` (the learner's files) or ``"solutions"``.
        report_dir: when given, write results.json, junit.xml and summary.md there.
        timeout: seconds per test (pytest-timeout); a test past it fails, the others still run. A test
            with its own larger ``@pytest.mark.timeout(N)`` keeps N.
        tests_dir: folder of graded tests (default ``<root>/tests/exercises``).
        root: the working directory of the pytest subprocess (default: the repository root).
        progress: a text stream for live progress (a line per chapter); None prints nothing.

    Raises:
        ValueError: a bad chapter name, impl or timeout.
        GradingInterrupted: Ctrl-C; the test process group was killed, ``err.report`` holds the
            tests that finished (``not_run`` the others). No report files are written.
    """
    if impl not in ("exercises", "solutions"):
        raise ValueError(f"impl must be 'exercises' or 'solutions', got {impl!r}")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    wanted = sorted({normalize_chapter(c) for c in chapters or []})
    root = Path(root or ROOT)
    tests_dir = Path(tests_dir or root / "tests" / "exercises")
    bar = Progress(progress) if progress is not None else None
    collected: dict[str, TestResult] = {}
    results: dict[
        str, tuple[str, str]
    ] = {}  # nodeid -> (status, output) of the tests that finished
    finished: list[str] = []
    starts: dict[str, float] = {}  # nodeid -> when its start event was read
    begun = time.monotonic()

    def settle(nodeid: str, status: str, output: str = "", message: str = "") -> None:
        test = collected[nodeid]
        test.status, test.output, test.message = status, output, message
        test.duration = time.monotonic() - starts[nodeid] if nodeid in starts else None
        if nodeid not in finished:
            finished.append(nodeid)
        if bar is not None:
            bar.finish(test)

    def on_event(ev: dict) -> None:
        kind = ev["event"]
        if kind == "collected":
            collected.setdefault(
                ev["nodeid"],
                TestResult(
                    ev["nodeid"],
                    ev["id"],
                    ev["points"],
                    limit=ev.get("timeout") or timeout,
                    uses=tuple(ev.get("uses", ())),
                    all_or_nothing=bool(ev.get("all_or_nothing", False)),
                ),
            )
        elif kind == "start":
            if bar is not None:
                bar.begin(list(collected.values()))
                bar.start(collected[ev["nodeid"]])
            starts[ev["nodeid"]] = time.monotonic()
        elif kind == "result":
            _record(results, ev)
        elif kind == "finish" and ev["nodeid"] in collected:
            status, output = results.get(ev["nodeid"], ("failed", "no result recorded"))
            message = ""
            if status == "timeout":
                test = collected[ev["nodeid"]]
                where = _timeout_location(output)
                message = f"timed out after {test.limit:g} s (an infinite loop?)" + (
                    f" at {where}" if where else ""
                )
            elif status == "blocked":
                found = re.search(r"BlockedByTimeout: (blocked: .*)", output)
                message = found.group(1).strip() if found else "blocked by an earlier timeout"
            settle(ev["nodeid"], status, output, message)

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "events.jsonl"
        targets = [str(tests_dir)]
        try:
            while True:  # each round either finishes or settles at least the test that crashed
                end = _run_pytest(
                    targets,
                    impl,
                    timeout,
                    wanted,
                    root,
                    log,
                    on_event,
                    lambda nodeid: collected[nodeid].limit if nodeid in collected else timeout,
                )
                if bar is not None and collected:
                    bar.begin(list(collected.values()))
                pending = [n for n in collected if n not in finished]
                if not pending:
                    break
                if end.running in pending:  # the process died (or was stopped) while this test ran
                    status, message = _crash_message(end, collected[end.running])
                    settle(end.running, status, end.output_tail, message)
                    pending.remove(end.running)
                    targets = pending
                    continue
                # it died outside any test (a collection error, a session fixture): no retry can help
                message = _not_run_message(end)
                for nodeid in pending:
                    settle(nodeid, "crashed", end.output_tail, message)
                break
        except KeyboardInterrupt:
            if bar is not None:
                bar.end_line()
            report = Report(impl=impl, interrupted=True, seconds=time.monotonic() - begun)
            report.tests = [collected[n] for n in collected if n in finished]
            report.not_run = [collected[n] for n in collected if n not in finished]
            apply_all_or_nothing(report.tests, tuple({t.exercise for t in report.not_run}))
            raise GradingInterrupted(report) from None
    if bar is not None:
        bar.end_line()
    report = Report(impl=impl, seconds=time.monotonic() - begun)
    report.tests = apply_all_or_nothing(list(collected.values()))
    if report_dir is not None:
        report.write(Path(report_dir))
    return report


def _record(results: dict, ev: dict) -> None:
    nodeid, outcome, output = ev["nodeid"], ev["outcome"], ev["output"]
    if outcome == "passed":
        results.setdefault(nodeid, ("passed", ""))
        return
    status = "skipped" if outcome == "skipped" else "failed"
    if ev.get("timeout"):
        status = "timeout"
    elif ev.get("blocked"):
        status = "blocked"
    if ev["when"] != "call":
        output = f"[{ev['when']}] {output}"
    if (
        results.get(nodeid, ("passed",))[0] == "passed"
    ):  # the first failure wins (call before teardown)
        results[nodeid] = (status, output)


# ----------------------------------------------------------------------------- command line
def _wrap(text: str, indent: int, width: int) -> str:
    """``text`` wrapped to ``width`` columns, continuation lines indented by ``indent``: never cut."""
    return textwrap.fill(
        text,
        width=max(width, indent + 40),
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _summary_lines(report: Report, width: int) -> list[str]:
    failing = [t for t in report.tests if t.status != "passed"]
    lines = []
    for ex_id in sorted({t.exercise for t in failing}):
        tests = [t for t in report.tests if t.exercise == ex_id]
        bad = [t for t in tests if t.status != "passed"]
        reason = bad[0].reason
        stub = re.search(r"NotImplementedError: (ch\d\d\.ex\d+[a-z]?):", reason)
        broken = [
            u
            for u in bad[0].uses
            if any(t.exercise == u and t.status != "passed" for t in report.tests)
        ]
        if stub and stub.group(1) != ex_id:  # this exercise calls an unfinished one
            reason = f"needs {stub.group(1)} first ({reason})"
        elif broken and not re.match(r"(\w+: )?needs ch\d\d\.ex", reason):
            # it runs an earlier exercise of the learner's that fails its own tests (a test that already
            # names what it needs first, as the capstone does in course order, keeps its own words)
            first = next(
                t for t in report.tests if t.exercise == broken[0] and t.status != "passed"
            )
            reason = f"{ex_id} uses your {broken[0]}, which fails: {first.reason} (fix {broken[0]} first)"
        plain = reason.startswith(("timed out", "crashed", "not run", "skipped", "blocked"))
        status = "" if plain else f"{_STATUS_WORDS[bad[0].status]}: "
        blocked = sum(t.status == "blocked" for t in bad)
        if blocked and bad[0].status == "timeout":
            reason += f" ({blocked} more test{'s' * (blocked > 1)} blocked: they call it too)"
        if bad[0].all_or_nothing:
            reason += " (spot the bug: graded all or nothing, 0 points until every test passes)"
        lines.append(
            _wrap(f"  {ex_id:<9} {len(bad)}/{len(tests)} failing, e.g. {status}{reason}", 12, width)
        )
    return lines


def main(argv: list[str], *, tests_dir: Path | None = None, root: Path | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paged grade",
        description="Grade the exercises in a subprocess, a line per chapter as it runs.",
        epilog="Exit status: 0 (learners), 1 with --strict below full marks, 130 on Ctrl-C (the tests that "
        "finished are shown).",
    )
    parser.add_argument(
        "chapters", nargs="*", help="chapters to grade, e.g. ch01 ch03 (default: all)"
    )
    parser.add_argument(
        "--impl",
        choices=["exercises", "solutions"],
        default="exercises",
        help="grade your exercises/ (default) or the reference solutions/",
    )
    parser.add_argument(
        "--report", type=Path, metavar="DIR", help="write results.json, junit.xml, summary.md"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=f"seconds per test (default {DEFAULT_TIMEOUT:g}; the few tests that need more carry "
        "their own larger limit)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print every failing test's output"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 unless every graded test passed (GitHub Classroom awards points on exit 0)",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    try:
        wanted = [normalize_chapter(c) for c in args.chapters]
    except ValueError as err:
        parser.error(str(err))
    width = min(shutil.get_terminal_size((100, 24)).columns, 120) - 1
    stopped: list[int] = []

    def stop(
        signum, frame
    ):  # SIGTERM / SIGHUP: stop like Ctrl-C, so the pytest child never outlives us
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = {}
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            try:
                previous[getattr(signal, name)] = signal.signal(getattr(signal, name), stop)
            except ValueError:  # not the main thread: leave the handlers alone
                pass
    try:
        print(
            f"grading {args.impl}/ {' '.join(wanted) or '(all chapters)'}: at most {args.timeout:g} s per test",
            flush=True,
        )
        try:
            report = grade(
                wanted,
                args.impl,
                args.report,
                args.timeout,
                tests_dir=tests_dir,
                root=root,
                progress=sys.stdout,
            )
        except GradingInterrupted as err:
            report = err.report
            print(
                f"\ninterrupted: stopped the test process; {len(report.tests)} of "
                f"{len(report.tests) + len(report.not_run)} tests had finished.\n"
            )
            print(report.table())
            lines = _summary_lines(report, width)
            if lines:
                print("\nnot yet passing, of the tests that ran:")
                print("\n".join(lines))
            if args.report:
                print(f"\nno report written to {args.report}/ (the run was interrupted)")
            return 128 + (stopped[0] if stopped else signal.SIGINT)
        if not report.tests:
            print(
                f"no graded tests found for {' '.join(wanted) or 'any chapter'} in "
                f"{tests_dir or 'tests/exercises'}"
            )
            return 1
        print()
        print(report.table())
        failing = [t for t in report.tests if t.status != "passed"]
        if failing and not args.verbose:
            print("\nnot yet passing (one line per exercise; -v shows every test and its output):")
            print("\n".join(_summary_lines(report, width)))
        for t in failing if args.verbose else []:
            print(f"\n{t.exercise} {t.nodeid}: {_STATUS_WORDS[t.status]}")
            print(_wrap("    " + t.reason, 4, width))
            print("\n".join("    " + ln for ln in t.output.splitlines()[-30:]))
        if args.report:
            print(f"\nreport written to {args.report}/ (results.json, junit.xml, summary.md)")
        return int(args.strict and report.score < report.max_score)
    except KeyboardInterrupt:  # a second Ctrl-C while printing: stop quietly
        print("\ninterrupted", flush=True)
        return 128 + (stopped[0] if stopped else signal.SIGINT)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
