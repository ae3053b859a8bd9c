"""What one grading run found and how it is written: ``TestResult``, ``Report`` and its writers.

``Report.write`` gives ``results.json`` (Gradescope's autograder format:
https://gradescope-autograders.readthedocs.io/en/latest/specs/ ; a skipped test counts as failed, with its
reason), ``junit.xml`` and ``summary.md``; ``Report.table`` is the per-chapter table the command prints. A
region graded all or nothing withholds the points of its passing tests until all pass
(:func:`apply_all_or_nothing`). The reason a test failed is read from pytest's output (:func:`_error_message`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree as ET

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
    "passed, but its region is graded all or nothing and another of its tests fails: "
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
