"""The student release (publish/release.py): what the tree holds, and (slow) that it installs and grades."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from paged_course.grading import classroom
from paged_course.publish.release import (
    HIDDEN_CONFTEST,
    ROOT,
    ReleaseError,
    build_release,
    notebook_code,
    references_solutions,
    set_default_impl,
    without_solution_tests,
)
from paged_course.publish.sync import make_stub


def _impl_default(conftest: str) -> str:
    """The ``default=`` of ``parser.addoption("--impl", ...)`` in a conftest's source."""
    for node in ast.walk(ast.parse(conftest)):
        if (
            isinstance(node, ast.Call)
            and node.args
            and getattr(node.args[0], "value", None) == "--impl"
        ):
            return next(k.value.value for k in node.keywords if k.arg == "default")
    raise AssertionError("no --impl option in tests/conftest.py")


def write_hidden_tests(folder: Path) -> tuple[str, int]:
    """An instructor's hidden-test folder for the first chapter with exercises; returns (chapter, points)."""
    from paged_course.publish.sync import exercise_ids

    path = sorted(p for p in (ROOT / "solutions").glob("ex*.py") if exercise_ids(p.read_text()))[0]
    chapter = exercise_ids(path.read_text())[0].split(".")[0]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_extra.py").write_text(
        "import inspect\nimport re\n\nimport pytest\n\n\n"
        f"@pytest.mark.exercise({chapter + '.ex1'!r}, points=1)\n"
        "def test_no_region_left_unfilled(impl):\n"
        f"    source = inspect.getsource(impl({path.stem!r}))\n"
        '    # the formatter may break a stub\'s raise over lines: NotImplementedError(\\n    "ch01.ex1: ...")\n'
        f"    stub = re.search(r'NotImplementedError\\(\\s*\"{chapter}\\.', source)\n"
        "    assert stub is None, 'a marked region is still the stub'\n"
    )
    (folder / "notes.txt").write_text("data files travel with the tests\n")
    return chapter, 1


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "student"
    return build_release(out, with_solutions=False)


def test_student_tree_has_no_solutions_and_nothing_imports_them(student):
    out = student.out
    assert not (out / "solutions").exists(), "a release without solutions must not ship solutions/"
    offenders = [
        str(p.relative_to(out)) for p in out.rglob("*.py") if references_solutions(p.read_text())
    ]
    offenders += [
        str(p.relative_to(out))
        for p in out.rglob("*.ipynb")
        if references_solutions(notebook_code(p))
    ]
    assert offenders == [], f"files in the student tree import solutions: {offenders}"
    assert all(d.startswith("tests/") for d in student.dropped), (
        f"only tests may be dropped: {student.dropped}"
    )
    for rel in {d.split("::")[0] for d in student.dropped if "::" in d}:
        assert references_solutions((out / rel).read_text(), path_strings=True) is False, (
            f"{rel} still uses solutions"
        )
    assert not (out / "docs" / "instructor.md").exists(), (
        "the instructor guide stays out of the student tree"
    )


