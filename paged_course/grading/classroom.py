"""GitHub Classroom autograding, generated from the graded tests' own ``exercise(id, points)`` markers.

``python -m paged_course.grading.classroom [--check] [--root DIR]`` writes ``.github/classroom/autograding.json``:
one test entry per chapter whose points are the sum of that chapter's graded tests, as pytest collects
them (a parametrized test counts once per case, exactly as ``python -m paged grade`` scores it), so the
classroom total and the grader's total never disagree. The markers are read from the test files' source
(``static_tests``) or, when a file needs it, by pytest collection with the grader's plugin
(``collected_tests``). ``--check`` exits 1 when the committed file is stale (``tests/unit/test_autograder.py``
runs it). ``plan`` prints each chapter's exercise sizes (lines in the solution regions), points and the
graded tests' assertion messages: the material of ``docs/instructor.md``.

Each entry runs ``python -m paged grade chNN --strict``: the grader for that chapter, which with
``--strict`` exits 0 only at full marks, because GitHub Classroom awards an entry's points on exit
status 0 (without it the grader always exits 0 for learners). Student releases ship the grader but
not this module.
``workflow_yaml`` renders the same entries as a ``.github/workflows/classroom.yml`` for the
``classroom-resources/autograding-command-grader`` actions; releases ship it (the course repository
itself does not, so its own pushes are not graded).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = Path(".github") / "classroom" / "autograding.json"
WORKFLOW = Path(".github") / "workflows" / "classroom.yml"
HIDDEN_ENV = "PAGED_HIDDEN"  # "1": also collect and grade tests/exercises/hidden (see paged_course/publish/release.py)
TIMEOUT_MIN = 10  # minutes per chapter entry on GitHub's runners
INSTALL = (
    "python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu "
    '&& python -m pip install -q -e ".[dev]"'
)


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


def chapter_points(tests: list[dict]) -> dict[str, dict]:
    """``{"ch01": {"points": 22, "tests": 12, "exercises": ["ch01.ex1", ...]}, ...}`` in chapter order."""
    table: dict[str, dict] = {}
    for test in sorted(tests, key=lambda t: t["id"]):
        row = table.setdefault(test["id"].split(".")[0], {"points": 0, "tests": 0, "exercises": []})
        row["points"] += test["points"]
        row["tests"] += 1
        if test["id"] not in row["exercises"]:
            row["exercises"].append(test["id"])
    return table


def grade_command(chapter: str, hidden: bool = False) -> str:
    return (f"env {HIDDEN_ENV}=1 " if hidden else "") + f"python -m paged grade {chapter} --strict"


def autograding_config(chapters: dict[str, dict], hidden: bool = False) -> dict:
    """The ``autograding.json`` document (GitHub Classroom's legacy ``education/autograding`` format)."""
    tests = []
    for i, (chapter, row) in enumerate(chapters.items()):
        tests.append(
            {
                "name": f"{chapter}: {', '.join(row['exercises'])} ({row['tests']} tests)",
                "setup": INSTALL if i == 0 else "",
                "run": grade_command(chapter, hidden),
                "input": "",
                "output": "",
                "comparison": "included",
                "timeout": TIMEOUT_MIN,
                "points": row["points"],
            }
        )
    return {"tests": tests}


def render(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


def workflow_yaml(config: dict) -> str:
    """A ``.github/workflows/classroom.yml`` with one command-grader step per entry of ``config``, then the reporter."""
    chapters = {re.search(r"grade (ch\d\d)", t["run"])[1]: t for t in config["tests"]}
    lines = [
        "# Generated by `python -m paged_course.grading.classroom`; points from the tests' exercise markers.",
        "name: Autograding Tests",
        "on: [push, workflow_dispatch, repository_dispatch]",
        "permissions:",
        "  checks: write",
        "  actions: read",
        "  contents: read",
        "jobs:",
        "  run-autograding-tests:",
        "    runs-on: ubuntu-latest",
        "    if: github.actor != 'github-classroom[bot]'",
        "    steps:",
        "      - uses: actions/checkout@v4",
        "      - uses: actions/setup-python@v5",
        "        with:",
        "          python-version: '3.11'",
        "      - name: install the course (CPU torch)",
        f"        run: {INSTALL}",
    ]
    for chapter, test in chapters.items():
        lines += [
            f"      - name: {chapter}",
            f"        id: {chapter}",
            "        uses: classroom-resources/autograding-command-grader@v1",
            "        with:",
            f"          test-name: {chapter}",
            f"          command: {test['run']}",
            f"          timeout: {test['timeout']}",
            f"          max-score: {test['points']}",
        ]
    lines += [
        "      - name: Autograding Reporter",
        "        uses: classroom-resources/autograding-grading-reporter@v1",
        "        env:",
    ]
    lines += [
        f'          {c.upper()}_RESULTS: "${{{{steps.{c}.outputs.result}}}}"' for c in chapters
    ]
    lines += ["        with:", f"          runners: {','.join(chapters)}"]
    return "\n".join(lines) + "\n"


def write(
    root: Path, hidden: bool = False, workflow: bool = False, check: bool = False
) -> list[str]:
    """Write (or with ``check`` only compare) the classroom files under ``root``; return the stale paths."""
    config = autograding_config(chapter_points(collect(root, hidden)), hidden)
    wanted = {CONFIG: render(config)}
    if workflow:
        wanted[WORKFLOW] = workflow_yaml(config)
    stale = []
    for rel, text in wanted.items():
        path = Path(root) / rel
        if not path.exists() or path.read_text() != text:
            stale.append(str(rel))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale


def exercise_sizes(root: Path) -> dict[str, dict]:
    """Per chapter, from ``solutions/ex*.py``: ``{"ch01": {"files", "exercises": {id: (lines, hint)}, "lines"}}``
    (``files``: the solution files that hold the chapter's regions, in name order).

    ``lines`` counts the non-blank, non-comment lines inside each ``BEGIN/END SOLUTION`` region: the
    code a learner writes (the workshop plan sizes its exercise slots from it).
    """
    from paged_course.publish.sync import BEGIN, END

    table: dict[str, dict] = {}
    for path in sorted((Path(root) / "solutions").glob("ex*.py")):
        current = None
        for line in path.read_text().splitlines():
            if (m := BEGIN.match(line)) is not None:
                current = m["id"]
                row = table.setdefault(
                    current.split(".")[0], {"files": [], "exercises": {}, "lines": 0}
                )
                if path.name not in row["files"]:
                    row["files"].append(path.name)
                row["exercises"][current] = [0, (m["hint"] or "").strip()]
            elif END.match(line):
                current = None
            elif current and line.strip() and not line.strip().startswith("#"):
                row = table[current.split(".")[0]]
                row["exercises"][current][0] += 1
                row["lines"] += 1
    return table


def failure_messages(root: Path) -> dict[str, list[str]]:
    """Per exercise id, the assertion messages of its graded tests (placeholders shown as ``{...}``).

    They name the invariant a wrong answer breaks, so they list the mistakes learners make.
    """
    out: dict[str, list[str]] = {}
    for path in sorted((Path(root) / "tests" / "exercises").rglob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            mark = next((m for d in node.decorator_list if (m := _mark(d, "exercise"))), None)
            if mark is None:
                continue
            ex_id = (
                next((k.value.value for k in mark.keywords if k.arg == "id"), None)
                or mark.args[0].value
            )
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assert) and sub.msg is not None:
                    text = "".join(
                        v.value if isinstance(v, ast.Constant) else "{...}"
                        for v in (
                            sub.msg.values if isinstance(sub.msg, ast.JoinedStr) else [sub.msg]
                        )
                    )
                    if text not in out.setdefault(ex_id, []):
                        out[ex_id].append(text)
    return out


def plan_main(argv: list[str]) -> int:
    """``plan``: print, per chapter, graded points, exercise sizes and the tests' failure messages."""
    root = Path(argv[0]) if argv else Path.cwd()
    points, sizes, messages = (
        chapter_points(collect(root)),
        exercise_sizes(root),
        failure_messages(root),
    )
    print(
        "| chapter | files | exercises | solution lines | graded tests | points |\n|---|---|---|---|---|---|"
    )
    for chapter in sorted(set(points) | set(sizes)):
        size, pts = sizes.get(chapter, {}), points.get(chapter, {})
        files = ", ".join(size.get("files", [])) or "-"
        print(
            f"| {chapter} | {files} | {len(size.get('exercises', {}))} | {size.get('lines', 0)} "
            f"| {pts.get('tests', 0)} | {pts.get('points', 0)} |"
        )
    for _chapter, size in sorted(sizes.items()):
        for ex_id, (lines, hint) in size["exercises"].items():
            print(f"\n{ex_id} ({lines} lines): {hint}")
            for msg in messages.get(ex_id, []):
                print(f"  - {msg}")
    return 0


def main(argv: list[str]) -> int:
    import argparse

    if argv[:1] == ["plan"]:
        return plan_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m paged_course.grading.classroom", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 when the file is stale"
    )
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--hidden", action="store_true", help="count tests/exercises/hidden too")
    parser.add_argument(
        "--workflow", action="store_true", help="also write .github/workflows/classroom.yml"
    )
    args = parser.parse_args(argv)
    stale = write(args.root, args.hidden, args.workflow, args.check)
    if args.check and stale:
        print("stale: " + ", ".join(stale) + "\nrun: python -m paged_course.grading.classroom")
        return 1
    print(("would update: " if args.check else "updated: ") + (", ".join(stale) or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
