"""What the learner sees while and after grading: a line per chapter as tests finish (``Progress``) and
one line per exercise that is not yet passing (:func:`_summary_lines`).

Plain characters and newlines only, so it reads the same in a terminal, a CI log and a notebook cell.
"""

from __future__ import annotations

import re
import textwrap
import time
from typing import TextIO

from paged_course.grading.reports import (
    _STATUS_WORDS,
    _SYMBOL,
    Report,
    TestResult,
    apply_all_or_nothing,
)


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
            reason += " (graded all or nothing, 0 points until every test passes)"
        lines.append(
            _wrap(f"  {ex_id:<9} {len(bad)}/{len(tests)} failing, e.g. {status}{reason}", 12, width)
        )
    return lines