def test_student_tree_holds_every_exercise_and_the_package(student):
    out = student.out
    want = sorted(p.name for p in (ROOT / "solutions").glob("ex*.py"))
    got = sorted(p.name for p in (out / "exercises").glob("ex*.py"))
    assert got == want and want, f"one exercise stub per solutions file: want {want}, got {got}"
    for name in want:
        assert (out / "exercises" / name).read_text() == make_stub(
            (ROOT / "solutions" / name).read_text(), f"solutions/{name}", student=True
        ), f"exercises/{name} must be the stub generated from solutions/{name}"

    for rel in (
        "pyproject.toml",
        "environment.yml",
        "paged/__init__.py",
        "kernels/__init__.py",
        "tests/exercises/conftest.py",
        "paged_course/grading/__init__.py",
    ):
        assert (out / rel).is_file(), f"the release misses {rel}"
    for rel in (
        "paged_course/publish/release.py",
        "paged_course/grading/classroom.py",
        "paged_course/grading/autograder.py",
    ):
        assert not (out / rel).exists(), f"the student release ships the instructor tool {rel}"
    withheld = {"paged_course.publish.release", "paged_course.grading.classroom"}
    withheld.add("paged_course.grading.autograder")
    for path in (out / "paged_course").rglob("*.py"):  # lazy imports too: a command must not break
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names]
            module = getattr(node, "module", None) or ""
            found = {module, *names, *(f"{module}.{n}" for n in names)} & withheld
            assert not found, f"{path.relative_to(out)} imports the withheld {found}"
    graded = sorted(p.name for p in (out / "tests" / "exercises").glob("test_*.py"))
    assert graded == sorted(p.name for p in (ROOT / "tests" / "exercises").glob("test_*.py")), (
        "graded tests copied"
    )
    chapters = sorted(p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.*"))
    assert sorted(p.name for p in (out / "chapters").glob("[0-9][0-9]_*.*")) == chapters, (
        "chapters copied"
    )
    assert not list(out.rglob("__pycache__")) and not list(out.rglob("*.egg-info")), (
        "no build caches"
    )


def test_student_exercise_files_say_what_to_do_not_where_they_were_generated_from(student):
    """A student release has no solutions/: its exercise files must not send the student there."""
    files = sorted((student.out / "exercises").glob("*.py"))
    assert files
    for path in files:
        text = path.read_text()
        assert "solutions/" not in text and "course sync" not in text, (
            f"exercises/{path.name} mentions solutions/ or sync, which a student release does not have"
        )
        if path.name.startswith("ex"):
            chapter = path.name[2:4]
            assert f'check("ch{chapter}.exK")' in text and f"grade ch{chapter}" in text, (
                f"exercises/{path.name}: the header must say how to check and grade the file"
            )


def test_student_tree_grades_exercises_by_default(student):
    out = student.out
    assert _impl_default((out / "tests" / "conftest.py").read_text()) == "exercises", (
        "in a student tree pytest's --impl must default to exercises"
    )
    assert _impl_default((ROOT / "tests" / "conftest.py").read_text()) == "solutions", (
        "the course keeps its default"
    )
    marker = json.loads((out / ".paged-release").read_text())
    assert marker["solutions"] is False and marker["default_impl"] == "exercises"
    readme = (out / "README.md").read_text()
    assert readme.startswith("> **Student release.**") and "--impl exercises" in readme, (
        "README says so"
    )
    ci = (out / ".ci" / "run").read_text()
    assert "course sync" not in ci and "python -m paged grade --report grading" in ci, (
        "learner CI, no sync check"
    )
    assert os.access(out / ".ci" / "run", os.X_OK)
    assert (out / ".github" / "workflows" / "classroom.yml").is_file(), (
        "the classroom workflow ships"
    )
    shipped = json.loads((out / ".github" / "classroom" / "autograding.json").read_text())
    assert shipped == classroom.autograding_config(
        classroom.chapter_points(classroom.collect(ROOT))
    ), "the release's classroom config is recounted from its graded tests"


def test_a_filled_in_local_exercise_never_ships(tmp_path):
    course = tmp_path / "course"
    for rel in ("solutions", "exercises", "tests", "pyproject.toml"):
        shutil.copytree(ROOT / rel, course / rel) if (ROOT / rel).is_dir() else shutil.copy(
            ROOT / rel, course / rel
        )
    name = sorted(p.name for p in (course / "solutions").glob("ex*.py"))[0]
    shutil.copyfile(
        course / "solutions" / name, course / "exercises" / name
    )  # the instructor tried the answers
    (course / "exercises" / "ex99_scratch.py").write_text("x = 1\n")
    out = build_release(tmp_path / "out", root=course, with_solutions=False).out
    assert "BEGIN SOLUTION" not in (out / "exercises" / name).read_text()
    assert (out / "exercises" / name).read_text() == make_stub(
        (course / "solutions" / name).read_text(), f"solutions/{name}", student=True
    ), "stubs regenerated"
    assert not (out / "exercises" / "ex99_scratch.py").exists(), (
        "only exercises generated from solutions/ ship"
    )


def test_release_with_solutions_keeps_them(tmp_path):
    release = build_release(tmp_path / "full", with_solutions=True)
    assert sorted(p.name for p in (release.out / "solutions").glob("*.py")) == sorted(
        p.name for p in (ROOT / "solutions").glob("*.py")
    ), "solutions/ copied whole"
    assert _impl_default((release.out / "tests" / "conftest.py").read_text()) == "solutions"
    assert release.dropped == []
    assert (release.out / "README.md").read_text().startswith("> **Release with solutions.**")


def test_release_refuses_a_used_folder_or_one_inside_the_course(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    with pytest.raises(ReleaseError, match="not empty"):
        build_release(tmp_path / "used")
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine", (
        "a refused release leaves the folder alone"
    )
    with pytest.raises(ReleaseError, match="inside the course"):
        build_release(ROOT / "build" / "student")


def test_hidden_tests_folder_checks(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReleaseError, match="no test_"):
        build_release(tmp_path / "a", hidden_tests=empty)
    assert not (tmp_path / "a").exists(), "a failed release removes what it wrote"
    clash = tmp_path / "clash"
    clash.mkdir()
    (clash / "conftest.py").write_text("")
    (clash / "test_x.py").write_text("")
    with pytest.raises(ReleaseError, match="conftest"):
        build_release(tmp_path / "b", hidden_tests=clash)
    with pytest.raises(ReleaseError, match="not a folder"):
        build_release(tmp_path / "c", hidden_tests=tmp_path / "missing")


def test_hidden_tests_are_copied_renamed_and_off_by_default(tmp_path):
    chapter, points = write_hidden_tests(tmp_path / "private")
    release = build_release(
        tmp_path / "out", with_solutions=False, hidden_tests=tmp_path / "private"
    )
    hidden = release.out / "tests" / "exercises" / "hidden"
    assert release.hidden == ["tests/exercises/hidden/test_hidden_extra.py"], (
        "renamed so no module name clashes"
    )
    assert (hidden / "notes.txt").is_file() and (
        hidden / "conftest.py"
    ).read_text() == HIDDEN_CONFTEST
    assert (
        json.loads((release.out / ".paged-release").read_text())["hidden_tests"] == release.hidden
    )
    assert "PAGED_HIDDEN=1" in (release.out / "README.md").read_text()
    public = sum(
        row["points"] for row in classroom.chapter_points(classroom.collect(ROOT)).values()
    )
    counted = json.loads((release.out / ".github" / "classroom" / "autograding.json").read_text())[
        "tests"
    ]
    assert sum(t["points"] for t in counted) == public + points, (
        "the hidden tests' points count in the classroom"
    )
    assert all(t["run"].startswith("env PAGED_HIDDEN=1 ") for t in counted), (
        "classroom grading includes hidden tests"
    )


MODULE = '''"""Tests of the solutions and of the package."""
import pytest

ROOT = "."


def test_package():
    assert 1 + 1 == 2


@pytest.mark.parametrize("name", ["ex01"])
def test_reads_solutions(name):
    assert (ROOT / "solutions" / name).exists()


def test_imports():
    from solutions import ex01_fragmentation  # noqa: F401
'''


def test_without_solution_tests_removes_only_the_tests_that_use_them():
    kept, names = without_solution_tests(MODULE)
    assert names == ["test_reads_solutions", "test_imports"]
    assert kept == MODULE[: MODULE.index("@pytest.mark.parametrize")].rstrip("\n") + "\n", kept
    assert without_solution_tests(MODULE.replace('ROOT = "."', 'ROOT = "solutions"')) == (
        None,
        [],
    ), "module-level use of solutions/: the whole file goes"
    assert without_solution_tests(MODULE.replace("def test_package", "def helper")) == (None, []), (
        "no test left: the whole file goes"
    )


CONFTEST = """def pytest_addoption(parser):
    parser.addoption("--other", default="solutions")
    parser.addoption("--impl", choices=["solutions", "exercises"], default="solutions",
                     help="which one (default: solutions)")
"""


def test_set_default_impl_rewrites_only_the_impl_option():
    assert set_default_impl(CONFTEST) == CONFTEST.replace(
        'choices=["solutions", "exercises"], default="solutions",',
        'choices=["solutions", "exercises"], default="exercises",',
    ).replace("(default: solutions)", "(default: exercises)")
    with pytest.raises(ReleaseError, match="--impl"):
        set_default_impl(
            'def pytest_addoption(parser):\n    parser.addoption("--other", default="x")\n'
        )


@pytest.mark.parametrize(
    "source, imports, reads",
    [
        ("import solutions.ex01_fragmentation as s", True, True),
        ("from solutions import ex01_fragmentation", True, True),
        ("from solutions.ex02_allocator import BlockAllocator", True, True),
        ("import importlib\nm = importlib.import_module('solutions.ex01')", True, True),
        ("from .solutions import x", False, False),
        ("import solutionsx", False, False),
        ("path = ROOT / 'solutions'", False, True),
        ("impl = 'solutions/ex01.py'", False, True),
        ("doc = 'compare with the solutions in the book'", False, False),
        ("from exercises import ex01_fragmentation", False, False),
        ("from solutions import (\n", True, True),  # unparsable: regex fallback
        (
            "assert sync(ROOT, check=True) == []",
            False,
            True,
        ),  # the generator reads solutions/ itself
    ],
)
def test_references_solutions(source, imports, reads):
    assert references_solutions(source) is imports
    assert references_solutions(source, path_strings=True) is reads


@pytest.mark.slow
def test_release_installs_runs_a_chapter_and_grades_by_itself(tmp_path):
    """Build a student release, install it into a fresh venv, run a chapter, grade stubs (0) and solutions (full)."""
    chapter, hidden_points = write_hidden_tests(tmp_path / "private")
    tree = build_release(
        tmp_path / "student", with_solutions=False, hidden_tests=tmp_path / "private"
    ).out
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # reuse this venv's packages (torch, pytest, ...) without its editable install of the course
    Path(site, "_course_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PAGED_"))
    }
    run = lambda *args, cwd=tree: subprocess.run(
        [str(py), *args],
        cwd=cwd,
        env=env,
        capture_output=True,  # noqa: E731
        text=True,
        timeout=900,
    )
    res = run("-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(tree))
    assert res.returncode == 0, res.stdout + res.stderr
    res = run(
        "-c",
        "import paged, paged.kernels; print(paged.__file__); print(paged.kernels.__file__)",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert all(line.startswith(str(tree)) for line in res.stdout.split()), (
        f"imports the release: {res.stdout}"
    )

    res = run(
        "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not exercise"
    )
    assert res.returncode == 0, (
        f"the release's own test suite does not even collect:\n{res.stdout[-3000:]}"
    )

    chapters = sorted((tree / "chapters").glob("[0-9][0-9]_*.ipynb"))
    if chapters:
        res = run(
            "-m", "pytest", str(chapters[0].relative_to(tree)), "-q", "-p", "no:cacheprovider"
        )
        assert res.returncode == 0, (
            f"{chapters[0].name} fails nbval in the release:\n{res.stdout[-3000:]}"
        )

    res = run("-m", "paged", "grade", "--report", str(tmp_path / "stubs"))
    stubs = json.loads((tmp_path / "stubs" / "results.json").read_text())
    assert stubs["tests"] and stubs["score"] == 0, f"the stubs must score 0: {res.stdout[-2000:]}"
    res = run("-m", "paged", "grade", chapter, "--strict")
    assert res.returncode == 1, (
        f"a GitHub Classroom entry must fail below full marks:\n{res.stdout[-2000:]}"
    )
    for path in (ROOT / "solutions").glob("ex*.py"):
        shutil.copyfile(path, tree / "exercises" / path.name)
    res = run("-m", "paged", "grade", "--report", str(tmp_path / "full"))
    full = json.loads((tmp_path / "full" / "results.json").read_text())
    assert full["score"] == full["max_score"] == stubs["max_score"] > 0, (
        f"the solutions must score full marks in the release: {res.stdout[-3000:]}"
    )
    res = run("-m", "paged", "grade", chapter, "--strict")
    assert res.returncode == 0, (
        f"a GitHub Classroom entry must pass at full marks:\n{res.stdout[-2000:]}"
    )
    env["PAGED_HIDDEN"] = "1"
    res = run("-m", "paged", "grade", chapter, "--report", str(tmp_path / "hidden"))
    hidden = json.loads((tmp_path / "hidden" / "results.json").read_text())
    assert any("no_region_left_unfilled" in t["name"] for t in hidden["tests"]), (
        "PAGED_HIDDEN=1 runs hidden tests"
    )
    assert (
        hidden["score"]
        == hidden["max_score"]
        == sum(t["max_score"] for t in full["tests"] if t["name"].startswith(chapter + "."))
        + hidden_points
    ), res.stdout
