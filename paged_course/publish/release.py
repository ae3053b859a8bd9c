"""Write a student copy of the course: ``python -m paged course release OUT [--without-solutions] [--hidden-tests D]``.

The tree holds what a learner needs and nothing else: the chapters, the engine (``paged/`` and
``kernels/``), the course tooling a learner runs (``paged_course/`` without the release, classroom and
autograder builders, which stay with the instructor), the exercise stubs, the public tests,
``pyproject.toml``, ``environment.yml``, a README and a CI script. Built caches (``__pycache__``,
``*.egg-info``, checkpoints) are left out. The stubs in ``exercises/`` are generated afresh from
``solutions/`` (``paged_course/publish/sync.py``), so an instructor's filled-in local copy never ships.

``--without-solutions`` leaves out ``solutions/`` and everything that needs it, and makes the tree
grade the learner by default:

* ``tests/conftest.py``: the default of ``--impl`` becomes ``exercises`` (the one ``default=`` of the
  ``--impl`` option is rewritten in place; the release fails loudly if that option is not found);
* tests that import ``solutions`` or read the ``solutions/`` folder are dropped, one test function at
  a time where the rest of the file stands alone (listed in the ``.paged-release`` file and printed);
  a chapter or package module that imports ``solutions`` stops the release with ``ReleaseError``;
* ``docs/instructor.md`` is left out, ``.ci/run`` becomes a learner CI (install, non-graded tests,
  a grading report that never fails the build);
* the README starts with a paragraph saying all this.

``--hidden-tests DIR`` copies an instructor's extra graded tests into ``tests/exercises/hidden/``
(files renamed ``test_hidden_*.py`` so their module names cannot clash with the public tests) with a
``conftest.py`` that ignores them unless ``PAGED_HIDDEN=1`` and marks them ``hidden``. A release also
ships ``.github/classroom/autograding.json`` and ``.github/workflows/classroom.yml`` (GitHub Classroom),
recounted from the tree's own graded tests.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from paged_course.grading import classroom

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = (
    "README.md",
    "LICENSE",
    "pyproject.toml",
    "environment.yml",
    ".gitignore",
    "chapters",
    "paged",
    "paged_course",
    "kernels",
    "exercises",
    "tests",
    "scripts",
    "docs",
    ".ci",
    ".github/classroom",
)
INSTRUCTOR_ONLY = ("docs/instructor.md",)
# never shipped: the tools that build releases and autograders, and their tests
INSTRUCTOR_TOOLS = (
    "paged_course/publish/release.py",
    "paged_course/grading/classroom.py",
    "paged_course/grading/autograder.py",
    "tests/unit/test_release.py",
    "tests/unit/test_autograder.py",
)
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".hypothesis", ".ruff_cache"}
MARKER_FILE = ".paged-release"
SOLUTION_READERS = {
    "sync"
}  # functions that read solutions/ themselves (paged_course/publish/sync.py)
_SOLUTIONS_IMPORT = re.compile(
    r"^\s*(?:from\s+solutions\b|import\s+solutions\b)|import_module\(\s*['\"]solutions\b", re.M
)

HIDDEN_CONFTEST = '''"""Hidden graded tests, copied in by `python -m paged course release --hidden-tests`.

They are collected only when PAGED_HIDDEN=1 (the autograder sets it); a learner's `pytest` and
`python -m paged grade` skip this folder. Each test here also gets the `hidden` marker.
"""

import os

import pytest

if os.environ.get("PAGED_HIDDEN") != "1":
    collect_ignore_glob = ["*.py"]


def pytest_configure(config):
    config.addinivalue_line("markers", "hidden: an instructor's hidden graded test")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/hidden/" in item.nodeid.replace("\\\\", "/"):
            item.add_marker(pytest.mark.hidden)
'''

STUDENT_CI = """#!/usr/bin/env bash
# CI of a student release (written by `python -m paged course release --without-solutions`): install
# from scratch, run every test that is not graded (package + chapter notebooks), then grade exercises/.
# The score is printed and saved in grading/; it never fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0
pip install -q -e ".[notebooks,dev]"
pytest -m "not exercise and not gpu and not slow and not browser"
python -m paged grade --report grading
"""

README_STUDENT = """> **Student release.** This copy of the course has no `solutions/` folder. Here the graded tests in
> `tests/exercises/` import *your* files in `exercises/` by default (`--impl exercises`), so they fail
> until you fill in the marked regions; that is expected. Grade yourself with `python -m paged grade`
> (or `python -m paged grade ch02` for one chapter). Run everything that is not graded with
> `pytest -m "not exercise"`.{hidden}

"""
README_WITH_SOLUTIONS = """> **Release with solutions.** `pytest` checks the reference answers in `solutions/`;
> `python -m paged grade` grades your own `exercises/`.{hidden}

