"""The learner's loop inside a chapter: ``check("ch02.ex1")`` right after a build step, ``solution(...)``
to reveal the reference for self-study, ``learner_or_reference`` to carry on with an unfinished piece,
``exercise_module`` to import your file afresh.

``check`` runs that exercise's graded tests (``tests/exercises``, the ``exercise(id, points)`` marker) in
this process, on the freshly reloaded files of ``exercises/`` (or ``solutions/``: ``PAGED_IMPL``), with a
per-test time limit, and prints one pass line or the first failing case in plain words: which check, the
invariant its message names, and what was expected and got. ``python -m paged grade`` runs the same
tests in a separate process for the score.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "exercises"
_ID = re.compile(r"^ch(\d\d)\.ex\d+[a-z]?$")
_cache: dict[tuple, CheckResult] = {}


def impl_package() -> str:
    """Which copy the chapters build on: ``$PAGED_IMPL`` (``exercises`` by default, the learner's files)."""
    return os.environ.get("PAGED_IMPL", "exercises")


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
        self._uses = {
            i.nodeid.split("::")[-1]: tuple(i.get_closest_marker("exercise").kwargs.get("uses", ()))
            for i in keep
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
                self.result.first_failure = describe_failure(name, report)
                self.result.uses = self._uses.get(name, ())
                stub = re.search(
                    r"NotImplementedError: (ch\d\d\.ex\d+[a-z]?): (.*)", report.longreprtext
                )
                if stub:
                    self.result.unfinished = f"{stub.group(1)}: {stub.group(2).strip()}"


def describe_failure(name: str, report) -> str:
    """The first failing case in words: the check's name, its message (the broken invariant), got/expected."""
    case = re.sub(r"^test_", "", re.sub(r"\[.*\]$", "", name)).replace("_", " ")
    params = re.search(r"\[(.*)\]$", name)
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    if "Timeout" in report.longreprtext and "Timeout (>" in report.longreprtext:
        text = "timed out (an infinite loop?)"
    lines = [f"check '{case}'" + (f" with {params.group(1)}" if params else "")]
    message, _, comparison = text.partition("\nassert ")
    lines.append("  " + message.removeprefix("AssertionError: ").strip())
    got_expected = re.match(r"(.+?) == (.+)", comparison.splitlines()[0]) if comparison else None
    if got_expected:
        lines.append(f"  got      {got_expected.group(1)}\n  expected {got_expected.group(2)}")
    elif comparison:
        lines.append("  assert " + comparison.splitlines()[0])
    return "\n".join(lines)


def _test_file(exercise: str) -> Path:
    match = _ID.match(exercise)
    if not match:
        raise ValueError(f"exercise ids look like 'ch02.ex1', got {exercise!r}")
    files = sorted(TESTS.glob(f"test_ex{match.group(1)}_*.py"))
    if not files:
        raise ValueError(f"no graded tests for chapter {match.group(1)} in {TESTS}")
    return files[0]


def _reload(impl: str) -> None:
    """Forget the imported exercise modules so that the learner's last edit is what runs."""
    for name in [n for n in sys.modules if n == impl or n.startswith(impl + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _stamp(impl: str) -> tuple:
    folder = ROOT / impl
    return (
        tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.glob("ex*.py")))
        if folder.is_dir()
        else ()
    )


def run_check(exercise: str, impl: str | None = None, timeout: float = 10.0) -> CheckResult:
    """Run exercise ``exercise``'s graded tests on ``impl`` in this process (results cached per file state)."""
    import pytest

    impl = impl or impl_package()
    key = (exercise, impl, _stamp(impl))
    if key in _cache:
        return _cache[key]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    _reload(impl)
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
    ]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        pytest.main(args, plugins=[_Collector(exercise, result)])
    _cache[key] = result
    return result


def check(exercise: str, impl: str | None = None, timeout: float = 10.0) -> bool:
    """Check one build step and print the verdict (one line, or the first failing case). Returns whether
    every graded test of ``exercise`` passed."""
    r = run_check(exercise, impl, timeout)
    if r.ok:
        print(f"{exercise} passes: {r.total} of {r.total} checks")
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
        print(
            f"{exercise}: {r.passed} of {r.total} checks pass{why}; the first failing one:\n{r.first_failure}"
        )
    return r.ok


def exercise_module(name: str, impl: str | None = None):
    """Your exercise module ``name`` (``"ex03_block_tables"``) imported afresh, so that your last saved edit is
    what runs; ``None``, with one line saying why, when it does not import (a syntax error while you edit must
    not stop the chapter)."""
    full = f"{impl or impl_package()}.{name}"
    sys.modules.pop(full, None)
    importlib.invalidate_caches()
    try:
        return importlib.import_module(full)
    except Exception as err:
        print(f"{full.replace('.', '/')}.py does not import: {type(err).__name__}: {err}")
        return None


def learner_or_reference(exercises: str | list[str], learner, reference, impl: str | None = None):
    """``learner`` when every exercise in ``exercises`` passes its checks, else ``reference`` (one line says so)."""
    ids = [exercises] if isinstance(exercises, str) else list(exercises)
    failing = [e for e in ids if not run_check(e, impl)]
    if failing:
        print(f"using the reference for {', '.join(failing)} (not passing yet)")
        return reference
    return learner


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
            if re.match(rf"^\s*# BEGIN SOLUTION {re.escape(exercise)}\b", line):
                inside = True
                lines.append(f"# {path.relative_to(ROOT)}")
            elif inside and re.match(r"^\s*# END SOLUTION", line):
                inside = False
            elif inside and not re.match(r"^\s*# STUB:", line):
                lines.append(line)
    print("\n".join(lines) if lines else f"no region {exercise} in solutions/")
