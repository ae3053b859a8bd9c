"""The learner's loop (``paged_course.check``), the mutation check (``paged_course.grading.mutants``) and the
capstone's part loader (``paged_course.capstone``), on the repository's own chapter 02 exercise."""

from __future__ import annotations

import shutil
import types

import pytest

from paged_course import capstone
from paged_course.check import (
    ROOT,
    check,
    describe_failure,
    learner_or_reference,
    run_check,
    solution,
)
from paged_course.grading import mutants

EX = "ch02.ex1"
FILE = "ex02_allocator.py"


@pytest.fixture
def wrong(tmp_path):
    """A copy of solutions/ whose ch02.ex1 hands out the back of the free list."""
    folder = tmp_path / "impl"
    shutil.copytree(ROOT / "solutions", folder)
    source = (folder / FILE).read_text()
    code = mutants.load_mutants()[FILE][EX]
    (folder / FILE).write_text(mutants.apply(source, EX, next(iter(code.values()))))
    return folder


def test_check_passes_on_the_reference_and_names_an_unwritten_stub(capsys):
    assert check(EX, impl="solutions") is True
    assert f"{EX} passes" in capsys.readouterr().out
    assert check(EX, impl="exercises") is False, "the untouched stub does not pass"
    out = capsys.readouterr().out
    assert "is not written yet" in out and "carries on with the reference" in out


def test_a_passing_check_names_the_file_it_ran(tmp_path, capsys):
    folder = tmp_path / "impl"
    shutil.copytree(ROOT / "solutions", folder)
    assert check(EX, impl=str(folder)) is True
    assert capsys.readouterr().out.strip().endswith(f"checks, on {folder}/{FILE}")


def test_check_shows_the_first_failing_case_in_plain_words(wrong, capsys):
    assert check(EX, impl=str(wrong)) is False
    out = capsys.readouterr().out
    assert "checks pass; the first failing one:" in out
    assert "check '" in out and "got" in out and "expected" in out, out


def test_results_are_cached_until_a_file_changes(wrong):
    first = run_check(EX, impl=str(wrong))
    assert run_check(EX, impl=str(wrong)) is first, "an unchanged folder is not checked twice"
    shutil.copyfile(ROOT / "solutions" / FILE, wrong / FILE)
    assert run_check(EX, impl=str(wrong)).ok, "an edited file is checked again"


def test_learner_or_reference_falls_back_with_one_line(capsys):
    assert learner_or_reference(EX, "mine", "reference", impl="exercises") == "reference"
    assert "using the reference for ch02.ex1" in capsys.readouterr().out
    assert learner_or_reference(EX, "mine", "reference", impl="solutions") == "mine"


def test_solution_prints_the_region_or_says_to_ask(capsys, monkeypatch, tmp_path):
    solution(EX)
    out = capsys.readouterr().out
    assert (
        out.startswith("# solutions/ex02_allocator.py") and "popleft" in out and "BEGIN" not in out
    )
    import paged_course.check as c

    monkeypatch.setattr(c, "ROOT", tmp_path)  # a student release: no solutions/
    solution(EX)
    assert "ask your instructor" in capsys.readouterr().out


def test_mutant_apply_replaces_only_the_region_body():
    source = "def f():\n    # BEGIN SOLUTION ch09.ex1 -- hint\n    return 1\n    # END SOLUTION\n    x = 2\n"
    out = mutants.apply(source, "ch09.ex1", "\n        return 2\n")
    assert (
        out
        == "def f():\n    # BEGIN SOLUTION ch09.ex1 -- hint\n    return 2\n    # END SOLUTION\n    x = 2\n"
    )


def test_every_planted_mutant_of_a_region_is_killed():
    killed, total, problems = mutants.run(["ch02"])
    assert total >= 3 and killed == total, problems


def test_learner_parts_take_passing_parts_and_fall_back_otherwise():
    parts, origin = capstone.learner_parts("solutions", parts=("allocator",))
    assert parts.allocator.__module__ == "solutions.ex02_allocator"
    assert (
        origin["allocator"] == "reference answers (solutions/ex02_allocator.py: BlockAllocator)"
    ), "parts from solutions/ are never called the learner's"
    parts, origin = capstone.learner_parts("exercises", parts=("allocator",))
    assert parts.allocator.__module__ == "paged.core.allocator", "an unfinished part falls back"
    assert "ch02.ex1" in origin["allocator"] and "not passing" in origin["allocator"]


