"""Generate learner stubs in ``exercises/`` from the reference answers in ``solutions/``.

``solutions/exNN_topic.py`` is the single source. Inside it, a region

    # BEGIN SOLUTION ch02.ex1
    # STUB: return -1          <- optional starter lines (without the "# STUB: " prefix)
    ...reference code...
    # END SOLUTION

becomes, in ``exercises/exNN_topic.py``, the STUB lines when there are any, else
``raise NotImplementedError("ch02.ex1: <hint>")`` where the hint is the text after the id on the
BEGIN line (``# BEGIN SOLUTION ch02.ex1 -- hint text``). Indentation is kept. The generator rejects
unbalanced, nested or duplicate markers, checks that the output parses, and is idempotent.
``--check`` exits 1 when ``exercises/`` differs from what it would write (CI runs it).

A learner's work is never overwritten: an exercise file that differs from the last commit (``git show
HEAD:exercises/...``) is the learner's own. ``--check`` leaves it out when its committed version is up to
date, and writing refuses (``LearnerWorkError``, nothing written) unless ``--force``.

``# HINT: text`` lines inside a region are its tiered hints, a nudge first and stronger ones after (one
tier per ``# HINT:`` line; ``# HINT+ more text`` lines right after one continue that tier, so that a tier
keeps the comment width); they leave the stub and go to ``exercises/hints.json``, which
``paged_course.check.hint`` reads one tier per call (a student release ships it, and has no solutions/).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

BEGIN = re.compile(
    r"^(?P<indent>\s*)# BEGIN SOLUTION (?P<id>ch\d\d\.ex\d+[a-z]?)(?:\s+--\s+(?P<hint>.*))?\s*$"
)
END = re.compile(r"^\s*# END SOLUTION\s*$")
STUB = re.compile(r"^(?P<indent>\s*)# STUB: ?(?P<code>.*)$")
HINT = re.compile(r"^\s*# HINT(?P<kind>[:+]) ?(?P<text>.*)$")
HINTS_FILE = "hints.json"
HEADER = (
    "# Generated from {name} by `python -m paged course sync`. Write only where a region raises\n"
    '# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.\n'
)
#: The header of a student release's exercise files: the release has no solutions/ to generate them from.
STUDENT_HEADER = (
    "# Your exercise file for chapter {chapter}. Write only the marked regions (each starts as\n"
    "# `raise NotImplementedError(...)` or a starter); the rest is the course's code, which the tests use.\n"
    '# In the chapter, `check("ch{chapter}.exK")` checks one region; `python -m paged grade ch{chapter}` grades\n'
    '# them all; `paged_course.check.hint("ch{chapter}.exK")` gives a hint, a stronger one each call.\n'
)
STUDENT_INIT = '"""Your exercise files, one per chapter topic: write the marked regions (see each file\'s header)."""\n'


class MarkerError(ValueError):
    """A solution file's markers are unbalanced, nested, duplicated or malformed."""


def exercise_ids(source: str) -> list[str]:
    """Ids of the marked regions in a solutions file, in order."""
    return [m["id"] for line in source.splitlines() if (m := BEGIN.match(line))]


UNWRITTEN = re.compile(r"""NotImplementedError\(\s*["'](?P<id>ch\d\d\.ex\d+[a-z]?):""")


def course_order(ex_id: str) -> tuple[int, int, str]:
    """Sort key of a region id: chapter, then exercise number, then suffix (``ch02.ex10`` after ``ch02.ex9``)."""
    m = re.fullmatch(r"ch(\d\d)\.ex(\d+)([a-z]?)", ex_id)
    if m is None:
        raise ValueError(f"not a region id: {ex_id!r} (expected chNN.exK)")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def unwritten_regions(source: str) -> list[str]:
    """Ids of the regions of an exercise file that still raise their stub's ``NotImplementedError("chNN.exK:
    ...")``, in course order, each once (comment lines, such as a solution's ``# STUB:`` lines, do not count).
    A region with a starter instead of a ``raise`` is not found here."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
    return sorted({m["id"] for m in UNWRITTEN.finditer(code)}, key=course_order)


def hints(source: str) -> dict[str, list[str]]:
    """``{region id: [hint tier 1, tier 2, ...]}`` from the ``# HINT:`` lines of a solutions file."""
    found: dict[str, list[str]] = {}
    current = None
    for line in source.splitlines():
        if (begin := BEGIN.match(line)) is not None:
            current = begin["id"]
            found[current] = []
        elif END.match(line):
            current = None
        elif current is not None and (hint := HINT.match(line)) is not None:
            if hint["kind"] == ":":
                found[current].append(hint["text"].strip())
            elif found[current]:
                found[current][-1] += " " + hint["text"].strip()
            else:
                raise MarkerError(f"region {current}: '# HINT+' continues no '# HINT:' line")
    return {k: v for k, v in found.items() if v}


def make_stub(
    source: str, name: str = "<solutions>", keep: tuple[str, ...] = (), student: bool = False
) -> str:
    """Return the exercise text for one solutions file (see module docstring). The regions in ``keep``
    are written with their reference code, as a learner who has typed them in would have them (the
    learner-loop tests and CI's typed-in run build files region by region this way). ``student``: the
    header of a student release (:data:`STUDENT_HEADER`), which says what to do with the file instead of
    where it was generated from (the release has no solutions/)."""
    if student:
        chapter = re.search(r"ex(\d\d)_", name)
        if chapter is None:
            raise MarkerError(f"{name}: a student header needs an exNN_topic.py name")
        out: list[str] = [STUDENT_HEADER.format(chapter=chapter.group(1))]
    else:
        out = [HEADER.format(name=name)]
    seen: set[str] = set()
    region: dict | None = None
    for lineno, line in enumerate(source.splitlines(), 1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if region is not None:
                raise MarkerError(
                    f"{name}:{lineno}: BEGIN SOLUTION {begin['id']} inside region "
                    f"{region['id']} opened at line {region['line']}"
                )
            if begin["id"] in seen:
                raise MarkerError(f"{name}:{lineno}: duplicate exercise id {begin['id']}")
            seen.add(begin["id"])
            region = {
                "id": begin["id"],
                "line": lineno,
                "indent": begin["indent"],
                "hint": (begin["hint"] or "implement this part").strip(),
                "stub": [],
                "code": [],
            }
        elif end:
            if region is None:
                raise MarkerError(f"{name}:{lineno}: END SOLUTION without a BEGIN")
            if region["id"] in keep:
                out.extend(region["code"])
            elif region["stub"]:
                out.extend(region["stub"])
            else:
                msg = f"{region['id']}: {region['hint']}".replace('"', "'")
                out.append(f'{region["indent"]}raise NotImplementedError("{msg}")')
            region = None
        elif region is not None:
            stub = STUB.match(line)
            if HINT.match(line):
                continue
            if stub:
                region["stub"].append(stub["indent"] + stub["code"])
            else:
                region["code"].append(line)
        elif "# STUB:" in line or HINT.match(line):
            raise MarkerError(f"{name}:{lineno}: '# STUB:' or '# HINT:' outside a solution region")
        else:
            out.append(line)
    if region is not None:
        raise MarkerError(
            f"{name}: region {region['id']} opened at line {region['line']} is never closed"
        )
    text = "\n".join(out).rstrip("\n") + "\n"
    try:
        ast.parse(text)
    except SyntaxError as err:
        raise MarkerError(f"{name}: the generated stub does not parse: {err}") from err
    return formatted(text)


def formatted(text: str) -> str:
    """``text`` as ``ruff format`` lays it out (line length 100, as the whole repository): a stub's
    ``raise`` line and starter code are laid out like the rest of the tree. Without ruff (it comes with
    the ``dev`` extra) the text is returned as it is."""
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        return text
    command = [find_ruff_bin(), "format", "--isolated", "--line-length", "100", "-"]
    done = subprocess.run(command, input=text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise MarkerError(f"ruff format failed on a generated stub: {done.stderr.strip()}")
    return done.stdout


class LearnerWorkError(RuntimeError):
    """Writing the stubs would overwrite exercise files the learner has changed since the last commit."""


def _committed(root: Path, rel: str) -> str | None:
    """``rel`` as the last commit holds it; ``None`` outside a git checkout or for an untracked file."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "show", f"HEAD:{rel}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def sync(root: Path, check: bool = False, force: bool = False) -> list[str]:
    """Write (or with ``check`` only compare) every ``exercises/exNN_*.py``; return the stale names.

    A file the learner changed since the last commit is theirs: ``check`` does not count it while its
    committed version is up to date, and writing raises ``LearnerWorkError`` naming such files, with
    nothing written, unless ``force``.
    """
    solutions, exercises = root / "solutions", root / "exercises"
    if not solutions.is_dir():
        raise FileNotFoundError(
            f"{solutions} not found: exercises/ is generated from solutions/, which a student "
            "release does not have; nothing was changed"
        )
    exercises.mkdir(exist_ok=True)
    stale = []
    wanted = {
        "__init__.py": '"""Learner stubs, generated from solutions/ by `python -m paged course sync`."""\n'
    }
    tiers: dict[str, list[str]] = {}
    for path in sorted(solutions.glob("ex*.py")):
        wanted[path.name] = make_stub(path.read_text(), f"solutions/{path.name}")
        tiers.update(hints(path.read_text()))
    wanted[HINTS_FILE] = json.dumps(dict(sorted(tiers.items())), indent=1) + "\n"
    writes, theirs = {}, []
    for name, text in wanted.items():
        target = exercises / name
        if target.exists() and (current := target.read_text()) != text:
            committed = _committed(root, f"exercises/{name}")
            if committed is not None and committed != current:
                theirs.append(name)
                if check and committed == text:
                    continue
        elif target.exists():
            continue
        stale.append(name)
        writes[target] = text
    if not check and theirs and not force:
        raise LearnerWorkError(
            f"not written: {', '.join(theirs)} in {exercises} changed since the last commit (your work; "
            "`git diff exercises/` shows it). Commit or move it first, or pass --force to overwrite it"
        )
    if not check:
        for target, text in writes.items():
            target.write_text(text)
    for path in sorted(exercises.glob("ex*.py")):
        if path.name not in wanted:
            stale.append(path.name)
            if not check:
                path.unlink()
    return stale


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m paged course sync", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="only report stale files; exit 1 if any"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite exercise files changed since the last commit",
    )
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    try:
        stale = sync(args.root, check=args.check, force=args.force)
    except (FileNotFoundError, LearnerWorkError) as err:
        print(err)
        return 1
    if args.check and stale:
        print("exercises/ is out of date with solutions/: " + ", ".join(stale))
        print("run: python -m paged course sync")
        return 1
    print(("would update: " if args.check else "updated: ") + (", ".join(stale) or "nothing"))
    return 0
