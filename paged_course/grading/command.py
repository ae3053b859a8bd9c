"""``python -m paged grade``: the command line around :func:`~paged_course.grading.runner.grade`.

Parses the arguments, prints the progress, the table and a line per failing exercise, turns SIGTERM / SIGHUP
into a Ctrl-C (so the test process never outlives the command) and chooses the exit status: 0 for learners,
1 with ``--strict`` below full marks, 128 + the signal when stopped.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path

from paged_course.grading.progress import _summary_lines, _wrap
from paged_course.grading.reports import _STATUS_WORDS
from paged_course.grading.runner import (
    DEFAULT_TIMEOUT,
    GradingInterrupted,
    grade,
    normalize_chapter,
)


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
