"""No development leftovers in what a learner reads: planning files, issues, old targets, history.

Scanned, among the tracked files: the chapter sources (``chapters/src/*.py``) and the notebooks'
markdown cells and outputs (``chapters/*.ipynb``), ``README.md`` and ``docs/*.md``, the comments and
string literals (docstrings included) of the Python files in ``paged/``, ``paged_course/``,
``kernels/``, ``tests/``, ``scripts/``, ``solutions/`` and ``exercises/``, and every line of the
shell and JavaScript files in ``scripts/`` and ``.ci/``. Code itself is not scanned (a variable may be
called ``targets``). The committed GPU logs in ``docs/gpu/`` are measurement records, kept as they ran.

A failure names ``file:line``, the kind of leftover and the text it matched. Fix the sentence so that it
still tells a learner something true (a test's "case 7 of the cases file" becomes a plain statement of
the case); never reword it just to dodge a pattern.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

LEFTOVERS: dict[str, re.Pattern] = {
    "planning file": re.compile(
        r"\b(?:CASES|DESIGN|COURSE_CONVENTIONS)\.md\b|\b(?:SEED|REFERENCE)_NOTES\b"
        r"|\bshared/|\bplanning (?:notes?|files?)\b|(?-i:\bCASES \d)",
        re.I,
    ),
    "issue or ticket": re.compile(
        r"\bthe issue's\b|\bthe issues'(?!\w)|\bissues' goals?\b|(?<!Triton )\bissue ?#?\d+\b"
        r"|\bissue note\b|\btickets?\b",
        re.I,
    ),
    # (an upstream project's public bug, ``Triton issue 11584``, is a source, not a leftover)
    "development target": re.compile(
        r"\(targets?\b|\btargets? (?:not )?met\b|\btargets?:? ?(?:<=|>=|<|>|≤|≥)"
        r"|\btargets?:? \d|\b\d+(?:\.\d+)?(?:x|%) targets?\b|\btargets?: "
        r"|\((?:not )?met\)|\bwe aimed\b|\baimed for\b",
        re.I,
    ),
    "development history": re.compile(r"\ban earlier version\b|\bthe lead\b", re.I),
    "to-do marker": re.compile(r"\b(?:TODO|FIXME|XXX)\b"),
}

# Temporary: files other developers are rewriting right now (the kernel, chapter 04 and the kernel
# benchmark) and the benchmark output strings of bench/engine.py, which the lead rewrites. Each entry
# names the kinds it lets through (None: all). test_known_exclusions_are_still_needed fails once an
# entry matches nothing: delete it then, so the files stay checked.
KNOWN_TEMPORARY: dict[str, set[str] | None] = {}

PY_FOLDERS = (
    "paged/",
    "paged_course/",
    "kernels/",
    "tests/",
    "scripts/",
    "solutions/",
    "exercises/",
    "chapters/src/",
)


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return out.splitlines()
    except (
        OSError,
        subprocess.CalledProcessError,
    ):  # not a git checkout: every file of the scanned folders
        found = [ROOT / "README.md"]
        for folder in {f.split("/")[0] for f in PY_FOLDERS} | {"chapters", "docs", ".ci"}:
            found += [p for p in (ROOT / folder).rglob("*") if "__pycache__" not in p.parts]
        return [p.relative_to(ROOT).as_posix() for p in found if p.is_file()]


def _python_prose(text: str):
    """``(line, text)`` of every comment and string literal (docstrings, f-string text) of a module."""
    kinds = {tokenize.COMMENT, tokenize.STRING} | {
        getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)
    }
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in kinds:
            for i, line in enumerate(tok.string.splitlines()):
                yield tok.start[0] + i, line


def _notebook_prose(text: str):
    """``("cell N, line M", text)`` of markdown cells and of text outputs (streams, plain, markdown)."""
    for n, cell in enumerate(json.loads(text)["cells"], start=1):
        parts = []
        if cell["cell_type"] == "markdown":
            parts.append(("markdown", "".join(cell["source"])))
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append(("output", "".join(out["text"])))
            for mime in ("text/plain", "text/markdown"):
                if mime in out.get("data", {}):
                    parts.append(("output", "".join(out["data"][mime])))
        for where, body in parts:
            for i, line in enumerate(body.splitlines(), start=1):
                yield f"cell {n} {where}, line {i}", line


def _sources():
    """``(path, location, text)`` for every scanned line."""
    for path in _tracked():
        if path == THIS or not (ROOT / path).is_file():
            continue
        scanned = None
        if path.endswith(".py") and path.startswith(PY_FOLDERS):
            scanned = _python_prose
        elif path.endswith(".ipynb") and path.startswith("chapters/"):
            scanned = _notebook_prose
        elif path == "README.md" or (
            path.startswith("docs/") and path.count("/") == 1 and path.endswith(".md")
        ):
            scanned = lambda text: enumerate(text.splitlines(), start=1)  # noqa: E731
        elif path.startswith(("scripts/", ".ci/")) and not path.endswith(".py"):
            scanned = lambda text: enumerate(text.splitlines(), start=1)  # noqa: E731
        if scanned is not None:
            for where, line in scanned((ROOT / path).read_text(encoding="utf-8")):
                yield path, where, line


def _hits():
    for path, where, line in _sources():
        for kind, pattern in LEFTOVERS.items():
            for m in pattern.finditer(line):
                yield path, where, kind, m.group(0), line.strip()


# Benchmarks are where the speed targets live (each a ratio against a baseline measured in the same run),
# so their code, output strings and tests may name a target and say whether it is met.
TARGETS_BELONG = ("paged_course/bench/", "tests/unit/test_bench_")


def _excused(path: str, kind: str) -> bool:
    if kind == "development target" and path.startswith(TARGETS_BELONG):
        return True
    return path in KNOWN_TEMPORARY and (
        KNOWN_TEMPORARY[path] is None or kind in KNOWN_TEMPORARY[path]
    )


def test_patterns_catch_the_leftovers_they_name():
    caught = {
        "planning file": [
            "see CASES.md 7",
            "DESIGN.md §4",
            "from SEED_NOTES.md",
            "shared/cases/x",
            "never overflow fp16, CASES 12",
        ],
        "issue or ticket": [
            "the issue's target",
            "the issues' goals",
            "workload (issue 7)",
            "ticket 12",
        ],
        "development target": [
            "ratio 4.5x (target 3x)",
            "(target <= 3x)",
            "target met",
            "the 80% target",
            "Target: within 2x",
            "11.5% (not met)",
            "short of the 3x we aimed for",
        ],
        "development history": ["an earlier version timed it", "ask the lead"],
        "to-do marker": ["# TODO: later", "FIXME"],
    }
    for kind, lines in caught.items():
        for line in lines:
            assert LEFTOVERS[kind].search(line), f"{kind!r} must catch {line!r}"
    for line in [
        "targets = {'A': 10}",
        "the design of the pool",
        "issue a prefill",
        "shared blocks",
        "the interpreter's bf16 tl.dot is wrong (Triton issue 11584)",
        "the scheduler may issue",
        "a target block",
        "the model's targets",
        "the cases 5 and 6 above",
    ]:
        assert not any(p.search(line) for p in LEFTOVERS.values()), f"false alarm on {line!r}"


def test_no_development_leftovers():
    bad = [
        f"{path}:{where}: {kind} {found!r} in: {line[:140]}"
        for path, where, kind, found, line in _hits()
        if not _excused(path, kind)
    ]
    assert not bad, (
        "development leftovers in what learners read (rewrite each sentence so it stays true "
        "without them):\n" + "\n".join(bad)
    )


def test_known_exclusions_are_still_needed():
    used = {path for path, _, kind, _, _ in _hits() if _excused(path, kind)}
    stale = sorted(set(KNOWN_TEMPORARY) - used)
    assert not stale, (
        f"no leftovers left in {stale}: delete them from KNOWN_TEMPORARY so they stay checked"
    )
