"""``python -m paged grade``: a hung, stuck or crashing test costs only itself, progress streams per chapter,
reasons are plain words and never cut before expected/got, Ctrl-C stops everything and shows what finished.

The behaviour tests run the grader on tiny synthetic folders of graded tests (no torch), with limits of
about a second, so the whole file takes a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from paged_course import grading
from paged_course.grading import (
    GradingInterrupted,
    Report,
    TestResult,
    grade,
    normalize_chapter,
    progress,
    reports,
    runner,
)

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--impl", default="solutions")

def pytest_configure(config):
    config.addinivalue_line("markers", "exercise(id, points): graded")
"""

TESTS = """
import os, signal, time, pytest

@pytest.mark.exercise("ch01.ex1", points=2)
def test_ok():
    assert 1 + 1 == 2

@pytest.mark.exercise("ch01.ex2", points=3)
def test_infinite_loop():
    while True:
        time.sleep(0.01)

@pytest.mark.exercise("ch01.ex3", points=1)
def test_crash():
    os._exit(3)  # kills the whole test process, like a segfault in learner code

@pytest.mark.exercise("ch01.ex4", points=1)
def test_stuck_where_the_timeout_cannot_reach():
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # like a loop inside C code: pytest-timeout's alarm is lost
    time.sleep(60)

@pytest.mark.exercise("ch01.ex5", points=2)
@pytest.mark.timeout(20)
def test_slow_with_its_own_limit():
    time.sleep(1.5)  # longer than the run's --timeout, within its own limit

@pytest.mark.exercise("ch01.ex5", points=1)
@pytest.mark.timeout(0.2)
def test_own_limit_below_the_run_timeout():
    time.sleep(0.5)  # --timeout is larger than the marker: the larger limit wins

@pytest.mark.exercise("ch02.ex1", points=4)
def test_skipped():
    pytest.skip("needs a GPU")

@pytest.mark.exercise("ch02.ex2", points=5)
def test_after_the_crash(request):
    assert request.config.getoption("--impl") == "solutions", "passes only on the reference solutions"

@pytest.mark.exercise("ch02.ex3", points=1)
def test_long_message():
    assert False, "lengths " + ", ".join(str(i) for i in range(400)) + ": expected 3 requests to fit, got 2"

def test_not_graded():
    assert False
"""


