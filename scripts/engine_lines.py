"""Count the engine's code lines: ``python scripts/engine_lines.py`` (exit 1 above the limits).

The engine is ``paged/`` plus ``kernels/`` (imported as ``paged.kernels``). A code line is a line with a
token that is not a comment, not part of a docstring (the first string statement of a module, class or
function) and not blank. Limits: the whole engine at most ``TOTAL_LIMIT`` lines, no module over
``MODULE_LIMIT``; the course tooling (``paged_course/``) is not counted.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Counted on the formatted tree (`ruff format`, line length 100; CI checks the format). The budget
# is a ceiling for the design, met by removing duplication, never by folding lines. The total is
# today's count (3,077 after the attention backend's forward became paged_attention_forward's body,
# LLM routed its arguments to the config sections once, course-only accessors and reprs left, the
# lazy exports were listed by module, forward_logits read its input ids from the metadata and the
# loader fetched the model and tokenizer through one helper),
# a ratchet that only goes down; the target is 3,000. One step up, on purpose: 3,093 after
# BlockAllocator.allocate / free got back their one-block fast paths (as allocate_many(1) /
# free_many((b,)) they ran 6.5x slower in `bench allocator`, 163 -> 1,067 ns per block). No module
# over 300.
TOTAL_LIMIT = 3093
MODULE_LIMIT = 300
_SKIP = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """Code lines of one module (see the module docstring)."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _SKIP:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def engine_modules(root: Path = ROOT) -> list[Path]:
    return sorted([*root.glob("paged/**/*.py"), *root.glob("kernels/**/*.py")])


def count(root: Path = ROOT) -> dict[str, int]:
    """``{module path: code lines}`` for every engine module."""
    return {str(p.relative_to(root)): code_lines(p.read_text()) for p in engine_modules(root)}


def problems(counts: dict[str, int]) -> list[str]:
    found = [
        f"{path}: {n} code lines > {MODULE_LIMIT}" for path, n in counts.items() if n > MODULE_LIMIT
    ]
    if sum(counts.values()) > TOTAL_LIMIT:
        found.append(f"the engine has {sum(counts.values())} code lines > {TOTAL_LIMIT}")
    return found


def main() -> int:
    counts = count()
    width = max(map(len, counts))
    for path, n in counts.items():
        print(f"{path:<{width}}  {n:4d}")
    print(
        f"{'total':<{width}}  {sum(counts.values()):4d}  (limit {TOTAL_LIMIT}; {MODULE_LIMIT} per module)"
    )
    bad = problems(counts)
    for line in bad:
        print("over the limit:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
