"""Grade the exercises: ``python -m paged grade [chNN ...] [--impl exercises|solutions] [--report DIR] [--timeout S]``.

The graded tests (``tests/exercises``, each marked ``@pytest.mark.exercise("chNN.exK", points=P)``)
run in a *subprocess* with pytest-timeout's per-test limit: ``--timeout S`` (default 10 s) for every
test, or a test's own ``@pytest.mark.timeout(N)`` when that is larger (the few tests that import
Triton or warm up torch carry one). An infinite loop fails that one test (``timed out after 10 s``);
a hang that the timeout cannot interrupt (inside C code) is ended by a watchdog a few seconds later
(limit + max(5 s, limit / 2)), and a crash of the whole test process (segfault, ``os._exit``) fails
only the test that was running: the remaining tests run in a fresh process. Once a test of a region times
out inside a function, the region's later tests stop the moment they call that function and are reported
``blocked`` (``B``) instead of waiting out their own limit. The pytest plugin
(``-p paged_course.grading.plugin``, ``plugin.py``) writes one JSON line per event to ``$PAGED_GRADE_LOG``;
the grader reads that log while pytest runs and prints a line per chapter (``progress.py``).

A region whose tests carry ``@pytest.mark.exercise(..., all_or_nothing=True)`` (a spot-the-bug region: the
learner gets working-looking code with one planted bug, which passes some of its tests by design; or
ch04.ex3, whose starter is correct but slow) scores 0
unless every one of its tests passes: its passing tests are then *withheld* (score 0, reported failed to
Gradescope and in JUnit, with the reason), see :func:`apply_all_or_nothing`.

``grade(...)`` returns a ``Report``; ``--report DIR`` writes ``results.json`` (Gradescope's
autograder format: https://gradescope-autograders.readthedocs.io/en/latest/specs/ ; a skipped test
counts as failed, with its reason), ``junit.xml`` and ``summary.md``. Learners get exit code 0
(``--strict``: 1 below full marks); Ctrl-C stops the test process and its children, prints the
table of the tests that finished and exits with 130. The test process runs in its own process group,
which the grader kills however it ends; on Linux the kernel also kills it if the grader itself is
killed (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from paged_course.grading.plugin import _CHAPTERS_ENV, _LOG_ENV
from paged_course.grading.progress import Progress
from paged_course.grading.reports import Report, TestResult, _timeout_location, apply_all_or_nothing

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = (
    10.0  # seconds per graded test; a test that needs more carries @pytest.mark.timeout(N)
)
STARTUP_S = 180.0  # pytest start-up and collection (imports torch; slow on a cold laptop disk)
AFTER_TEST_S = 60.0  # between one test's end and the next one's start, or the end of the session


WATCHDOG_FLOOR_S = 5.0  # the least grace the watchdog gives pytest-timeout after a test's limit


def watchdog_seconds(limit: float) -> float:
    """How long a test may run before the grader kills the test process: ``limit + max(5, limit / 2)``.

    pytest-timeout interrupts Python code at ``limit``; the watchdog only ends hangs it cannot reach
    (a loop inside C code, a deadlock), so it scales with the limit: 15 s for the default 10 s, 90 s
    for a test with its own 60 s.
    """
    return limit + max(WATCHDOG_FLOOR_S, limit / 2)


class GradingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM to the CLI) during ``grade``: the test process was stopped; ``.report`` is partial."""

    def __init__(self, report: Report):
        super().__init__(
            f"grading interrupted after {len(report.tests)} of "
            f"{len(report.tests) + len(report.not_run)} tests"
        )
        self.report = report


def normalize_chapter(name: str) -> str:
    """``"ch01"``, ``"01"`` or ``"1"`` -> ``"ch01"``; raises ValueError for anything else."""
    match = re.fullmatch(r"(?:ch)?(\d{1,2})", name.strip().lower())
    if not match:
        raise ValueError(f"chapter: expected names like ch01, 01 or 1, got {name!r}")
    return f"ch{int(match[1]):02d}"