"""
README_HIDDEN = (
    "\n> `tests/exercises/hidden/` holds extra graded tests, skipped unless `PAGED_HIDDEN=1` is set "
    "(`PAGED_HIDDEN=1 python -m paged grade`)."
)


class ReleaseError(ValueError):
    """The release cannot be written as asked (output not empty, a module needs solutions/, ...)."""


@dataclass
class Release:
    """What ``build_release`` wrote: the tree, its file count, dropped test files, hidden test files."""

    out: Path
    with_solutions: bool
    files: int = 0
    dropped: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)


def references_solutions(source: str, path_strings: bool = False) -> bool:
    """True when Python ``source`` imports ``solutions`` (also through ``importlib.import_module``).

    With ``path_strings`` a string constant ``"solutions"``, ``"solutions/..."`` or ``"solutions.x"``
    counts too (a test that reads the folder), and so does a call of a function that reads the folder
    itself (``SOLUTION_READERS``: the exercise generator's ``sync``). Unparsable source falls back to a
    line regex.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return bool(_SOLUTIONS_IMPORT.search(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "solutions" for a in node.names
        ):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] == "solutions"
            and not node.level
        ):
            return True
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if (
                name in ("import_module", "__import__")
                and str(node.args[0].value).split(".")[0] == "solutions"
            ):
                return True
        if path_strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"solutions(?:[./].*)?", node.value):
                return True
        if (
            path_strings
            and isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in SOLUTION_READERS
        ):
            return True
    return False


