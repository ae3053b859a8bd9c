"""publish/sync.py: exercises/ generated from solutions/ (stubs, STUB lines, bad markers, idempotence, --check)."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from paged_course.publish.sync import (
    BEGIN,
    END,
    LearnerWorkError,
    MarkerError,
    exercise_ids,
    hints,
    main,
    make_stub,
    sync,
)

ROOT = Path(__file__).resolve().parents[2]

SOLUTION = '''"""A tiny exercise."""


def add(a, b):
    total = 0
    # BEGIN SOLUTION ch09.ex1 -- add the "two" numbers
    # HINT: what does + do?
    # HINT: total = a ... b
    total = a + b
    # END SOLUTION
    return total


def kernel_like(x):
    if x:
        # BEGIN SOLUTION ch09.ex2
        # STUB: y = x  # starter code kept in the stub
        # STUB: pass
        y = x * 2
        # END SOLUTION
        return y
'''


def test_stub_replaces_regions_and_keeps_indentation():
    stub = make_stub(SOLUTION, "solutions/ex09_demo.py")
    assert "total = a + b" not in stub and "y = x * 2" not in stub, "solution code must not leak"
    assert "    raise NotImplementedError(\"ch09.ex1: add the 'two' numbers\")" in stub
    assert "        y = x  # starter code kept in the stub\n        pass\n" in stub, (
        "STUB lines become starter code"
    )
    assert (
        stub.startswith("# Generated from solutions/")
        and "Write only where a region raises" in stub
    )
    ast.parse(stub)
    assert exercise_ids(SOLUTION) == ["ch09.ex1", "ch09.ex2"]
    assert "HINT" not in stub and "what does + do" not in stub, "hints leave the stub"
    assert hints(SOLUTION) == {"ch09.ex1": ["what does + do?", "total = a ... b"]}
    typed = make_stub(SOLUTION, "solutions/ex09_demo.py", keep=("ch09.ex1",))
    assert "    total = a + b\n" in typed and "HINT" not in typed and "ch09.ex1" not in typed


def test_stub_of_stub_is_idempotent_and_sync_is_idempotent(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "ex09_demo.py").write_text(SOLUTION)
    assert sync(tmp_path) == ["__init__.py", "ex09_demo.py", "hints.json"]
    first = (tmp_path / "exercises" / "ex09_demo.py").read_text()
    assert sync(tmp_path) == [], "a second sync changes nothing"
    assert (tmp_path / "exercises" / "ex09_demo.py").read_text() == first
    namespace: dict = {}
    exec(compile(first, "ex09_demo.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="ch09.ex1"):
        namespace["add"](1, 2)
    assert namespace["kernel_like"](3) == 3, "starter code runs"


@pytest.mark.parametrize(
    "source, message",
    [
        ("# BEGIN SOLUTION ch01.ex1\nx = 1\n", "never closed"),
        ("x = 1\n# END SOLUTION\n", "without a BEGIN"),
        (
            "# BEGIN SOLUTION ch01.ex1\n# BEGIN SOLUTION ch01.ex2\n# END SOLUTION\n# END SOLUTION\n",
            "inside region",
        ),
        (
            "# BEGIN SOLUTION ch01.ex1\n# END SOLUTION\n# BEGIN SOLUTION ch01.ex1\n# END SOLUTION\n",
            "duplicate",
        ),
        ("# STUB: x = 1\n", "outside a solution region"),
        (
            "def f():\n    # BEGIN SOLUTION ch01.ex1\n    # STUB: return (\n    return 1\n    # END SOLUTION\n",
            "does not parse",
        ),
    ],
)
def test_bad_markers_are_rejected(source, message):
    with pytest.raises(MarkerError, match=message):
        make_stub(source, "solutions/ex01_bad.py")


def test_check_mode_reports_stale_files_without_writing(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "ex09_demo.py").write_text(SOLUTION)
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert not (tmp_path / "exercises" / "ex09_demo.py").exists(), "--check writes nothing"
    assert main(["--root", str(tmp_path)]) == 0
    (tmp_path / "exercises" / "ex99_orphan.py").write_text("x = 1\n")
    assert main(["--check", "--root", str(tmp_path)]) == 1, (
        "an exercise without a solution is stale"
    )
    assert "ex99_orphan.py" in capsys.readouterr().out
    assert main(["--root", str(tmp_path)]) == 0 and main(["--check", "--root", str(tmp_path)]) == 0
    assert not (tmp_path / "exercises" / "ex99_orphan.py").exists()


def test_repository_exercises_are_in_sync():
    assert sync(ROOT, check=True) == [], "run: python -m paged course sync"


def test_sync_never_overwrites_the_learners_work(tmp_path):
    """A learner's clone: an exercise changed since the last commit is theirs. The check leaves it out
    (pytest stays green while they work), writing refuses with the file named and nothing written, and
    only --force overwrites it."""
    # the stubs as the course ships them, written from solutions/ (never the repository's exercises/,
    # which may hold the learner's own work while they run pytest)
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    (tmp_path / "exercises").mkdir()
    sync(tmp_path, force=True)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "course"], check=True)
    mine = tmp_path / "exercises" / "ex03_block_tables.py"
    work = mine.read_text() + "\n# my notes on ch03.ex1\n"
    mine.write_text(work)
    assert sync(tmp_path, check=True) == []
    other = tmp_path / "exercises" / "ex02_allocator.py"
    other.write_text(other.read_text() + "\n")  # a stale stub beside the learner's work
    with pytest.raises(LearnerWorkError, match="ex03_block_tables.py"):
        sync(tmp_path)
    assert mine.read_text() == work and other.read_text().endswith("\n\n")
    assert sync(tmp_path, force=True) == ["ex02_allocator.py", "ex03_block_tables.py"]
    assert mine.read_text() != work


def _code_lines(body: list[str]) -> list[str]:
    """The region's solution code worth hiding, normalized: each line without its comment, and the
    expression on the right of an assignment (``key = key_cache[table].flatten(1, 2)`` hides both)."""
    lines = []
    for line in body:
        code = " ".join(line.split("  #")[0].split())
        if code.startswith("#"):
            continue
        for piece in (code, code.split(" = ", 1)[-1]):
            if len(piece) >= 12:
                lines.append(piece)
    return lines


def test_hints_never_contain_a_line_of_the_solution():
    """A hint points the way; it never hands out a line of the answer (whitespace ignored)."""
    leaks = []
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        region = None
        for line in path.read_text().splitlines():
            begin = BEGIN.match(line)
            if begin:
                region = (begin["id"], " ".join((begin["hint"] or "").split()), [])
            elif END.match(line) and region:
                ex_id, hint, body = region
                leaks += [
                    f"{path.name} {ex_id}: the hint contains `{c}`"
                    for c in _code_lines(body)
                    if c in hint
                ]
                region = None
            elif region:
                region[2].append(line)
    assert not leaks, "\n".join(leaks)


def test_a_hint_tier_continues_on_hint_plus_lines():
    source = (
        "def f(x):\n"
        "    # BEGIN SOLUTION ch09.ex3 -- double it\n"
        "    # HINT: what is twice\n"
        "    # HINT+ a number?\n"
        "    # HINT: x + x\n"
        "    return 2 * x\n"
        "    # END SOLUTION\n"
    )
    assert hints(source) == {"ch09.ex3": ["what is twice a number?", "x + x"]}
    assert "HINT" not in make_stub(source, "solutions/ex09_demo.py"), (
        "continuations leave the stub too"
    )
    with pytest.raises(MarkerError, match="continues no"):
        hints(source.replace("# HINT: what is twice", "# HINT+ what is twice"))


def test_every_region_of_chapters_01_to_06_has_a_nudge_and_a_stronger_hint():
    """hint(id) gives a nudge first, a stronger hint on the second call, then points to solution(id)."""
    found = {}
    for path in sorted((ROOT / "solutions").glob("ex0[1-6]_*.py")):
        found.update(hints(path.read_text()))
    regions = [
        ex_id
        for path in sorted((ROOT / "solutions").glob("ex0[1-6]_*.py"))
        for ex_id in exercise_ids(path.read_text())
    ]
    short = {ex_id: len(found.get(ex_id, [])) for ex_id in regions if len(found.get(ex_id, [])) < 2}
    assert regions and not short, f"regions with fewer than two hint tiers: {short}"