class _EventTail:
    """Reads the event log as the plugin appends to it: complete JSON lines only."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


@dataclass
class _ChildEnd:
    returncode: int
    running: str | None  # the test that had started but not finished when the process ended
    killed_after: (
        float | None
    )  # seconds the running test had run when the watchdog killed the process
    output_tail: str  # the end of pytest's own output (stdout and stderr)


def _spawn(cmd: list[str], root: Path, env: dict, out) -> subprocess.Popen:
    if (
        os.name == "posix"
    ):  # its own process group: Ctrl-C reaches the grader only, which stops the group
        return subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,  # pragma: no cover
        stdin=subprocess.DEVNULL,
        creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
    )


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the pytest process and everything it started (its process group)."""
    if proc.poll() is None or os.name == "posix":
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:  # pragma: no cover - Windows
                subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


# The graded tests need none of the notebook / property-test plugins the course's dev extra installs;
# not loading them (nor the ini's addopts, which name nbval's options) takes ~3 s off every grader start.
_LEAN = ["-p", "no:nbval", "-p", "no:hypothesispytest", "-p", "no:anyio", "-o", "addopts="]
_PARENT_ENV = "PAGED_GRADE_PARENT"
# The test process runs pytest through this bootstrap. On Linux it first asks the kernel to kill it when
# the grader dies (PR_SET_PDEATHSIG), so even a grader killed with SIGKILL leaves no test process behind.
_BOOT = """
import os, sys
if sys.platform.startswith("linux"):
    import ctypes, signal
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != int(os.environ.get("PAGED_GRADE_PARENT", os.getppid())):
        os._exit(1)  # the grader died before the line above took effect
import pytest
raise SystemExit(pytest.console_main())
"""