def test_exercise_module_imports_the_saved_file_afresh_and_survives_a_syntax_error(
    tmp_path, monkeypatch, capsys
):
    from paged_course.check import exercise_module

    pkg = tmp_path / "learner_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    (pkg / "ex99_demo.py").write_text("ANSWER = 1\n")
    assert exercise_module("ex99_demo", impl="learner_pkg").ANSWER == 1
    (pkg / "ex99_demo.py").write_text("ANSWER = 2  # the learner saved an edit\n")
    assert exercise_module("ex99_demo", impl="learner_pkg").ANSWER == 2, (
        "the last saved edit is what runs"
    )
    (pkg / "ex99_demo.py").write_text("def broken(:\n")
    assert exercise_module("ex99_demo", impl="learner_pkg") is None
    assert "learner_pkg/ex99_demo.py does not import: SyntaxError" in capsys.readouterr().out


def test_learner_parts_take_the_file_their_checks_passed_not_a_stale_import(monkeypatch):
    import sys
    import types

    import paged_course.check as c

    stale = types.ModuleType(
        "solutions.ex02_allocator"
    )  # what the file held before the learner's last save
    stale.PART_REGIONS, stale.BlockAllocator = {"BlockAllocator": (EX,)}, object
    monkeypatch.setitem(sys.modules, "solutions.ex02_allocator", stale)
    monkeypatch.setattr(
        c, "_cache", {}
    )  # the file changed since its last check: the check runs again
    parts, origin = capstone.learner_parts("solutions", parts=("allocator",))
    assert (
        parts.allocator is not object and parts.allocator.__module__ == "solutions.ex02_allocator"
    ), "the engine must run the code the checks passed, not an import from before the last save"


def test_hint_gives_one_tier_per_call_then_points_at_the_solution(tmp_path, monkeypatch, capsys):
    import json

    import paged_course.check as c
    from paged_course.check import hint

    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "hints.json").write_text(
        json.dumps({"ch09.ex1": ["nudge", "strong"]})
    )
    monkeypatch.setattr(c, "ROOT", tmp_path)
    monkeypatch.setattr(c, "_hints_given", {})
    for _ in range(3):
        hint("ch09.ex1")
    hint("ch09.ex2")
    assert capsys.readouterr().out.splitlines() == [
        "hint 1 of 2 for ch09.ex1: nudge",
        "hint 2 of 2 for ch09.ex1: strong",
        "all 2 hints for ch09.ex1 are given: solution('ch09.ex1') prints the reference answer",
        "no hints for ch09.ex2: solution('ch09.ex2') prints the reference answer",
    ]
    with pytest.raises(ValueError, match="exercise ids look like"):
        hint("02.1")


def test_a_failing_case_names_where_two_long_values_differ():
    """pytest shortens long values to their first items ('[0, 1, 2, 3, 4, 5, ...]'); the check keeps
    pytest's next line, which says where they differ, so the learner sees it without scrolling."""
    message = (
        "AssertionError: the free queue after one free\n"
        "assert [0, 1, 2, 3, 4, 5, ...] == [0, 1, 2, 3, 4, 5, ...]\n"
        "  \n"
        "  At index 59 diff: 59 != 99\n"
        "  Use -v to get more diff"
    )
    report = types.SimpleNamespace(
        longrepr=types.SimpleNamespace(reprcrash=types.SimpleNamespace(message=message)),
        longreprtext=message,
    )
    assert describe_failure("test_free_order[last]", report).splitlines() == [
        "check 'free order' with last",
        "  the free queue after one free",
        "  got      [0, 1, 2, 3, 4, 5, ...]",
        "  expected [0, 1, 2, 3, 4, 5, ...]",
        "  (at index 59 diff: 59 != 99)",
    ]


