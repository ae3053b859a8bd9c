"""The layout of ``paged_course/``: module size, import cycles, each sub-package's import rule (viz never
imports bench; the ledger never runs a bench module) and its docstring. Each check is also run on a planted
breach (a module of 401 code lines, a cycle, a viz -> bench import), so it is known to fail when it should.

A code line is counted as ``scripts/engine_lines.py`` counts it (not blank, not a comment, not a docstring) on
the formatted tree (CI checks ``ruff format --check``). Imports are read with ``ast`` from every module,
including the ones made inside functions, so a lazy import still counts as an edge.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "paged_course"

sys.path.insert(0, str(ROOT / "scripts"))
from course_lines import MODULE_LIMIT  # noqa: E402  (400; scripts/course_lines.py prints the table)
from engine_lines import code_lines  # noqa: E402

# What each sub-package must not import (its ``__init__`` docstring says the same); the top-level modules
# (``check``, ``capstone``, ``predict`` and the old-path aliases) are not a sub-package and are not listed.
FORBIDDEN = {
    "bench": {"grading", "publish", "tools"},
    "grading": {"bench", "sim", "viz", "tools"},
    "kernel_lab": {"bench", "grading", "publish", "reference", "sim", "tools", "viz"},
    "publish": {"bench", "sim", "viz", "tools"},
    "reference": {"bench", "viz", "grading", "publish", "tools"},
    "sim": {"bench", "viz", "grading", "publish", "tools"},
    "tools": set(),
    "viz": {"bench", "grading", "publish", "tools"},
}
BENCH_TO_VIZ = {  # a benchmark's run() draws its figure from the rows it computed (viz never calls back)
    ("paged_course.bench.engine", "paged_course.viz.measure"),
    ("paged_course.bench.kernel", "paged_course.viz.kernels"),
    ("paged_course.bench.kernel_gpu", "paged_course.viz.kernels"),
    ("paged_course.bench.latency", "paged_course.viz.latency"),
    ("paged_course.bench.sim", "paged_course.viz.fragmentation"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """The ``paged_course`` modules ``name`` imports (a ``from pkg import sub`` counts as ``pkg.sub``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, package)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in MODULES else base for t in targets]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module of ``graph`` (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def over_limit(sources: dict[str, str]) -> dict[str, int]:
    """``{module: code lines}`` of the modules over :data:`MODULE_LIMIT`."""
    counts = {name: code_lines(source) for name, source in sources.items()}
    return {name: n for name, n in counts.items() if n > MODULE_LIMIT}


def sub_package(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FORBIDDEN) else None


def forbidden_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports that break a sub-package's rule (:data:`FORBIDDEN`): viz -> bench among them."""
    return {
        (a, b)
        for a, bs in graph.items()
        for b in bs
        if sub_package(a) in FORBIDDEN and sub_package(b) in FORBIDDEN[sub_package(a)]
    }


def test_no_module_over_the_limit():
    over = over_limit({name: path.read_text() for name, path in MODULES.items()})
    assert not over, f"modules over {MODULE_LIMIT} code lines (split them by concern): {over}"


def test_no_import_cycle_inside_paged_course():
    assert cycles(GRAPH) == []


def test_viz_never_imports_bench():
    edges = {(a, b) for a, bs in GRAPH.items() for b in bs if a.startswith("paged_course.viz")}
    assert not {(a, b) for a, b in edges if b.startswith("paged_course.bench")}


def test_each_sub_package_keeps_its_import_rule():
    assert set(FORBIDDEN) == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}, (
        "every sub-package has a rule"
    )
    assert forbidden_edges(GRAPH) == set()


def test_the_ledger_reads_bench_results_and_never_runs_a_bench_module():
    ledger = {n for n in GRAPH if n.startswith("paged_course.reference.ledger")}
    assert ledger and not {
        b for a in ledger for b in GRAPH[a] if b.startswith("paged_course.bench")
    }


def test_bench_imports_viz_only_where_listed():
    edges = {
        (a, b)
        for a, bs in GRAPH.items()
        for b in bs
        if a.startswith("paged_course.bench") and b.startswith("paged_course.viz")
    }
    assert edges == BENCH_TO_VIZ


def test_every_sub_package_says_what_it_owns_and_must_not_import():
    for name in FORBIDDEN:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        assert "owns" in doc.lower() and "import" in doc, (
            f"paged_course/{name}/__init__.py: {doc[:80]!r}"
        )


def test_the_checks_fail_on_planted_breaches():
    """Each check on a planted fault, so a broken parser or a loosened rule cannot pass the tests above."""
    assert "paged_course.sim.workload" in GRAPH["paged_course.viz.measure"]
    assert code_lines('"""doc."""\n\nx = 1  # c\n\n\ndef f():\n    """d."""\n    return x\n') == 3
    big = '"""A module."""\n\n' + "".join(f"x{i} = {i}\n" for i in range(MODULE_LIMIT + 1))
    assert over_limit({"big": big, "fine": big.replace(f"x{MODULE_LIMIT} = ", "# ")}) == {
        "big": MODULE_LIMIT + 1
    }
    planted = {
        **GRAPH,
        "paged_course.viz.blocks": {*GRAPH["paged_course.viz.blocks"], "paged_course.bench.prefix"},
    }
    assert forbidden_edges(planted) == {("paged_course.viz.blocks", "paged_course.bench.prefix")}
    loop = {**GRAPH, "paged_course.sim.workload": {"paged_course.sim.fragmentation"}}
    assert any(
        {"paged_course.sim.fragmentation", "paged_course.sim.workload"} <= set(c)
        for c in cycles(loop)
    )
    assert (
        sub_package("paged_course.bench.kernel") == "bench"
        and sub_package("paged_course.check") is None
    )
