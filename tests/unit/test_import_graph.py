"""The engine's import graph: no cycle among ``paged/`` modules, nothing from ``paged_course`` (the course
tooling) except in ``paged/__main__.py``, and no import from a lower layer to a higher one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# lowest first: a module may import from its own layer and the layers below it (longest prefix decides)
LAYERS = [
    ("paged.config", "paged.core", "paged.kernels"),
    ("paged.worker",),
    ("paged.engine", "paged.models"),
    ("paged", "paged.__main__"),
]


def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "kernels"):  # pyproject maps kernels/ to paged.kernels
        parts = ("paged", "kernels", *path.relative_to(ROOT / "kernels").with_suffix("").parts)
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def _imports() -> dict[str, set[str]]:
    """``{module: every module name it imports}`` over ``paged/`` and ``kernels/``."""
    graph = {}
    for path in [*(ROOT / "paged").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                imported.add(base)
                imported |= {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = imported
    return graph


def _internal(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def _layer(module: str) -> int:
    matches = [
        (len(prefix), i)
        for i, group in enumerate(LAYERS)
        for prefix in group
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1]


def test_no_import_cycle_among_engine_modules():
    graph = _internal(_imports())
    assert len(graph) >= 25, f"found only {len(graph)} modules: the walk missed files"
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            assert state.get(dep) != 1, f"import cycle: {' -> '.join([*path, module, dep])}"
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_engine_imports_nothing_from_the_course_but_its_command_line():
    wrong = {
        m: sorted(d for d in deps if d == "paged_course" or d.startswith("paged_course."))
        for m, deps in _imports().items()
        if m != "paged.__main__"
    }
    assert {m: d for m, d in wrong.items() if d} == {}


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in _internal(_imports()).items()
        for d in sorted(deps)
        if _layer(d) > _layer(m)
    ]
    assert upward == []
