"""The learner's loop inside a chapter: ``check("ch02.ex1")`` right after a build step, ``solution(...)``
to reveal the reference for self-study, ``learner_or_reference`` to carry on with an unfinished piece,
``exercise_module`` to import your file afresh, ``hint("ch02.ex1")`` for a nudge (call again for a stronger one).

Which files the chapters build on is decided once per process (one Jupyter kernel): ``impl_package()``,
``exercises`` (your files) unless ``PAGED_IMPL`` said otherwise when this module was first imported (the
notebook executor and nbval set it to ``solutions`` for the committed outputs). Nothing a check does can
change that choice later.

``check`` runs that exercise's graded tests (``tests/exercises``, the ``exercise(id, points)`` marker) in
this process, on the files as they are on disk now, with a per-test time limit, and prints one pass line
or the first failing case in plain words: which check, the invariant its message names, and what was
expected and got. A check leaves the process as it found it: ``os.environ``, ``sys.path``, the imported
exercise and test modules and the random generators' states are put back when it ends (in-process, so that
a check cell answers in about a second; a child process per check took 2-3 s longer). ``python -m paged
grade`` runs the same tests in a separate process for the score.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import os
import random
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "exercises"
IMPLS = ("exercises", "solutions")
_ID = re.compile(r"^ch(\d\d)\.ex\d+[a-z]?$")
_cache: dict[tuple, CheckResult] = {}


def _decide_impl() -> str:
    impl = os.environ.get("PAGED_IMPL", "exercises")
    if impl not in IMPLS:
        raise ValueError(f"PAGED_IMPL must be one of {', '.join(IMPLS)}, got {impl!r}")
    return impl


_IMPL = _decide_impl()


def impl_package() -> str:
    """Which copy of the exercise files this process builds on: ``exercises`` (your files) or
    ``solutions`` (the reference answers), read from ``$PAGED_IMPL`` once, when this module was imported.

    Raises:
        ValueError: at import, when ``PAGED_IMPL`` names neither.
    """
    return _IMPL


def impl_label(impl: str) -> str:
    """How a verdict names the files it ran on: ``yours`` or ``the reference answers``."""
    return "the reference answers" if impl == "solutions" else "yours"


@dataclass
class CheckResult:
    """What one ``check`` found: the tests run, those that passed, and the first failure in words."""

    exercise: str
    total: int = 0
    passed: int = 0
    first_failure: str = ""
    unfinished: str = (
        ""  # the hint of a NotImplementedError stub, when the region is not written yet
    )
    uses: tuple[
        str, ...
    ] = ()  # the earlier exercises the first failing test runs (marker ``uses=``)
    outcomes: dict[str, str] = field(default_factory=dict)
    all_or_nothing: bool = (
        False  # a spot-the-bug region: it passes only when every one of its checks does
    )

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def __bool__(self) -> bool:
        return self.ok


class _Collector:
    """pytest plugin: keep the tests of one exercise, record each outcome and the first failure."""

    def __init__(self, exercise: str, result: CheckResult):
        self.exercise, self.result = exercise, result

    def pytest_collection_modifyitems(self, config, items):
        keep = [
            i
            for i in items
            if (m := i.get_closest_marker("exercise")) is not None
            and (m.kwargs.get("id") or (m.args[0] if m.args else None)) == self.exercise
        ]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
        self.result.total = len(keep)
        self.result.all_or_nothing = any(
            i.get_closest_marker("exercise").kwargs.get("all_or_nothing", False) for i in keep
        )
        self._uses = {
            i.nodeid.split("::")[-1]: tuple(i.get_closest_marker("exercise").kwargs.get("uses", ()))
            for i in keep
        }
        self._params = {
            i.nodeid.split("::")[-1]: i.callspec.params for i in keep if hasattr(i, "callspec")
        }

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.passed:
            return
        name = report.nodeid.split("::")[-1]
        if report.passed:
            self.result.passed += 1
            self.result.outcomes[name] = "passed"
        elif name not in self.result.outcomes or self.result.outcomes[name] == "passed":
            self.result.outcomes[name] = "failed"
            if not self.result.first_failure:
                self.result.first_failure = describe_failure(name, report, self._params.get(name))
                self.result.uses = self._uses.get(name, ())
                stub = re.search(
                    r"NotImplementedError: (ch\d\d\.ex\d+[a-z]?): (.*)", report.longreprtext
                )
                if stub:
                    self.result.unfinished = f"{stub.group(1)}: {stub.group(2).strip()}"


def describe_failure(name: str, report, params: dict | None = None) -> str:
    """The first failing case in words: the check's name and case (``params``: the test's parameters by
    name), its message (the broken invariant), got/expected, where two long values differ, and the line of
    the learner's file that raised, when one did."""
    case = re.sub(r"^test_", "", re.sub(r"\[.*\]$", "", name)).replace("_", " ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    if "Timeout" in report.longreprtext and "Timeout (>" in report.longreprtext:
        text = "timed out (an infinite loop?)"
    lines = [f"check '{case}'" + _case(name, params)]
    message, _, comparison = ("\n" + text if text.startswith("assert ") else text).partition(
        "\nassert "
    )
    if message.strip():
        lines.append("  " + message.removeprefix("AssertionError: ").strip())
    raised_at = _raised_in_exercise(report)
    if raised_at:
        lines.append(f"  raised in {raised_at}")
    got_expected = re.match(r"(.+?) == (.+)", comparison.splitlines()[0]) if comparison else None
    if got_expected:
        lines.append(f"  got      {got_expected.group(1)}\n  expected {got_expected.group(2)}")
    elif comparison and comparison.splitlines()[0].strip() != "False":  # the message said it all
        lines.append("  assert " + comparison.splitlines()[0])
    # pytest shortens long values ('[0, 1, 2, ...]'); its next lines say where they differ
    for line in comparison.splitlines()[1:]:
        differ = re.match(r"\s*(At index .*|(Left|Right) contains (.*))", line)
        if differ:
            side = {"Left": "got", "Right": "expected"}.get(differ.group(2))
            said = f"{side} has {differ.group(3)}" if side else differ.group(1)
            lines.append(f"  ({said[0].lower()}{said[1:]})")
            break
    return "\n".join(lines)


def _case(name: str, params: dict | None) -> str:
    """`` with bs=4, shared=True`` from the test's parameters (short values by name, else pytest's id)."""
    shown = {k: repr(v) for k, v in (params or {}).items()}
    if shown and all(len(v) <= 40 for v in shown.values()):
        return " with " + ", ".join(f"{k}={v}" for k, v in shown.items())
    ids = re.search(r"\[(.*)\]$", name)
    return f" with {ids.group(1)}" if ids else ""


def _raised_in_exercise(report) -> str:
    """``exercises/ex05_prefix_cache.py, line 120: return table[-1]``: the deepest traceback line in an
    exercise file (``exNN_*.py``), ``""`` when the error did not pass through one (a test's own assert on
    a value the learner's code returned)."""
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", None) or []
    for entry in reversed(entries):
        loc = getattr(entry, "reprfileloc", None)
        if loc is not None and re.fullmatch(r"ex\d\d_\w+\.py", Path(loc.path).name):
            # a long entry marks its line with ">"; a short one (pytest's style for the frames in
            # between) is that line alone, with a line of carets under the call
            marked = [x[1:] for x in entry.lines if x.startswith(">")]
            code = [x for x in entry.lines if x.strip().strip("^~") and not x.startswith("E ")]
            source = (marked or code[:1] or [""])[0].strip()
            where = f"{Path(loc.path).parent.name}/{Path(loc.path).name}, line {loc.lineno}"
            return where + (f": {source}" if source else "")
    return ""


def _test_file(exercise: str) -> Path:
    match = _ID.match(exercise)
    if not match:
        raise ValueError(f"exercise ids look like 'ch02.ex1', got {exercise!r}")
    files = sorted(TESTS.glob(f"test_ex{match.group(1)}_*.py"))
    if not files:
        raise ValueError(f"no graded tests for chapter {match.group(1)} in {TESTS}")
    # a chapter with several test files: the one that marks this region (a check collects one file only)
    marking = [
        f
        for f in files
        if re.search(rf"exercise\(\s*[\"']{re.escape(exercise)}[\"']", f.read_text())
    ]
    return (marking or files)[0]


def _begin(exercise: str) -> re.Pattern:
    """The ``# BEGIN SOLUTION chNN.exK`` line of region ``exercise`` (any line of a text: ``re.M``)."""
    return re.compile(rf"^\s*# BEGIN SOLUTION {re.escape(exercise)}\b", re.M)


def _region_file(exercise: str, impl: str) -> str:
    """``impl/exNN_topic.py``: the file that holds region ``exercise`` (found by its marker in solutions/)."""
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        if _begin(exercise).search(path.read_text()):
            return f"{impl}/{path.name}"
    return f"{impl}/"


def _folder(impl: str) -> Path:
    return ROOT / impl  # an absolute path (a folder of planted wrong answers) stays itself


def _forget(impl: str) -> None:
    """Drop the imported modules of ``impl`` and their bytecode, so that the next import reads the files
    as they are on disk now (a ``.pyc`` records its source's mtime in whole seconds and its size: an edit
    saved within the same second at the same size would otherwise run the old code)."""
    for name in [n for n in sys.modules if n == impl or n.startswith(impl + ".")]:
        del sys.modules[name]
    for stale in _folder(impl).glob("__pycache__/ex*.pyc"):
        stale.unlink(missing_ok=True)
    importlib.invalidate_caches()


def _contents(impl: str) -> str:
    """A digest of every ``ex*.py`` of ``impl``: a check's result is reused only for identical files."""
    digest = hashlib.sha1()
    for path in sorted(_folder(impl).glob("ex*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _is_transient(name: str, module) -> bool:
    """Modules a check imports that must not outlive it: exercise files (either copy, or a folder's
    ``_impl_*`` modules), and the test modules and conftests under ``tests/``."""
    if (
        name in IMPLS
        or name.startswith(("exercises.", "solutions.", "_impl_"))
        or name == "conftest"
    ):
        return True
    path = getattr(module, "__file__", None) or ""
    return path.startswith(str(ROOT / "tests") + os.sep)


@contextlib.contextmanager
def _isolated():
    """Put back ``os.environ``, ``sys.path``, the transient modules, the random generators and the
    bytecode switch as they were (a test run sets ``PAGED_IMPL``, prepends paths, imports modules)."""
    import numpy as np
    import torch

    environ, path = dict(os.environ), list(sys.path)
    modules = {n: m for n, m in list(sys.modules.items()) if _is_transient(n, m)}
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = (
        True  # no .pyc of a learner's file: the next edit is always read afresh
    )
    try:
        yield
    finally:
        sys.dont_write_bytecode = bytecode
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        for name in [n for n, m in list(sys.modules.items()) if _is_transient(n, m)]:
            del sys.modules[name]
        sys.modules.update(modules)
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)


def run_check(
    exercise: str, impl: str | None = None, timeout: float = 10.0, stop_at_first: bool = False
) -> CheckResult:
    """Run exercise ``exercise``'s graded tests on ``impl`` (default ``impl_package()``) in this process;
    the result is reused while the files stay byte for byte the same. The process is left as it was.
    ``stop_at_first``: stop at the first failing test (``pytest -x``; the mutation check, which only
    needs one), so ``passed`` counts the tests run before it."""
    import pytest

    impl = impl or impl_package()
    key = (exercise, impl, _contents(impl), stop_at_first)
    if key in _cache:
        return _cache[key]
    result = CheckResult(exercise)
    args = [
        str(_test_file(exercise)),
        f"--impl={impl}",
        f"--timeout={timeout:g}",
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-o",
        "addopts=",
        f"--rootdir={ROOT}",
        "-p",
        "no:nbval",
        "-p",
        "no:hypothesispytest",  # unused here; loading them cost the first check 6 s
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--color=no",  # a notebook's kernel may ask for colour (FORCE_COLOR): the verdict is plain text
        *(["-x"] if stop_at_first else []),
    ]
    with _isolated():
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        _forget(impl)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            pytest.main(args, plugins=[_Collector(exercise, result)])
    _cache[key] = result
    return result


def check(exercise: str, impl: str | None = None, timeout: float = 10.0) -> bool:
    """Check one build step and print the verdict (one line, or the first failing case). Returns whether
    every graded test of ``exercise`` passed."""
    impl = impl or impl_package()
    r = run_check(exercise, impl, timeout)
    if r.ok and impl == "solutions":
        print(
            f"{exercise} passes on solutions/, the reference answers: {r.total} of {r.total} checks"
        )
    elif r.ok:
        mine = "your " if impl == "exercises" else ""
        print(
            f"{exercise} passes: {r.total} of {r.total} checks, on {mine}{_region_file(exercise, impl)}"
        )
    elif r.total == 0:
        print(f"{exercise}: no graded checks found")
    elif r.unfinished and r.unfinished.startswith(exercise + ":"):
        print(
            f"{exercise} is not written yet ({r.unfinished.split(': ', 1)[1]}). The chapter carries on with "
            "the reference."
        )
    else:
        broken = next((u for u in r.uses if not run_check(u, impl, timeout)), None)
        why = (
            f" (it uses your {broken}, which does not pass its own checks yet: fix {broken} first)"
            if broken
            else ""
        )
        whole = (
            " (all or nothing: it counts only when all of them pass)" if r.all_or_nothing else ""
        )
        print(
            f"{exercise}: {r.passed} of {r.total} checks pass{why}{whole}; the first failing one:\n"
            f"{r.first_failure}"
        )
    return r.ok


def exercise_module(name: str, impl: str | None = None):
    """Your exercise module ``name`` (``"ex03_block_tables"``) imported afresh, so that your last saved edit is
    what runs; ``None``, with one line saying why, when it does not import (a syntax error while you edit must
    not stop the chapter)."""
    impl = impl or impl_package()
    full = f"{impl}.{name}"
    sys.modules.pop(full, None)
    for stale in _folder(impl).glob(f"__pycache__/{name}.*.pyc"):
        stale.unlink(missing_ok=True)
    importlib.invalidate_caches()
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        return importlib.import_module(full)
    except Exception as err:
        print(f"{full.replace('.', '/')}.py does not import: {type(err).__name__}: {err}")
        return None
    finally:
        sys.dont_write_bytecode = bytecode


def learner_or_reference(exercises: str | list[str], learner, reference, impl: str | None = None):
    """``learner`` when every exercise in ``exercises`` passes its checks, else ``reference`` (one line says so)."""
    ids = [exercises] if isinstance(exercises, str) else list(exercises)
    failing = [e for e in ids if not run_check(e, impl)]
    if failing:
        print(f"using the reference for {', '.join(failing)} (not passing yet)")
        return reference
    return learner


_hints_given: dict[str, int] = {}


def hint(exercise: str) -> None:
    """Print the next hint for region ``exercise``: a nudge on the first call, a stronger one on each call
    after it, then where the answer is (``solution``). The hints come from ``exercises/hints.json``
    (generated from the regions' ``# HINT:`` lines; a student release ships it)."""
    import json

    if not _ID.match(exercise):
        raise ValueError(f"exercise ids look like 'ch02.ex1', got {exercise!r}")
    path = ROOT / "exercises" / "hints.json"
    tiers = json.loads(path.read_text()).get(exercise, []) if path.exists() else []
    given = _hints_given.get(exercise, 0)
    if given < len(tiers):
        _hints_given[exercise] = given + 1
        print(f"hint {given + 1} of {len(tiers)} for {exercise}: {tiers[given]}")
    else:
        told = (
            f"all {len(tiers)} hints for {exercise} are given"
            if tiers
            else f"no hints for {exercise}"
        )
        print(f"{told}: solution({exercise!r}) prints the reference answer")


def solution(exercise: str) -> None:
    """Print the reference answer of one region, for self-study (a student release has no ``solutions/``)."""
    match = _ID.match(exercise)
    files = sorted((ROOT / "solutions").glob(f"ex{match.group(1)}_*.py")) if match else []
    if not files:
        print("solutions are not part of this copy of the course: ask your instructor")
        return
    lines, inside = [], False
    for path in files:
        for line in path.read_text().splitlines():
            if _begin(exercise).match(line):
                inside = True
                lines.append(f"# {path.relative_to(ROOT)}")
            elif inside and re.match(r"^\s*# END SOLUTION", line):
                inside = False
            elif inside and not re.match(r"^\s*# (STUB:|HINT:|HINT\+)", line):
                lines.append(line)
    print("\n".join(lines) if lines else f"no region {exercise} in solutions/")
