"""``scripts/check_lines.py``: what a chapter's check cells must say on the stubs and when typed in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import check_lines  # noqa: E402 - scripts/ is not a package


def cell(index, source, stdout):
    return {"index": index, "source": source, "stdout": stdout}


STUB_CELLS = [
    cell(1, '_ = check("ch02.ex1")', "ch02.ex1 is not written yet (hint). The chapter carries on."),
    cell(2, '_ = check("ch02.ex2")', "ch02.ex2: 3 of 6 checks pass; the first failing one:\n..."),
    cell(
        3, "print(origin_table(origin))", "  allocator         reference (ch02.ex1 not passing yet)"
    ),
]
TYPED_CELLS = [
    cell(1, '_ = check("ch02.ex1")', "ch02.ex1 passes: 8 of 8 checks"),
    cell(2, "print(origin_table(o))", "  allocator         yours (exercises/ex02_allocator.py: X)"),
    cell(
        3, "print(agree)", "outputs equal to transformers' generate (or parting at a tie): 7 of 7"
    ),
]


def test_untouched_stubs_and_typed_in_solutions_read_as_they_should():
    assert check_lines.problems("02", STUB_CELLS, "stubs") == []
    assert check_lines.problems("07", TYPED_CELLS, "typed-in", ("allocator",)) == []


@pytest.mark.parametrize(
    "cells, expect, says",
    [
        (
            [cell(1, '_ = check("ch02.ex1")', "ch02.ex1 passes: 8 of 8 checks")],
            "stubs",
            "should say",
        ),
        ([cell(1, '_ = check("ch02.ex1")', "")], "stubs", "(nothing)"),
        ([cell(1, "x = 1", "ch05.ex2 passes: 3 of 3 checks")], "stubs", "a region passes"),
        (
            [cell(1, "t", "  scheduler  yours (exercises/ex06_scheduler.py: S)")],
            "stubs",
            "not the reference",
        ),
        (
            [cell(1, '_ = check("ch02.ex1")', "ch02.ex1 is not written yet (h)")],
            "typed-in",
            "passes",
        ),
        (
            [cell(1, "t", "  allocator  reference answers (solutions/x.py: A)")],
            "typed-in",
            "not yours",
        ),
        ([cell(1, "t", "outputs equal to transformers' generate: 6 of 7")], "typed-in", "differ"),
        ([cell(1, "s", "float32 heads 4/4: max |error| 3.0e-07 -> OK")], "stubs", "self-check"),
        ([cell(1, "s", "float32 heads 4/4: max |error| inf -> WRONG")], "typed-in", "self-check"),
    ],
)
def test_each_wrong_report_is_named(cells, expect, says):
    found = check_lines.problems("0N", cells, expect)
    assert len(found) == 1 and says in found[0], found


def test_a_capstone_table_missing_a_part_is_named():
    found = check_lines.problems("07", TYPED_CELLS, "typed-in", ("allocator", "scheduler"))
    assert found == ["07: the capstone table lists no line for scheduler"]
    found = check_lines.problems("07", TYPED_CELLS[:2], "typed-in", ("allocator",))
    assert found == ["07: no line compares the capstone's tokens with transformers'"]
    with pytest.raises(ValueError, match="expect must be one of"):
        check_lines.problems("07", TYPED_CELLS, "graded")


def test_a_spot_the_bug_check_on_the_stubs_reads_as_not_passing():
    # a planted bug passes some checks by design: its check line names them and is still a failure
    said = (
        "ch02.ex4: 2 of 8 checks pass (all or nothing: it counts only when all of them pass); the first "
        "failing one:\ncheck 'free many is all or nothing'"
    )
    cells = [cell(1, '_ = check("ch02.ex4")', said)]
    assert check_lines.problems("02", cells, "stubs") == []
    assert check_lines.problems("02", cells, "typed-in"), "typed in, the same line is a problem"
