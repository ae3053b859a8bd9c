"""Spot-the-bug regions: the stub hands the learner working-looking code with one planted bug.

Such a region's graded tests carry ``exercise(..., all_or_nothing=True)`` (all of them or none; the one other
all-or-nothing region, ch04.ex3, starts correct but slow and is listed apart), its stub is
one of the region's planted wrong answers in ``tests/mutants`` (so the mutant run proves the tests catch it),
and the stub passes some of its checks by design while failing at least one (``paged_course.grading`` then
withholds the points of the passing ones).
"""

from __future__ import annotations

import ast
import shutil
import textwrap
from pathlib import Path

import pytest

from paged_course.check import run_check
from paged_course.grading import mutants
from paged_course.publish.sync import BEGIN, END, STUB, make_stub

ROOT = Path(__file__).resolve().parents[2]


def _flags() -> dict[str, set[bool]]:
    """``{region id: {all_or_nothing flags of its graded tests}}`` read from the test files' decorators."""
    found: dict[str, set[bool]] = {}
    for path in sorted((ROOT / "tests" / "exercises").glob("test_ex*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("mark.exercise"):
                    ex_id = ast.literal_eval(dec.args[0])
                    flag = any(
                        k.arg == "all_or_nothing" and ast.literal_eval(k.value)
                        for k in dec.keywords
                    )
                    found.setdefault(ex_id, set()).add(flag)
    return found


def _stub_body(ex_id: str) -> tuple[str, str]:
    """(solutions file name, the region's STUB code without its comment lines)."""
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        inside, body = False, []
        for line in path.read_text().splitlines():
            begin = BEGIN.match(line)
            if begin:
                inside = begin["id"] == ex_id
            elif END.match(line):
                if inside:
                    code = [x for x in body if not x.lstrip().startswith("#")]
                    return path.name, textwrap.dedent("\n".join(code)).strip()
                inside = False
            elif inside and (stub := STUB.match(line)):
                body.append(stub["indent"] + stub["code"])
    raise AssertionError(f"no region {ex_id} in solutions/")


# All or nothing for another reason: a starter that is correct but slow (chapter 04's fast kernel starts
# as the teaching kernel; its checks want both halves, right results and tensor cores), not a planted bug.
CORRECT_STARTERS = {"ch04.ex3"}
SPOT = sorted(ex for ex, flags in _flags().items() if True in flags and ex not in CORRECT_STARTERS)


def test_there_are_spot_the_bug_regions_and_each_is_flagged_on_every_test():
    assert len({ex.split(".")[0] for ex in SPOT}) >= 3, SPOT
    mixed = {ex: flags for ex, flags in _flags().items() if len(flags) > 1}
    assert not mixed, f"all_or_nothing must be on every test of a region or on none: {mixed}"


@pytest.mark.parametrize("ex_id", SPOT)
def test_the_stub_is_a_planted_wrong_answer_from_the_mutant_list(ex_id):
    name, body = _stub_body(ex_id)
    assert body, f"{ex_id}: a spot-the-bug region's stub holds the buggy code (# STUB: lines)"
    planted = [
        textwrap.dedent(c).strip() for c in mutants.load_mutants()[name].get(ex_id, {}).values()
    ]
    assert body in planted, (
        f"{ex_id}: the stub's code is not one of the planted wrong answers in tests/mutants"
    )


@pytest.mark.parametrize("ex_id", SPOT)
def test_the_stub_passes_some_checks_and_fails_one(ex_id, tmp_path):
    folder = tmp_path / "impl"
    shutil.copytree(ROOT / "solutions", folder, ignore=shutil.ignore_patterns("__pycache__"))
    name, _ = _stub_body(ex_id)
    source = (ROOT / "solutions" / name).read_text()
    others = tuple(r for r in mutants.regions(source) if r != ex_id)
    (folder / name).write_text(make_stub(source, name, keep=others))  # every other region written
    result = run_check(ex_id, impl=str(folder))
    assert result.all_or_nothing and not result.ok, f"{ex_id}: the planted bug must fail a check"
    assert 0 < result.passed < result.total, (
        f"{ex_id}: a working-looking component passes some of its checks ({result.passed} of {result.total})"
    )
