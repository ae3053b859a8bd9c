"""The learner's loop tells the truth in one kernel: checks report on the learner's files and nothing else.

Each test runs a child process that imitates a Jupyter kernel the way a learner starts one: no
``PAGED_IMPL`` in its environment, its working directory ``chapters/``, every call made in the same
process one after another. It runs on a copy of the course (``paged_course``, the graded tests and
``pyproject.toml``) whose ``exercises/`` holds untouched stubs generated from ``solutions/``, so that the
tests never write into this checkout's ``exercises/`` (where a developer may have their own answers); the
engine (``paged``) is the installed one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paged_course.grading import mutants
from paged_course.publish.sync import exercise_ids, make_stub

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS_01_06 = ("ex01", "ex02", "ex03", "ex04", "ex05", "ex06")


def _course_copy(tmp_path: Path) -> Path:
    course = tmp_path / "course"
    shutil.copytree(
        ROOT / "paged_course", course / "paged_course", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        ROOT / "tests" / "exercises",
        course / "tests" / "exercises",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "tests" / "conftest.py", course / "tests" / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", course / "pyproject.toml")
    shutil.copytree(
        ROOT / "solutions", course / "solutions", ignore=shutil.ignore_patterns("__pycache__")
    )
    (course / "exercises").mkdir()
    (course / "exercises" / "__init__.py").write_text("")
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        (course / "exercises" / path.name).write_text(make_stub(path.read_text(), path.name))
    (course / "chapters").mkdir()
    return course


def type_in(course: Path, module: str, regions: tuple[str, ...], wrong: str | None = None) -> None:
    """Write ``exercises/<module>.py`` as a learner who has typed in ``regions`` (the reference code),
    every other region left as its stub; ``wrong`` (a region of ``regions``) gets a planted wrong answer
    from ``tests/mutants`` instead. The file's modification time is kept when it existed, so that only
    its content says it changed."""
    source = (ROOT / "solutions" / f"{module}.py").read_text()
    if wrong is not None:
        code = next(iter(mutants.load_mutants()[f"{module}.py"][wrong].values()))
        source = mutants.apply(source, wrong, code)
    target = course / "exercises" / f"{module}.py"
    stamp = target.stat().st_mtime_ns if target.exists() else None
    target.write_text(make_stub(source, f"{module}.py", keep=regions))
    if stamp is not None:
        os.utime(target, ns=(stamp, stamp))


def kernel(course: Path, code: str, timeout: float = 300) -> dict:
    """Run ``code`` in a fresh process started like a learner's kernel; it fills the dict ``out``, which
    comes back as JSON."""
    env = {k: v for k, v in os.environ.items() if k not in ("PAGED_IMPL", "PYTEST_CURRENT_TEST")}
    env.pop("TQDM_DISABLE", None)
    script = (
        "import contextlib, io, json, os, sys\n"
        f"sys.path.insert(0, {str(course)!r})\n"
        "import paged_course.check as chk\n"
        f"assert str(chk.ROOT) == {str(course)!r}, chk.ROOT\n"
        "out = {}\n"
        "def said(fn, *args, **kwargs):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        value = fn(*args, **kwargs)\n"
        "    return value, buf.getvalue()\n"
        + textwrap.dedent(code)
        + "\nprint('RESULT' + json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=course / "chapters",
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


@pytest.fixture
def course(tmp_path):
    return _course_copy(tmp_path)


def _ids(prefixes: tuple[str, ...]) -> list[str]:
    ids = []
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        if path.name.startswith(prefixes):
            ids += exercise_ids(path.read_text())
    return ids


def test_a_check_leaves_the_process_as_it_found_it(course):
    out = kernel(
        course,
        """
        from paged_course.check import check
        env, path = dict(os.environ), list(sys.path)
        before = {n for n in sys.modules if n.split('.')[0] in ('exercises', 'solutions', 'conftest')}
        ok, text = said(check, 'ch02.ex1')
        out['ok'], out['text'] = ok, text
        out['env'] = {k: v for k, v in os.environ.items() if env.get(k) != v}
        out['env_gone'] = [k for k in env if k not in os.environ]
        out['path'] = [p for p in sys.path if p not in path] + [p for p in path if p not in sys.path]
        after = {n for n in sys.modules if n.split('.')[0] in ('exercises', 'solutions', 'conftest')}
        out['modules'] = sorted(after ^ before)
        out['tests'] = sorted(n for n in sys.modules if n.startswith('test_'))
        os.environ['PAGED_IMPL'] = 'solutions'  # set later by anyone: the choice was made at import
        out['impl'] = chk.impl_package()
        """,
    )
    assert out["ok"] is False and "ch02.ex1 is not written yet" in out["text"], out["text"]
    assert out["env"] == {} and out["env_gone"] == [], f"a check changed os.environ: {out}"
    assert out["path"] == [], f"a check changed sys.path: {out['path']}"
    assert out["modules"] == [] and out["tests"] == [], f"a check left modules behind: {out}"
    assert out["impl"] == "exercises", "the implementation is decided once per process"


def test_no_check_of_chapters_01_to_06_passes_on_untouched_stubs_in_one_process(course):
    ids = _ids(CHAPTERS_01_06)
    assert len(ids) >= 20, ids
    out = kernel(
        course,
        f"""
        from paged_course.check import check
        from paged_course.capstone import learner_parts
        out['lines'] = {{}}
        for ex in {ids!r}:
            ok, text = said(check, ex)
            out['lines'][ex] = [ok, text]
        parts, origin = learner_parts()
        out['origin'] = origin
        """,
        timeout=600,
    )
    passed = {
        ex: text for ex, (ok, text) in out["lines"].items() if ok or text.startswith(f"{ex} passes")
    }
    assert not passed, f"checks pass on untouched stubs: {passed}"
    for ex, (_, text) in out["lines"].items():
        assert text.startswith(f"{ex} is not written yet") or f"{ex}: " in text, (ex, text)
    mine = {
        part: where for part, where in out["origin"].items() if not where.startswith("reference")
    }
    assert not mine, f"learner_parts names parts of untouched stubs as the learner's: {mine}"
    assert set(out["origin"]) == set(__import__("paged_course.capstone").capstone.PART_SOURCES)


def test_a_right_region_then_an_unwritten_one_then_a_wrong_answer_in_the_right_one(course):
    type_in(course, "ex03_block_tables", ("ch03.ex1",))
    out = kernel(
        course,
        f"""
        from paged_course.check import check
        from paged_course.capstone import learner_parts
        out['right'] = said(check, 'ch03.ex1')
        out['unwritten'] = said(check, 'ch03.ex3')
        import subprocess
        subprocess.run([sys.executable, '-c', {_TYPE_IN_WRONG!r}], check=True)
        out['wrong'] = said(check, 'ch03.ex1')
        out['origin'] = learner_parts(parts=('slot_mapping',))[1]
        """,
    )
    assert out["right"][0] is True and out["right"][1].startswith("ch03.ex1 passes:"), out["right"]
    assert out["unwritten"][0] is False, "a check after a passing one still runs the learner's file"
    assert out["unwritten"][1].startswith("ch03.ex3 is not written yet"), out["unwritten"]
    assert out["wrong"][0] is False, "the same region, now wrong (same size of file or not): fails"
    assert "checks pass; the first failing one" in out["wrong"][1], out["wrong"]
    assert out["origin"]["slot_mapping"].startswith("reference (ch03.ex1"), out["origin"]


_TYPE_IN_WRONG = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
    "from test_learner_loop import type_in; from pathlib import Path; "
    "type_in(Path.cwd().parent, 'ex03_block_tables', ('ch03.ex1',), wrong='ch03.ex1')"
)


def test_learner_parts_name_a_typed_in_part_yours_and_the_rest_the_reference(course):
    type_in(course, "ex02_allocator", tuple(_ids(("ex02",))))
    out = kernel(
        course,
        """
        from paged_course.check import check
        from paged_course.capstone import learner_parts
        said(check, 'ch03.ex1')  # any check first: it must not change whose parts these are
        parts, origin = learner_parts()
        out['origin'] = origin
        out['allocator'] = parts.allocator.__module__
        """,
    )
    assert out["origin"]["allocator"] == "yours (exercises/ex02_allocator.py: BlockAllocator)"
    assert out["allocator"] == "exercises.ex02_allocator"
    others = {p: w for p, w in out["origin"].items() if p != "allocator"}
    assert all(w.startswith("reference") for w in others.values()), others
