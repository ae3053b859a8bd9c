"""Which graded tests exist and what each is worth: ``[{"nodeid", "id", "points"}, ...]``.

Read from the test files' ``exercise(id, points)`` markers (``static_tests``: a parametrized test counts
once per case, exactly as ``python -m paged grade`` scores it) or, when a file does something the static
reader cannot count, by pytest collection with the grader's plugin (``collected_tests``). The Classroom
config (``classroom``) sums these per chapter and the planted-bug runner (``mutants``) finds the graded
regions with them; it ships in the student release, which withholds ``classroom``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HIDDEN_ENV = "PAGED_HIDDEN"  # "1": also collect and grade tests/exercises/hidden (see paged_course/publish/release.py)


def collect(root: Path, hidden: bool = False) -> list[dict]:
    """Every graded test under ``root/tests/exercises``: ``[{"nodeid", "id", "points"}, ...]``.

    Reads the test files statically (``static_tests``, milliseconds) and falls back to pytest
    collection (``collected_tests``) when a file does something the static reader cannot count.
    """
    tests = static_tests(root, hidden)
    return tests if tests is not None else collected_tests(root, hidden)


def collected_tests(root: Path, hidden: bool = False) -> list[dict]:
    """The graded tests as pytest collects them, in collection order (the grader's own view).

    Collects in a pytest subprocess with the grader's plugin (``-p paged_course.grading.plugin``), which logs each
    test's ``exercise`` marker. Raises RuntimeError when collection fails (a broken test file must not
    silently drop its points).
    """
    root = Path(root)
    env = dict(os.environ, TQDM_DISABLE="1")
    env.pop("PAGED_GRADE_CHAPTERS", None)
    env[HIDDEN_ENV] = "1" if hidden else "0"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "collected.jsonl"
        env["PAGED_GRADE_LOG"] = str(log)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "tests/exercises",
                "--collect-only",
                "-q",
                "-p",
                "paged_course.grading.plugin",
                "-p",
                "no:cacheprovider",
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode not in (0, 5):
            raise RuntimeError(
                f"collecting the graded tests in {root} failed (pytest exit {proc.returncode}):\n"
                f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
            )
        events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [
        {"nodeid": e["nodeid"], "id": e["id"], "points": int(e["points"])}
        for e in events
        if e["event"] == "collected"
    ]


def _mark(node: ast.expr, name: str) -> ast.Call | None:
    """``node`` if it is a call of ``pytest.mark.<name>`` (or ``mark.<name>``), else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
    ):
        owner = node.func.value
        if getattr(owner, "attr", getattr(owner, "id", None)) == "mark":
            return node
    return None


def _cases(values: ast.expr, constants: dict[str, ast.expr]) -> int | None:
    """How many cases a parametrize argvalues node holds, or None when it cannot be counted statically."""
    if isinstance(values, ast.Name) and values.id in constants:
        values = constants[values.id]
    if isinstance(values, (ast.List, ast.Tuple, ast.Set)) and not any(
        isinstance(e, ast.Starred) for e in values.elts
    ):
        return len(values.elts)
    if (
        isinstance(values, ast.Call)
        and getattr(values.func, "id", "") == "range"
        and len(values.args) == 1
        and isinstance(values.args[0], ast.Constant)
    ):
        return max(0, int(values.args[0].value))
    return None


def _static_file(path: Path, rel: str) -> list[dict] | None:
    source = path.read_text()
    tree = ast.parse(source)
    if (
        "pytest_generate_tests" in source
        or "pytestmark" in source
        or any(
            isinstance(n, ast.Call)
            and getattr(n.func, "attr", getattr(n.func, "id", "")) == "fixture"
            and any(k.arg == "params" for k in n.keywords)
            for n in ast.walk(tree)
        )
    ):
        return None  # parametrized fixtures or module-level marks: let pytest count
    constants = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    tests = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            return None  # test classes (and their marks): let pytest count
        if not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef)
        ) or not node.name.startswith("test"):
            continue
        exercise = next((m for d in node.decorator_list if (m := _mark(d, "exercise"))), None)
        if exercise is None:
            continue
        args = [a for a in exercise.args if isinstance(a, ast.Constant)]
        kwargs = {k.arg: k.value for k in exercise.keywords}
        ex_id = kwargs["id"].value if "id" in kwargs else args[0].value
        points = (
            kwargs["points"].value
            if "points" in kwargs
            else (args[1].value if len(args) > 1 else 1)
        )
        count = 1
        for deco in node.decorator_list:
            if (param := _mark(deco, "parametrize")) is not None:
                values = (
                    param.args[1]
                    if len(param.args) > 1
                    else next((k.value for k in param.keywords if k.arg == "argvalues"), None)
                )
                cases = None if values is None else _cases(values, constants)
                if cases is None:
                    return None
                count *= cases
        tests += [
            {"nodeid": f"{rel}::{node.name}", "id": str(ex_id), "points": int(points)}
        ] * count
    return tests


def static_tests(root: Path, hidden: bool = False) -> list[dict] | None:
    """The graded tests read from the source of ``tests/exercises/**/test_*.py`` without running pytest.

    A parametrized test counts once per case (as pytest collects it). Node ids name the test function
    only (no parameter suffix). Returns None when some file needs pytest to be counted (parametrized
    fixtures, ``pytest_generate_tests``, module or class marks, computed argvalues).
    """
    root = Path(root)
    tests: list[dict] = []
    for path in sorted((root / "tests" / "exercises").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        if "/hidden/" in f"/{rel}" and not hidden:
            continue
        found = _static_file(path, rel)
        if found is None:
            return None
        tests += found
    return tests
