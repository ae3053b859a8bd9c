"""The engine's tests stand alone: no file in ``tests/engine/`` imports the course package.

Imports are read with ``ast`` (lazy ones inside functions included), so a test cannot lean on
``paged_course`` for a model, a comparison or a workload; ``tests/engine/tiny.py`` provides those.
"""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_engine_test_imports_the_course():
    files = sorted(HERE.glob("*.py"))
    assert len(files) > 2, f"expected the engine's tests in {HERE}"
    bad = {
        path.name: sorted(m for m in imported_modules(path) if m.split(".")[0] == "paged_course")
        for path in files
    }
    bad = {name: mods for name, mods in bad.items() if mods}
    assert not bad, f"engine tests must not import the course package: {bad}"


def test_the_check_sees_a_course_import(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text("def f():\n    from paged_course.reference.models import tiny_model\n")
    assert "paged_course.reference.models" in imported_modules(planted)
