"""``python -m paged grade``: full points on solutions, zero on stubs, a hung or crashing test costs only itself."""

from __future__ import annotations

import json
import textwrap

import pytest

from paged_course.grading import grade, normalize_chapter

CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--impl", default="solutions")

def pytest_configure(config):
    config.addinivalue_line("markers", "exercise(id, points): graded")
'''

TESTS = '''
import os, time, pytest

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

@pytest.mark.exercise("ch02.ex1", points=4)
def test_skipped():
    pytest.skip("needs a GPU")

@pytest.mark.exercise("ch02.ex2", points=5)
def test_after_the_crash(request):
    assert request.config.getoption("--impl") == "solutions", "passes only on the reference solutions"

def test_not_graded():
    assert False
'''


@pytest.fixture
def tiny_suite(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(TESTS))
    return tmp_path


def test_hang_and_crash_cost_only_themselves(tiny_suite, tmp_path):
    report = grade(impl="solutions", timeout=2, tests_dir=tiny_suite, root=tiny_suite, report_dir=tmp_path / "report")
    status = {t.nodeid.split("::")[-1]: t.status for t in report.tests}
    assert status == {"test_ok": "passed", "test_infinite_loop": "timeout", "test_crash": "crashed",
                      "test_skipped": "skipped", "test_after_the_crash": "passed"}, status
    assert (report.score, report.max_score) == (7, 15), "only the unmarked test is left out of grading"
    assert report.by_chapter() == {"ch01": (2, 6), "ch02": (5, 9)}
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["score"] == 7 and results["max_score"] == 15
    skipped = next(t for t in results["tests"] if "test_skipped" in t["name"])
    assert skipped["status"] == "failed" and skipped["score"] == 0 and "needs a GPU" in skipped["output"], \
        "Gradescope: a skipped test counts as failed with its reason"
    assert "<testsuite" in (tmp_path / "report" / "junit.xml").read_text()
    assert "**7 / 15**" in (tmp_path / "report" / "summary.md").read_text()


def test_chapter_filter_and_impl(tiny_suite):
    report = grade(["2"], impl="exercises", timeout=2, tests_dir=tiny_suite, root=tiny_suite)
    assert sorted(t.exercise for t in report.tests) == ["ch02.ex1", "ch02.ex2"], "only chapter 02 is graded"
    assert report.score == 0, "--impl exercises reaches the tests"


@pytest.mark.slow  # two pytest subprocesses importing torch; CI's stub check covers the stub half
def test_ex01_solutions_full_points_and_stubs_zero():
    full = grade(["ch01"], impl="solutions", timeout=30)
    assert full.tests and full.score == full.max_score > 0, full.table()
    stubs = grade(["ch01"], impl="exercises", timeout=30)
    assert stubs.max_score == full.max_score and stubs.score == 0, "graded tests must fail on the stubs"


def test_bad_arguments():
    with pytest.raises(ValueError, match="chapter"):
        normalize_chapter("chapter-one")
    with pytest.raises(ValueError, match="impl"):
        grade(impl="mine")
    with pytest.raises(ValueError, match="timeout"):
        grade(timeout=0)
    assert normalize_chapter("1") == normalize_chapter("ch01") == "ch01"
