"""The repository's layout promises: the engine stands alone, and no import cycle anywhere.

``paged/`` (with ``paged.kernels`` from ``kernels/``) is the engine; ``paged_course/`` is the course
tooling beside it. The engine never imports the tooling (``paged/__main__.py``, the thin CLI entry,
is the one exception), and neither package has an import cycle between its modules. The graph is read
from the source with ``ast`` (imports inside functions count too: a lazy import still couples modules).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "kernels":
        rel = Path("paged", "kernels", *rel.parts[1:])
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    paths = [
        *ROOT.glob("paged/**/*.py"),
        *ROOT.glob("kernels/**/*.py"),
        *ROOT.glob("paged_course/**/*.py"),
    ]
    return {_module_name(p): p for p in paths}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Known modules that ``name`` imports (``from a.b import c`` counts ``a.b.c`` when it is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def test_the_engine_never_imports_the_course_tooling():
    graph = _graph()
    bad = sorted(
        f"{m} imports {t}"
        for m, targets in graph.items()
        if m.split(".")[0] == "paged" and m != "paged.__main__"
        for t in targets
        if t.split(".")[0] == "paged_course"
    )
    assert not bad, (
        "the engine must stand alone; move these imports into paged_course: " + "; ".join(bad)
    )


def test_no_import_cycle_in_either_package():
    graph = _graph()
    # a package's __init__ re-exporting its own modules is not a cycle between modules
    edges = {
        m: {t for t in ts if not (t == m.rpartition(".")[0] or m == t.rpartition(".")[0])}
        for m, ts in graph.items()
    }
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_jupyterlab_shows_one_entry_per_chapter():
    """The paired jupytext sources live in chapters/src/, so the file browser lists each chapter once."""
    chapters = ROOT / "chapters"
    notebooks = sorted(p.stem for p in chapters.glob("[0-9][0-9]_*.ipynb"))
    sources = sorted(p.stem for p in (chapters / "src").glob("[0-9][0-9]_*.py"))
    assert notebooks and notebooks == sources, f"one source per notebook: {notebooks} vs {sources}"
    beside = sorted(p.name for p in chapters.iterdir() if p.is_file() and p.suffix != ".ipynb")
    assert not beside, (
        f"files beside the notebooks show up in JupyterLab as extra chapters: {beside}"
    )


def test_the_engine_stays_within_its_line_budget():
    """``scripts/engine_lines.py``: paged/ + kernels/ within its limits (formatted code lines)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "engine_lines", ROOT / "scripts" / "engine_lines.py"
    )
    lines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lines)
    counts = lines.count(ROOT)
    assert counts and lines.code_lines('"""doc."""\n\n# c\nx = 1\n') == 1, (
        "docstrings, comments, blanks: not code"
    )
    assert not lines.problems(counts), lines.problems(counts)


def test_every_chapter_with_check_cells_offers_its_hints():
    """A chapter that checks regions imports ``hint`` and tells the learner about it: a learner who types
    ``hint("ch05.ex2")`` must get a nudge, not a NameError."""
    missing = []
    for src in sorted((ROOT / "chapters" / "src").glob("[0-9][0-9]_*.py")):
        text = src.read_text()
        if "check(" not in text:
            continue
        imported = re.search(r"from paged_course\.check import \(?[^)]*\bhint\b", text)
        told = re.search(r"`hint\(\"ch\d\d\.ex", text)
        if not (imported and told):
            missing.append(
                f"{src.name}: import {'ok' if imported else 'missing'}, prose {'ok' if told else 'missing'}"
            )
    assert not missing, missing