def _run_pytest(
    targets: list[str],
    impl: str,
    timeout: float,
    chapters: list[str],
    root: Path,
    log: Path,
    on_event: Callable[[dict], None],
    limit_of: Callable[[str], float],
) -> _ChildEnd:
    """One pytest subprocess; every event goes to ``on_event`` as it is logged.

    A watchdog kills the process group when a test runs past ``watchdog_seconds(its limit)`` (a hang
    that pytest-timeout could not interrupt), when start-up takes longer than ``STARTUP_S``, or when
    nothing happens for ``AFTER_TEST_S`` after a test. However it ends (KeyboardInterrupt included),
    the process group is killed, so nothing the tests started outlives the grader.
    """
    env = dict(os.environ, **{_LOG_ENV: str(log), _CHAPTERS_ENV: ",".join(chapters)})
    env.setdefault("TQDM_DISABLE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env[_PARENT_ENV] = str(os.getpid())
    cmd = [
        sys.executable,
        "-c",
        _BOOT,
        *targets,
        "-p",
        "paged_course.grading.plugin",
        f"--impl={impl}",
        f"--timeout={timeout:g}",
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        *_LEAN,
    ]
    log.write_text("")
    out_path = log.with_suffix(".out")
    tail, queue = _EventTail(log), deque()
    running, started_at, killed_after = None, 0.0, None
    with open(out_path, "wb") as out:
        proc = _spawn(cmd, root, env, out)
        deadline = time.monotonic() + STARTUP_S
        try:
            while True:
                ended = proc.poll() is not None
                queue.extend(tail.read())
                while queue:
                    ev = queue.popleft()
                    now = time.monotonic()
                    if ev["event"] == "start":
                        running, started_at = ev["nodeid"], now
                        deadline = now + watchdog_seconds(limit_of(running))
                    elif ev["event"] == "finish":
                        running, deadline = None, now + AFTER_TEST_S
                    on_event(ev)
                if ended:
                    break
                if killed_after is None and time.monotonic() > deadline:
                    killed_after = time.monotonic() - started_at if running else 0.0
                    _kill_tree(proc)
                    continue
                time.sleep(0.05)
        except BaseException:  # Ctrl-C: stop the tests, then count what had finished before it
            _kill_tree(proc)
            queue.extend(tail.read())
            while queue:
                try:
                    on_event(queue.popleft())
                except Exception:  # pragma: no cover - best effort; the interrupt is what matters
                    pass
            raise
        finally:  # also after a normal end: nothing the tests started outlives the grader
            _kill_tree(proc)
    output = out_path.read_text(errors="replace")
    return _ChildEnd(proc.returncode, running, killed_after, output[-8000:])


def _signal_words(returncode: int) -> str:
    """``-11`` -> "a segmentation fault (SIGSEGV)"; ``3`` -> "exit code 3"."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
    words = {
        "SIGSEGV": "a segmentation fault",
        "SIGABRT": "an abort",
        "SIGBUS": "a bus error",
        "SIGFPE": "a floating-point exception",
        "SIGILL": "an illegal instruction",
        "SIGKILL": "SIGKILL, often the system running out of memory",
    }
    return (
        f"{words[name]} ({name})" if name in words and name != "SIGKILL" else words.get(name, name)
    )


def _crash_message(end: _ChildEnd, test: TestResult) -> tuple[str, str]:
    """(status, plain-words message) for the test that was running when the process ended."""
    limit = test.limit or DEFAULT_TIMEOUT
    if end.killed_after is not None:
        return "timeout", (
            f"timed out after {limit:g} s and did not stop (stuck inside C code, or a deadlock?): "
            f"the grader ended the test process after {end.killed_after:.0f} s"
        )
    if (
        "+ Timeout +" in end.output_tail
    ):  # pytest-timeout's thread method (no SIGALRM, e.g. Windows) exits
        return "timeout", f"timed out after {limit:g} s (an infinite loop?)"
    if end.returncode < 0:
        how = f"was killed by {_signal_words(end.returncode)} while this test ran"
    else:
        how = (
            f"exited with code {end.returncode} while this test ran "
            "(os._exit, or a library that ended the process?)"
        )
    return "crashed", f"crashed: the test process {how}; the other tests ran in a fresh process"


def _not_run_message(end: _ChildEnd) -> str:
    """Why pytest ended outside any test: a collection error (file and exception) or how the process ended."""
    text = f"not run: the test process ended ({_signal_words(end.returncode)}) before this test could run"
    files = re.findall(r"ERROR collecting (\S+)", end.output_tail)
    errors = [
        ln[1:].strip()
        for ln in end.output_tail.splitlines()
        if re.match(r"^E\s+\w*(Error|Exception)\b", ln)
    ]
    if files:
        text += f": a collection error in {files[0]}" + (f" ({errors[0]})" if errors else "")
    elif errors:
        text += f": {errors[-1]}"
    return text


def grade(
    chapters: list[str] | None = None,
    impl: str = "exercises",
    report_dir: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    tests_dir: Path | None = None,
    root: Path | None = None,
    progress: TextIO | None = None,
) -> Report:
    """Run the graded tests for ``chapters`` (default: all) against ``impl`` and return the ``Report``.

    Args:
        chapters: e.g. ``["ch01", "3"]``; None or empty grades every chapter.
        impl: ``"exercises"`` (the learner's files) or ``"solutions"``.
        report_dir: when given, write results.json, junit.xml and summary.md there.
        timeout: seconds per test (pytest-timeout); a test past it fails, the others still run. A test
            with its own larger ``@pytest.mark.timeout(N)`` keeps N.
        tests_dir: folder of graded tests (default ``<root>/tests/exercises``).
        root: the working directory of the pytest subprocess (default: the repository root).
        progress: a text stream for live progress (a line per chapter); None prints nothing.

    Raises:
        ValueError: a bad chapter name, impl or timeout.
        GradingInterrupted: Ctrl-C; the test process group was killed, ``err.report`` holds the
            tests that finished (``not_run`` the others). No report files are written.
    """
    if impl not in ("exercises", "solutions"):
        raise ValueError(f"impl must be 'exercises' or 'solutions', got {impl!r}")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    wanted = sorted({normalize_chapter(c) for c in chapters or []})
    root = Path(root or ROOT)
    tests_dir = Path(tests_dir or root / "tests" / "exercises")
    bar = Progress(progress) if progress is not None else None
    collected: dict[str, TestResult] = {}
    results: dict[
        str, tuple[str, str]
    ] = {}  # nodeid -> (status, output) of the tests that finished
    finished: list[str] = []
    starts: dict[str, float] = {}  # nodeid -> when its start event was read
    begun = time.monotonic()

    def settle(nodeid: str, status: str, output: str = "", message: str = "") -> None:
        test = collected[nodeid]
        test.status, test.output, test.message = status, output, message
        test.duration = time.monotonic() - starts[nodeid] if nodeid in starts else None
        if nodeid not in finished:
            finished.append(nodeid)
        if bar is not None:
            bar.finish(test)

    def on_event(ev: dict) -> None:
        kind = ev["event"]
        if kind == "collected":
            collected.setdefault(
                ev["nodeid"],
                TestResult(
                    ev["nodeid"],
                    ev["id"],
                    ev["points"],
                    limit=ev.get("timeout") or timeout,
                    uses=tuple(ev.get("uses", ())),
                    all_or_nothing=bool(ev.get("all_or_nothing", False)),
                ),
            )
        elif kind == "start":
            if bar is not None:
                bar.begin(list(collected.values()))
                bar.start(collected[ev["nodeid"]])
            starts[ev["nodeid"]] = time.monotonic()
        elif kind == "result":
            _record(results, ev)
        elif kind == "finish" and ev["nodeid"] in collected:
            status, output = results.get(ev["nodeid"], ("failed", "no result recorded"))
            message = ""
            if status == "timeout":
                test = collected[ev["nodeid"]]
                where = _timeout_location(output)
                message = f"timed out after {test.limit:g} s (an infinite loop?)" + (
                    f" at {where}" if where else ""
                )
            elif status == "blocked":
                found = re.search(r"BlockedByTimeout: (blocked: .*)", output)
                message = found.group(1).strip() if found else "blocked by an earlier timeout"
            settle(ev["nodeid"], status, output, message)

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "events.jsonl"
        targets = [str(tests_dir)]
        try:
            while True:  # each round either finishes or settles at least the test that crashed
                end = _run_pytest(
                    targets,
                    impl,
                    timeout,
                    wanted,
                    root,
                    log,
                    on_event,
                    lambda nodeid: collected[nodeid].limit if nodeid in collected else timeout,
                )
                if bar is not None and collected:
                    bar.begin(list(collected.values()))
                pending = [n for n in collected if n not in finished]
                if not pending:
                    break
                if end.running in pending:  # the process died (or was stopped) while this test ran
                    status, message = _crash_message(end, collected[end.running])
                    settle(end.running, status, end.output_tail, message)
                    pending.remove(end.running)
                    targets = pending
                    continue
                # it died outside any test (a collection error, a session fixture): no retry can help
                message = _not_run_message(end)
                for nodeid in pending:
                    settle(nodeid, "crashed", end.output_tail, message)
                break
        except KeyboardInterrupt:
            if bar is not None:
                bar.end_line()
            report = Report(impl=impl, interrupted=True, seconds=time.monotonic() - begun)
            report.tests = [collected[n] for n in collected if n in finished]
            report.not_run = [collected[n] for n in collected if n not in finished]
            apply_all_or_nothing(report.tests, tuple({t.exercise for t in report.not_run}))
            raise GradingInterrupted(report) from None
    if bar is not None:
        bar.end_line()
    report = Report(impl=impl, seconds=time.monotonic() - begun)
    report.tests = apply_all_or_nothing(list(collected.values()))
    if report_dir is not None:
        report.write(Path(report_dir))
    return report


def _record(results: dict, ev: dict) -> None:
    nodeid, outcome, output = ev["nodeid"], ev["outcome"], ev["output"]
    if outcome == "passed":
        results.setdefault(nodeid, ("passed", ""))
        return
    status = "skipped" if outcome == "skipped" else "failed"
    if ev.get("timeout"):
        status = "timeout"
    elif ev.get("blocked"):
        status = "blocked"
    if ev["when"] != "call":
        output = f"[{ev['when']}] {output}"
    if (
        results.get(nodeid, ("passed",))[0] == "passed"
    ):  # the first failure wins (call before teardown)
        results[nodeid] = (status, output)
