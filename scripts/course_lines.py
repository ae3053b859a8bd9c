"""Code lines of the course package, per sub-package: ``python scripts/course_lines.py [--modules]``.

Counted as ``scripts/engine_lines.py`` counts the engine (no blank line, comment or docstring) over
``paged_course/``. Prints one row per sub-package (modules, code lines, its largest module), then every
module over ``MODULE_LIMIT`` (exit 1 if any); ``--modules`` also lists every module. The same limit is a
test: ``tests/unit/test_package_layout.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine_lines import ROOT, code_lines

MODULE_LIMIT = 400


def count(root: Path = ROOT) -> dict[str, int]:
    """``{module path: code lines}`` for every module of ``paged_course/``."""
    paths = sorted((root / "paged_course").rglob("*.py"))
    return {str(p.relative_to(root)): code_lines(p.read_text()) for p in paths}


def main(argv: list[str]) -> int:
    counts = count()
    groups: dict[str, dict[str, int]] = {}
    for path, n in counts.items():
        parts = Path(path).parts
        groups.setdefault(parts[1] + "/" if len(parts) > 2 else "(top level)", {})[path] = n
    print(f"{'sub-package':<14}{'modules':>8}{'code lines':>12}  largest module")
    for name, modules in sorted(groups.items()):
        largest = max(modules, key=modules.get)
        print(
            f"{name:<14}{len(modules):>8}{sum(modules.values()):>12}  {largest} ({modules[largest]})"
        )
    print(f"{'total':<14}{len(counts):>8}{sum(counts.values()):>12}")
    if "--modules" in argv:
        for path, n in counts.items():
            print(f"  {path:<60}{n:>5}")
    over = {path: n for path, n in counts.items() if n > MODULE_LIMIT}
    for path, n in over.items():
        print(f"over the limit: {path}: {n} code lines > {MODULE_LIMIT}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