def without_solution_tests(source: str) -> tuple[str | None, list[str]]:
    """Remove the top-level tests (functions ``test*``, classes ``Test*``) of a test module that use solutions/.

    Returns ``(new_source, removed_names)``; ``new_source`` is None when the whole file must go (other
    module-level code uses solutions/, or no test would be left).
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    cut, names, tests_left = [], [], 0
    for node in tree.body:
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        segment = "".join(lines[start - 1 : node.end_lineno])
        is_test = (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test")
            or isinstance(node, ast.ClassDef)
            and node.name.startswith("Test")
        )
        if not references_solutions(segment, path_strings=True):
            tests_left += is_test
        elif is_test:
            cut.append((start, node.end_lineno))
            names.append(node.name)
        else:
            return None, []
    if not tests_left:
        return None, []
    for start, end in reversed(cut):
        del lines[start - 1 : end]
    return re.sub(r"\n{4,}", "\n\n\n", "".join(lines)).rstrip("\n") + "\n", names


def notebook_code(path: Path) -> str:
    """The code cells of an ``.ipynb``, joined, with IPython magics and shell lines blanked."""
    cells = json.loads(path.read_text()).get("cells", [])
    code = [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        for c in cells
        if c.get("cell_type") == "code"
    ]
    return "\n".join(re.sub(r"(?m)^\s*[%!].*$", "", c) for c in code)


def set_default_impl(conftest: str, impl: str = "exercises") -> str:
    """Rewrite the ``default=`` of the ``parser.addoption("--impl", ...)`` call in ``conftest`` source.

    Raises ReleaseError when there is no such call with a constant default.
    """
    for node in ast.walk(ast.parse(conftest)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "addoption"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "--impl"
        ):
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(default, ast.Constant):
                lines = conftest.splitlines(keepends=True)
                start = sum(len(line) for line in lines[: default.lineno - 1]) + default.col_offset
                end = (
                    sum(len(line) for line in lines[: default.end_lineno - 1])
                    + default.end_col_offset
                )
                old = default.value
                call_end = (
                    sum(len(line) for line in lines[: node.end_lineno - 1]) + node.end_col_offset
                )
                tail = conftest[end:call_end].replace(f"default: {old}", f"default: {impl}")
                return conftest[:start] + repr(impl).replace("'", '"') + tail + conftest[call_end:]
    raise ReleaseError(
        "tests/conftest.py has no parser.addoption('--impl', default=...) to point at exercises/"
    )


def _copy(src: Path, dst: Path) -> int:
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        return 1
    count = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if (
            path.is_dir()
            or SKIP_DIRS & set(rel.parts)
            or path.suffix == ".pyc"
            or any(p.endswith(".egg-info") for p in rel.parts)
        ):
            continue
        count += _copy(path, dst / rel)
    return count


def _write_stubs(root: Path, out: Path, student: bool) -> None:
    """``exercises/`` of the tree, generated afresh from ``root/solutions`` (a filled-in local copy never ships).

    ``student`` (a release without solutions): the files' headers and the package docstring say what a
    student does with them, not where they were generated from."""
    from paged_course.publish.sync import STUDENT_INIT, make_stub

    target = out / "exercises"
    for path in target.glob("ex*.py"):
        path.unlink()
    for path in sorted((root / "solutions").glob("ex*.py")):
        stub = make_stub(path.read_text(), f"solutions/{path.name}", student=student)
        (target / path.name).write_text(stub)
    if student:
        (target / "__init__.py").write_text(STUDENT_INIT)


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _add_hidden(hidden_dir: Path, out: Path, release: Release) -> None:
    if not hidden_dir.is_dir():
        raise ReleaseError(f"--hidden-tests: {hidden_dir} is not a folder")
    if (hidden_dir / "conftest.py").exists():
        raise ReleaseError(
            f"--hidden-tests: {hidden_dir}/conftest.py would replace the hidden folder's "
            "conftest; move its fixtures into the test files"
        )
    target = out / "tests" / "exercises" / "hidden"
    _copy(hidden_dir, target)
    for path in sorted(target.rglob("test_*.py")):
        if not path.name.startswith("test_hidden_"):
            path = path.rename(path.with_name("test_hidden_" + path.name.removeprefix("test_")))
        release.hidden.append(str(path.relative_to(out)))
    if not release.hidden:
        raise ReleaseError(f"--hidden-tests: no test_*.py files in {hidden_dir}")
    (target / "conftest.py").write_text(HIDDEN_CONFTEST)


def _strip_solutions(out: Path, release: Release) -> None:
    for rel in INSTRUCTOR_ONLY:
        (out / rel).unlink(missing_ok=True)
    conftest = out / "tests" / "conftest.py"
    conftest.write_text(set_default_impl(conftest.read_text()))
    for path in sorted((out / "tests").rglob("test_*.py")):
        source, rel = path.read_text(), str(path.relative_to(out))
        if not references_solutions(source, path_strings=True):
            continue
        kept, dropped = without_solution_tests(source)
        if kept is None:
            path.unlink()
            release.dropped.append(rel)
        else:
            path.write_text(kept)
            release.dropped += [f"{rel}::{name}" for name in dropped]
    folders = ("paged", "paged_course", "kernels", "exercises", "chapters", "tests", "scripts")
    needs = [
        str(p.relative_to(out))
        for folder in folders
        for p in sorted((out / folder).rglob("*.py"))
        if references_solutions(p.read_text())
    ]
    needs += [
        str(p.relative_to(out))
        for p in sorted((out / "chapters").rglob("*.ipynb"))
        if references_solutions(notebook_code(p))
    ]
    if needs:
        raise ReleaseError(
            "these files import solutions/ and would fail in a release without it: "
            + ", ".join(needs)
        )
    (out / ".ci").mkdir(exist_ok=True)
    (out / ".ci" / "run").write_text(STUDENT_CI)
    (out / ".ci" / "run").chmod(0o755)


def build_release(
    out: Path, root: Path = ROOT, with_solutions: bool = True, hidden_tests: Path | None = None
) -> Release:
    """Write the student tree of the course at ``root`` into ``out`` (which must be absent or empty).

    Raises ReleaseError when ``out`` is not empty or lies inside ``root``, when the hidden tests folder
    is unusable, or (without solutions) when a chapter or module imports ``solutions``. On error the
    partly written ``out`` is removed.
    """
    root, out = Path(root).resolve(), Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out} exists and is not empty; choose a new folder")
    if out == root or root in out.parents:
        raise ReleaseError(f"{out} is inside the course at {root}; write the release elsewhere")
    release = Release(out, with_solutions)
    try:
        for rel in INCLUDE + (("solutions",) if with_solutions else ()):
            if (root / rel).exists():
                release.files += _copy(root / rel, out / rel)
        for rel in INSTRUCTOR_TOOLS:
            if (out / rel).exists():
                (out / rel).unlink()
                release.files -= 1
        _write_stubs(root, out, student=not with_solutions)
        if not with_solutions:
            _strip_solutions(out, release)
        if hidden_tests is not None:
            _add_hidden(Path(hidden_tests), out, release)
        _write_readme_and_classroom(out, release, _git_commit(root))
    except Exception:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return release


def _write_readme_and_classroom(out: Path, release: Release, commit: str | None) -> None:
    note = (README_WITH_SOLUTIONS if release.with_solutions else README_STUDENT).format(
        hidden=README_HIDDEN if release.hidden else ""
    )
    readme = out / "README.md"
    readme.write_text(note + (readme.read_text() if readme.exists() else "# paged\n"))
    # recount the points from the tree's own graded tests (hidden ones included): never a stale copy
    classroom.write(out, hidden=bool(release.hidden), workflow=True)
    (out / MARKER_FILE).write_text(
        json.dumps(
            {
                "solutions": release.with_solutions,
                "default_impl": "solutions" if release.with_solutions else "exercises",
                "hidden_tests": release.hidden,
                "dropped_tests": release.dropped,
                "source_commit": commit,
            },
            indent=2,
        )
        + "\n"
    )


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m paged course release", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=Path, metavar="OUT_DIR", help="new folder for the student tree")
    parser.add_argument(
        "--without-solutions", action="store_true", help="leave solutions/ out; grade exercises/"
    )
    parser.add_argument(
        "--hidden-tests", type=Path, metavar="DIR", help="extra graded tests, hidden by default"
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the course to release (default: this one)"
    )
    args = parser.parse_args(argv)
    try:
        release = build_release(args.out, args.root, not args.without_solutions, args.hidden_tests)
    except ReleaseError as err:
        parser.error(str(err))
    print(
        f"wrote {release.files} files to {release.out} ("
        + (
            "with solutions"
            if release.with_solutions
            else "without solutions; --impl defaults to exercises"
        )
        + ")"
    )
    for rel in release.dropped:
        print(f"  dropped {rel} (uses solutions/)")
    for rel in release.hidden:
        print(f"  hidden  {rel}")
    return 0
