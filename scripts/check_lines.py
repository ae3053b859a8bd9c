"""What a chapter's check cells said, against what the exercise files on disk warrant.

``scripts/browser_check.py`` runs every chapter in a real JupyterLab kernel with ``PAGED_IMPL`` unset, as a
learner does, and hands each code cell's source and printed text to ``problems``:

- ``expect="stubs"`` (``exercises/`` holds the untouched stubs): every ``check("chNN.exK")`` cell says the
  region is not written yet or fails, no line anywhere says a region passes, every part of a capstone table
  (``paged_course.capstone.origin_table``) is the reference's, and the self-check of
  ``ex04_fast_decode`` reports no case OK;
- ``expect="typed-in"`` (every region typed in from ``solutions/``): every check cell passes, the capstone
  table names every part it lists as yours (chapter 07's lists every part of ``PART_SOURCES``), its tokens
  equal transformers' (``N of N``), and the self-check reports every case OK.

A cell that should print a verdict and prints nothing is a problem too. Pure functions: unit-tested in
``tests/unit/test_check_lines.py`` without a browser.
"""

from __future__ import annotations

import re

CHECK_CALL = re.compile(r"\bcheck\(\s*[\"'](?P<id>ch\d\d\.ex\d+[a-z]?)[\"']")
PASS_LINE = re.compile(r"^(?P<id>ch\d\d\.ex\d+[a-z]?) passes\b")
ORIGIN_LINE = re.compile(
    r"^  (?P<part>[a-z_]+)\s+(?P<whose>yours|reference answers|reference) \((?P<where>.*)\)$"
)
TOKENS_LINE = re.compile(r"outputs equal to transformers' generate.*?: (?P<n>\d+) of (?P<m>\d+)")
SELF_CHECK_LINE = re.compile(r"max \|error\| \S+ -> (?P<verdict>OK|WRONG)$")
EXPECTATIONS = ("stubs", "typed-in")


def _verdict_ok(exercise: str, text: str, expect: str) -> bool:
    first = text.strip().splitlines()[0] if text.strip() else ""
    if expect == "typed-in":
        return first.startswith(f"{exercise} passes:")
    return first.startswith(f"{exercise} is not written yet") or first.startswith(f"{exercise}: ")


def problems(
    chapter: str, cells: list[dict], expect: str, all_parts: tuple[str, ...] = ()
) -> list[str]:
    """What in ``cells`` (each ``{"index", "source", "stdout"}``, in order) contradicts ``expect``.

    Args:
        chapter: the notebook's name, for the messages.
        expect: ``"stubs"`` or ``"typed-in"`` (see the module docstring).
        all_parts: the parts a full capstone table must list (chapter 07: ``PART_SOURCES``); with
            ``typed-in``, such a chapter must also print its tokens against transformers'.

    Raises:
        ValueError: ``expect`` is neither.
    """
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {EXPECTATIONS}, got {expect!r}")
    found: list[str] = []
    origins: dict[str, str] = {}
    token_lines = 0
    for cell in cells:
        where = f"{chapter} cell {cell['index']}"
        text = cell.get("stdout") or ""
        called = CHECK_CALL.findall(cell["source"])
        for exercise in called:
            if not _verdict_ok(exercise, text, expect):
                said = text.strip().splitlines()[0] if text.strip() else "(nothing)"
                want = "passes" if expect == "typed-in" else "is not written yet, or fails"
                found.append(f"{where}: check({exercise!r}) should say it {want}; it said: {said}")
        for line in text.splitlines():
            passed = PASS_LINE.match(line)
            if expect == "stubs" and passed and passed["id"] not in called:
                found.append(f"{where}: a region passes on the untouched stubs: {line.strip()}")
            origin = ORIGIN_LINE.match(line)
            if origin:
                origins[origin["part"]] = origin["whose"]
                if expect == "stubs" and origin["whose"] != "reference":
                    found.append(
                        f"{where}: on the untouched stubs a part is not the reference's: {line}"
                    )
                if expect == "typed-in" and origin["whose"] != "yours":
                    found.append(
                        f"{where}: with every region typed in, a part is not yours: {line}"
                    )
            tokens = TOKENS_LINE.search(line)
            token_lines += tokens is not None
            if tokens and expect == "typed-in" and tokens["n"] != tokens["m"]:
                found.append(
                    f"{where}: the capstone's tokens differ from transformers': {line.strip()}"
                )
            verdict = SELF_CHECK_LINE.search(line)
            if verdict and expect == "stubs" and verdict["verdict"] == "OK":
                found.append(
                    f"{where}: the untouched ex04_fast_decode starter passes its self-check: {line}"
                )
            if verdict and expect == "typed-in" and verdict["verdict"] != "OK":
                found.append(f"{where}: the typed-in ex04_fast_decode fails its self-check: {line}")
    missing = [p for p in all_parts if p not in origins]
    if all_parts and missing:
        found.append(f"{chapter}: the capstone table lists no line for {', '.join(missing)}")
    if all_parts and expect == "typed-in" and not token_lines:
        found.append(f"{chapter}: no line compares the capstone's tokens with transformers'")
    return found


def check_cells(cells: list[dict]) -> list[tuple[int, str]]:
    """``(cell index, exercise id)`` of every check call, in order."""
    return [(c["index"], ex) for c in cells for ex in CHECK_CALL.findall(c["source"])]