def _suite(folder: Path, tests: str = TESTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (folder / "test_tiny.py").write_text(textwrap.dedent(tests))
    return folder


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grader run on the synthetic suite (--timeout 1 s, watchdog floor 1 s): (report, progress text, dir)."""
    tmp = tmp_path_factory.mktemp("grade")
    suite = _suite(tmp / "suite")
    stream = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "WATCHDOG_FLOOR_S", 1.0)
        report = grade(
            impl="solutions",
            timeout=1,
            tests_dir=suite,
            root=suite,
            report_dir=tmp / "report",
            progress=stream,
        )
    return report, stream.getvalue(), tmp / "report"


def _by_name(report: Report) -> dict[str, TestResult]:
    return {t.nodeid.split("::")[-1]: t for t in report.tests}


def test_hang_stuck_and_crash_cost_only_themselves(graded):
    report, _, _ = graded
    status = {name: t.status for name, t in _by_name(report).items()}
    assert status == {
        "test_ok": "passed",
        "test_infinite_loop": "timeout",
        "test_crash": "crashed",
        "test_stuck_where_the_timeout_cannot_reach": "timeout",
        "test_slow_with_its_own_limit": "passed",
        "test_own_limit_below_the_run_timeout": "passed",
        "test_skipped": "skipped",
        "test_after_the_crash": "passed",
        "test_long_message": "failed",
    }, status
    assert (report.score, report.max_score) == (10, 20), (
        "only the unmarked test is left out of grading"
    )
    assert report.by_chapter() == {"ch01": (5, 10), "ch02": (5, 10)}


def test_each_test_has_its_limit(graded):
    tests = _by_name(graded[0])
    assert tests["test_ok"].limit == 1, "--timeout applies to a test without its own limit"
    assert tests["test_slow_with_its_own_limit"].limit == 20, "a test's own larger limit wins"
    assert tests["test_own_limit_below_the_run_timeout"].limit == 1, (
        "a larger --timeout wins over the marker"
    )
    assert grading.watchdog_seconds(10) == 15 and grading.watchdog_seconds(60) == 90, (
        "the watchdog scales with the limit: a C-level hang ends a few seconds after it"
    )


def test_reasons_are_plain_words(graded):
    tests = _by_name(graded[0])
    loop = tests["test_infinite_loop"].reason
    assert re.fullmatch(
        r"timed out after 1 s \(an infinite loop\?\) at test_tiny\.py:\d+ \(in test_infinite_loop\)",
        loop,
    ), loop
    assert "pytest-timeout" not in loop and "<function" not in loop
    crash = tests["test_crash"].reason
    assert crash.startswith("crashed: the test process exited with code 3 while this test ran"), (
        crash
    )
    stuck = tests["test_stuck_where_the_timeout_cannot_reach"].reason
    assert (
        stuck.startswith("timed out after 1 s and did not stop")
        and "ended the test process" in stuck
    ), stuck
    assert tests["test_skipped"].reason == "skipped: needs a GPU"
    long = tests["test_long_message"].reason
    assert long.startswith("AssertionError: lengths 0, 1, 2") and long.endswith(
        "expected 3 requests to fit, got 2"
    ), "a long assertion message keeps its head and its expected/got end"
    assert len(long) <= reports._MAX_REASON


def test_progress_line_per_chapter(graded):
    _, text, _ = graded
    lines = text.splitlines()
    assert lines[0] == (
        "9 tests in 2 chapters (. passed  F failed  T timed out  B blocked by a timeout  C crashed  "
        "s skipped)"
    ), lines
    assert re.fullmatch(r"ch01 \.TCT\.\.\s+5/10 points  \(\d+\.\d s\)", lines[1]), lines[1]
    assert re.fullmatch(r"ch02 s\.F\s+5/10 points  \(\d+\.\d s\)", lines[2]), lines[2]
    assert len(lines) == 3 and "\r" not in text and "\x1b" not in text, (
        "plain lines: a terminal and a notebook"
    )
    assert lines[1].index("points") == lines[2].index("points"), "the points line up"


def test_report_files(graded):
    _, _, folder = graded
    results = json.loads((folder / "results.json").read_text())
    assert results["score"] == 10 and results["max_score"] == 20
    skipped = next(t for t in results["tests"] if "test_skipped" in t["name"])
    assert (
        skipped["status"] == "failed"
        and skipped["score"] == 0
        and "needs a GPU" in skipped["output"]
    ), "Gradescope: a skipped test counts as failed with its reason"
    loop = next(t for t in results["tests"] if "test_infinite_loop" in t["name"])
    assert loop["output"].startswith("timed out after 1 s (an infinite loop?)"), loop["output"][
        :200
    ]
    junit = (folder / "junit.xml").read_text()
    assert "<testsuite" in junit and 'message="timed out after 1 s (an infinite loop?)' in junit
    summary = (folder / "summary.md").read_text()
    assert "**10 / 20**" in summary and "crashed: the test process exited with code 3" in summary


def test_summary_lines_wrap_instead_of_cutting(graded):
    report, _, _ = graded
    lines = progress._summary_lines(report, width=72)
    text = "\n".join(lines)
    assert all(len(line) <= 72 for line in text.splitlines()), text
    entry = next(line for line in lines if "ch02.ex3" in line)
    joined = " ".join(part.strip() for part in entry.splitlines())
    assert joined.endswith("expected 3 requests to fit, got 2"), joined
    assert all(part.startswith(" " * 12) for part in entry.splitlines()[1:]), (
        "continuation lines are indented"
    )


def test_error_message_keeps_the_expected_got_lines():
    output = (
        "    def test_x():\n>       assert got == 5, f'length 17 needs 2 blocks,\\n got {got}'\n"
        "E       AssertionError: length 17 needs 2 blocks,\n"
        "E          got 1\n"
        "E       assert 1 == 5\n"
        "E         +1\n\ntest_x.py:3: AssertionError\n"
    )
    assert reports._error_message(output) == "AssertionError: length 17 needs 2 blocks, got 1"
    bare = "E       assert 1 == 5\nE        +  where 1 = f()\n"
    assert reports._error_message(bare) == "assert 1 == 5 +  where 1 = f()", (
        "no message: pytest's diff is the reason"
    )
    plain = (
        "E       AssertionError: fully cached prompt: at most max_blocks blocks\n"
        "E       assert [7, 1, 4] == [7, 1]\n"
        "E         Left contains one more item: 4\n"
    )
    assert (
        reports._error_message(plain)
        == "AssertionError: fully cached prompt: at most max_blocks blocks: assert [7, 1, 4] == [7, 1]"
    ), "a message without got / expected keeps pytest's comparison, which shows both"
    long = "A" * 3000 + " expected 7, got 9"
    short = reports.shorten_middle(long, 300)
    assert len(short) <= 300 and short.endswith("expected 7, got 9") and short.startswith("AAA")


def test_a_collection_error_is_reported_in_plain_words(tmp_path):
    """A collection error ends pytest outside any test: the pending tests say so in plain words."""
    suite = _suite(tmp_path / "suite", TESTS.split('@pytest.mark.exercise("ch01.ex2"')[0])
    (suite / "test_broken.py").write_text("def test_(:\n")
    report = grade(impl="solutions", timeout=1, tests_dir=suite, root=suite)
    [test] = report.tests
    assert test.status == "crashed" and test.reason == (
        "not run: the test process ended (exit code 2) before this test could run: a collection error in "
        "test_broken.py (SyntaxError: invalid syntax)"
    ), test.reason


def test_chapter_filter_and_impl(tmp_path):
    suite = _suite(tmp_path / "suite")
    report = grade(["2"], impl="exercises", timeout=1, tests_dir=suite, root=suite)
    assert sorted(t.exercise for t in report.tests) == ["ch02.ex1", "ch02.ex2", "ch02.ex3"], (
        "only chapter 02"
    )
    assert report.score == 0, "--impl exercises reaches the tests"


QUICK = """
import pytest

@pytest.mark.exercise("ch01.ex1", points=2)
def test_ok():
    assert True

@pytest.mark.exercise("ch01.ex2", points=1)
def test_wrong():
    assert 2 + 2 == 5, "expected 5, got 4"
"""


def test_cli_exit_codes_and_output(tmp_path):
    suite = _suite(tmp_path / "suite", QUICK)
    runs = {}
    for flags in ([], ["--strict"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = grading.main(
                ["--impl", "solutions", "--timeout", "5", *flags], tests_dir=suite, root=suite
            )
        runs[tuple(flags)] = (rc, out.getvalue())
    rc, text = runs[()]
    assert rc == 0, "learners always get exit code 0"
    assert runs[("--strict",)][0] == 1, "--strict: exit 1 below full marks (GitHub Classroom)"
    assert text.startswith("grading solutions/ (all chapters): at most 5 s per test\n"), text
    assert re.search(r"^ch01 \.F\s+2/3 points  \(\d+\.\d s\)$", text, flags=re.MULTILINE), text
    assert "  ch01.ex2  1/1 failing, e.g. failed: AssertionError: expected 5, got 4" in text, text
    assert "total       2/3" in text


STUCK = """
import os, subprocess, sys, time, pytest

@pytest.mark.exercise("ch01.ex1", points=2)
def test_ok():
    assert True

@pytest.mark.exercise("ch02.ex1", points=3)
@pytest.mark.timeout(120)
def test_runs_until_interrupted():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["PIDS_FILE"] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(os.environ["PIDS_FILE"] + ".tmp", os.environ["PIDS_FILE"])
    time.sleep(120)
"""

RUNNER = """
import signal, sys
from pathlib import Path
# a job started in the background of a non-interactive shell inherits SIGINT ignored; a terminal's Ctrl-C does not
signal.signal(signal.SIGINT, signal.default_int_handler)
from paged_course.grading import main
sys.exit(main(sys.argv[2:], tests_dir=Path(sys.argv[1]), root=Path(sys.argv[1])))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (
        stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    )  # a zombie is gone


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a process: POSIX")
def test_ctrl_c_stops_the_tests_and_shows_what_finished(tmp_path):
    suite = _suite(tmp_path / "suite", STUCK)
    pids_file = tmp_path / "pids"
    env = dict(os.environ, PIDS_FILE=str(pids_file), PYTHONPATH=str(ROOT))
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(suite), "--report", str(tmp_path / "rep")],
            stdout=out,
            stderr=err,
            env=env,
            cwd=tmp_path,
        )
        try:
            deadline = time.monotonic() + 60
            while not pids_file.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pids_file.exists(), (tmp_path / "out").read_text()
            pytest_pid, grandchild = map(int, pids_file.read_text().split())
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    text, errors = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert rc == 130, (rc, text, errors)
    assert "Traceback" not in text + errors and "KeyboardInterrupt" not in text + errors, errors
    assert "interrupted: stopped the test process; 1 of 2 tests had finished." in text, text
    assert re.search(r"^ch01 \.\s+2/2 points", text, flags=re.MULTILINE), text
    assert re.search(r"^ch01\s+2/2\s+1/1 passed$", text, flags=re.MULTILINE), text
    assert re.search(r"^ch02\s+-\s+not run \(1 test\)$", text, flags=re.MULTILINE), text
    assert "no report written" in text and not (tmp_path / "rep").exists()
    deadline = time.monotonic() + 10
    while (_alive(pytest_pid) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pytest_pid), "the pytest child is stopped"
    assert not _alive(grandchild), "and so is what the test started"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_grader_leaves_no_test_process(tmp_path):
    """SIGKILL cannot be caught: the kernel ends the test process when the grader dies (e.g. a CI step timeout)."""
    suite = _suite(tmp_path / "suite", STUCK)
    pids_file = tmp_path / "pids"
    env = dict(os.environ, PIDS_FILE=str(pids_file), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(suite)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while not pids_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        pytest_pid, grandchild = map(int, pids_file.read_text().split())
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _alive(pytest_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(pytest_pid)
    for pid in (pytest_pid, grandchild):  # tidy up whatever is left
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not alive, "the pytest child died with the grader"


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to a process: POSIX")
def test_interrupt_inside_grade_raises_with_the_partial_report(tmp_path, monkeypatch):
    """From Python (a notebook cell), Ctrl-C raises GradingInterrupted: a KeyboardInterrupt with the partial report."""
    suite = _suite(tmp_path / "suite", STUCK)
    pids_file = tmp_path / "pids"
    monkeypatch.setenv("PIDS_FILE", str(pids_file))

    def press_ctrl_c():
        deadline = time.monotonic() + 60
        while not pids_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # what a notebook's interrupt button does to its kernel

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=press_ctrl_c, daemon=True).start()
        with pytest.raises(GradingInterrupted) as err:
            grade(impl="solutions", timeout=5, tests_dir=suite, root=suite)
    finally:
        signal.signal(signal.SIGINT, previous)
    report = err.value.report
    assert isinstance(err.value, KeyboardInterrupt) and report.interrupted
    assert [t.nodeid.split("::")[-1] for t in report.tests] == ["test_ok"]
    assert [t.nodeid.split("::")[-1] for t in report.not_run] == ["test_runs_until_interrupted"]
    assert report.table().splitlines()[-1].endswith("(interrupted: 1 of 2 tests ran)")
    pytest_pid, grandchild = map(int, pids_file.read_text().split())
    deadline = time.monotonic() + 10
    while (_alive(pytest_pid) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pytest_pid) and not _alive(grandchild), "nothing outlives the interrupt"


@pytest.mark.slow  # two pytest subprocesses importing torch; CI's stub check covers the stub half
def test_ex01_solutions_full_points_and_stubs_zero():
    full = grade(["ch01"], impl="solutions")
    assert full.tests and full.score == full.max_score > 0, full.table()
    stubs = grade(["ch01"], impl="exercises")
    assert stubs.max_score == full.max_score and stubs.score == 0, (
        "graded tests must fail on the stubs"
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="chapter"):
        normalize_chapter("chapter-one")
    with pytest.raises(ValueError, match="impl"):
        grade(impl="mine")
    with pytest.raises(ValueError, match="timeout"):
        grade(timeout=0)
    assert normalize_chapter("1") == normalize_chapter("ch01") == "ch01"
    assert grading.DEFAULT_TIMEOUT == 10


USES = """
import pytest

@pytest.mark.exercise("ch03.ex1", points=1)
def test_earlier():
    assert [1, 2] == [1, 3], "the earlier piece keeps its order"

@pytest.mark.exercise("ch03.ex2", points=1, uses=("ch03.ex1",))
def test_later():
    assert False, "the later piece gives a wrong total"
"""


def test_a_failure_that_comes_from_an_earlier_exercise_names_it(tmp_path):
    suite = _suite(tmp_path / "suite", USES)
    report = grade(impl="solutions", timeout=5, tests_dir=suite, root=suite)
    later = next(line for line in progress._summary_lines(report, width=400) if "ch03.ex2" in line)
    assert (
        "ch03.ex2 uses your ch03.ex1, which fails: AssertionError: the earlier piece keeps its order"
        in later
    )
    assert "(fix ch03.ex1 first)" in later


NAMES_ITS_NEEDS = """
import pytest

@pytest.mark.exercise("ch02.ex1", points=1)
def test_early():
    raise NotImplementedError("ch02.ex1: the free queue")

@pytest.mark.exercise("ch07.ex2", points=1)
def test_late():
    raise NotImplementedError("ch07.ex2: the sequence's K/V")

@pytest.mark.exercise("ch07.ex1", points=1, uses=("ch07.ex2", "ch02.ex1"))
def test_capstone():
    assert False, "needs ch02.ex1 first: 2 regions are not written yet, in course order: ch02.ex1, ch07.ex2"
"""


def test_a_failure_that_names_what_it_needs_first_keeps_its_words(tmp_path):
    """The capstone lists the unwritten regions in course order; the summary must not replace that with the
    first failing exercise of its ``uses`` (a late one, ch07.ex2)."""
    suite = _suite(tmp_path / "suite", NAMES_ITS_NEEDS)
    report = grade(impl="solutions", timeout=5, tests_dir=suite, root=suite)
    line = next(x for x in progress._summary_lines(report, width=400) if "ch07.ex1" in x)
    assert (
        "needs ch02.ex1 first: 2 regions are not written yet, in course order: ch02.ex1, ch07.ex2"
        in line
    )
    assert "uses your ch07.ex2" not in line


LEARNER = """
def spin(n):
    while True:
        n += 1


def fine():
    return 1
"""

BLOCKING = """
import pytest
from learner import fine, spin

@pytest.mark.exercise("ch01.ex1", points=1)
def test_first_call_loops():
    spin(0)

@pytest.mark.exercise("ch01.ex1", points=1)
def test_second_call_of_the_same_function():
    assert fine() == 1
    spin(1)

@pytest.mark.exercise("ch01.ex1", points=1)
def test_another_function_of_the_region():
    assert fine() == 1

@pytest.mark.exercise("ch01.ex2", points=1)
def test_another_region_waits_its_own_limit():
    spin(2)
"""


def test_a_regions_later_tests_that_call_the_timed_out_function_are_blocked_at_once(tmp_path):
    suite = _suite(tmp_path / "suite", BLOCKING)
    (suite / "learner.py").write_text(textwrap.dedent(LEARNER))
    stream = io.StringIO()
    report = grade(impl="solutions", timeout=1, tests_dir=suite, root=suite, progress=stream)
    tests = _by_name(report)
    status = {name: t.status for name, t in tests.items()}
    assert status == {
        "test_first_call_loops": "timeout",
        "test_second_call_of_the_same_function": "blocked",
        "test_another_function_of_the_region": "passed",
        "test_another_region_waits_its_own_limit": "timeout",
    }, status
    blocked = tests["test_second_call_of_the_same_function"]
    assert blocked.duration is not None and blocked.duration < 0.8, (
        f"a blocked test must not wait out its 1 s limit: it took {blocked.duration:.2f} s"
    )
    assert re.fullmatch(
        r"blocked: calls spin \(learner\.py:\d+\), which timed out in test_first_call_loops; "
        r"not run again \(fix that loop first\)",
        blocked.reason,
    ), blocked.reason
    assert (
        re.search(r"^ch01 TB\.T ", stream.getvalue(), re.M) and "B blocked" in stream.getvalue()
    ), stream.getvalue()
    summary = "\n".join(progress._summary_lines(report, 200))
    assert "at learner.py:3 (in spin) (1 more test blocked: they call it too)" in summary, summary


SPOT_THE_BUG = """
import pytest

@pytest.mark.exercise("ch02.ex6", points=2, all_or_nothing=True)
def test_the_planted_bug_passes_this_one():
    assert True

@pytest.mark.exercise("ch02.ex6", points=3, all_or_nothing=True)
def test_and_fails_this_one():
    assert [1, 2] == [2, 1], "the symptom: blocks come back in the wrong order"

@pytest.mark.exercise("ch02.ex7", points=1, all_or_nothing=True)
def test_a_fixed_region_scores_in_full():
    assert True

@pytest.mark.exercise("ch02.ex8", points=4)
def test_an_ordinary_region_keeps_partial_credit():
    assert True
"""


def test_an_all_or_nothing_region_scores_0_unless_every_test_passes(tmp_path):
    suite = _suite(tmp_path / "suite", SPOT_THE_BUG)
    out = io.StringIO()
    report = grade(impl="solutions", timeout=5, tests_dir=suite, root=suite, progress=out)
    tests = _by_name(report)
    passing = tests["test_the_planted_bug_passes_this_one"]
    assert passing.status == "passed" and passing.withheld and passing.score == 0
    assert tests["test_a_fixed_region_scores_in_full"].score == 1
    assert tests["test_an_ordinary_region_keeps_partial_credit"].score == 4
    assert (report.score, report.max_score) == (5, 10), report.table()
    assert re.search(r"\b5/10 points", out.getvalue()), out.getvalue()
    results = report.gradescope()
    by_name = {t["name"].split(" ", 1)[1]: t for t in results["tests"]}
    withheld = by_name["test_the_planted_bug_passes_this_one"]
    assert withheld["score"] == 0 and withheld["status"] == "failed", withheld
    assert "all or nothing" in withheld["output"]
    assert results["score"] == 5 and not [
        t for t in results["tests"] if t["score"] and t["status"] != "passed"
    ]
    assert 'failures="2"' in report.junit()
    line = next(x for x in progress._summary_lines(report, width=400) if "ch02.ex6" in x)
    assert "1/2 failing" in line and "graded all or nothing" in line, line


def test_all_or_nothing_counts_a_region_with_tests_not_run_as_failing():
    done = grading.TestResult("t::a", "ch05.ex9", 2, status="passed", all_or_nothing=True)
    plain = grading.TestResult("t::b", "ch05.ex1", 2, status="passed")
    grading.apply_all_or_nothing([done, plain], unfinished=("ch05.ex9",))
    assert done.withheld and done.score == 0 and plain.score == 2
    grading.apply_all_or_nothing([done, plain])
    assert not done.withheld and done.score == 2, "the mark is recomputed, not sticky"