def _report(message: str, entries=()):
    """A stand-in for pytest's failed report: the crash message and the traceback's entries."""
    longrepr = types.SimpleNamespace(
        reprcrash=types.SimpleNamespace(message=message),
        reprtraceback=types.SimpleNamespace(reprentries=list(entries)),
    )
    return types.SimpleNamespace(longrepr=longrepr, longreprtext=message)


def test_an_assert_without_a_message_still_shows_got_and_expected_in_words():
    report = _report(
        "assert [6] == [6, 3]\n  \n  Right contains one more item: 3\n  Use -v to get more diff"
    )
    assert describe_failure("test_lookup[4]", report, {"block_size": 4}).splitlines() == [
        "check 'lookup' with block_size=4",
        "  got      [6]",
        "  expected [6, 3]",
        "  (expected has one more item: 3)",
    ]


def test_a_case_is_named_by_its_parameters_or_by_pytest_id_when_they_are_long():
    report = _report("AssertionError: one holder fewer\nassert 2 == 1")
    named = describe_failure("test_free[4-True]", report, {"bs": 4, "shared": True})
    assert named.splitlines()[0] == "check 'free' with bs=4, shared=True"
    long = describe_failure("test_free[big]", report, {"table": list(range(30))})
    assert long.splitlines()[0] == "check 'free' with big"
    assert describe_failure("test_free", report).splitlines()[0] == "check 'free'"
    plain = _report("AssertionError: token 0: its key must sit at slot 2\nassert False")
    assert describe_failure("test_write", plain).splitlines() == [
        "check 'write'",
        "  token 0: its key must sit at slot 2",
    ], "'assert False' under a message adds nothing"


def test_an_error_raised_in_the_learners_file_names_its_line():
    def entry(path, lineno, source):
        return types.SimpleNamespace(
            reprfileloc=types.SimpleNamespace(path=path, lineno=lineno, message="IndexError"),
            lines=["    def f(table):", f">       {source}", "E       IndexError"],
        )

    report = _report(
        "IndexError: list index out of range",
        [
            entry("/c/tests/exercises/test_ex05_prefix_cache.py", 40, "got = cow(table)"),
            entry("/c/exercises/ex05_prefix_cache.py", 120, "last = table.block_ids[-1]"),
            entry("/c/tests/exercises/test_ex05_prefix_cache.py", 12, "raise AssertionError"),
        ],
    )
    assert describe_failure("test_cow", report).splitlines() == [
        "check 'cow'",
        "  IndexError: list index out of range",
        "  raised in exercises/ex05_prefix_cache.py, line 120: last = table.block_ids[-1]",
    ]
    returned = _report(
        "AssertionError: one holder fewer\nassert 2 == 1",
        [entry("/c/tests/exercises/test_ex05_prefix_cache.py", 40, "assert got == 1")],
    )
    assert "raised in" not in describe_failure("test_cow", returned), "a test's own assert"


def test_a_crash_in_a_real_learner_file_is_located_and_printed_without_colour(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("FORCE_COLOR", "1")  # what a notebook's kernel may set; pytest would colour
    monkeypatch.setenv("PY_COLORS", "1")
    folder = tmp_path / "impl"
    shutil.copytree(ROOT / "solutions", folder)
    source = (folder / FILE).read_text()
    (folder / FILE).write_text(
        mutants.apply(source, "ch02.ex2", 'raise IndexError("list index out of range")')
    )
    assert check("ch02.ex2", impl=str(folder)) is False
    out = capsys.readouterr().out
    assert "\x1b[" not in out, out
    assert f"raised in impl/{FILE}, line " in out and 'raise IndexError("list' in out, out
    assert check(EX, impl=str(folder)) is True  # the other regions are still the reference's
    capsys.readouterr()
    wrong_diff = tmp_path / "diff"
    shutil.copytree(ROOT / "solutions", wrong_diff)
    code = mutants.load_mutants()[FILE][EX]
    (wrong_diff / FILE).write_text(mutants.apply(source, EX, next(iter(code.values()))))
    assert check(EX, impl=str(wrong_diff)) is False
    out = capsys.readouterr().out
    assert "\x1b[" not in out and "Use -v" not in out, out
