"""The pytest side of the grader: loaded into the test process with ``-p paged_course.grading.plugin``.

It keeps only the graded tests (of the chapters in ``$PAGED_GRADE_CHAPTERS``), applies each test's time
limit, writes one JSON line per event (collected, start, result, finish) to ``$PAGED_GRADE_LOG`` and, once a
test of a region timed out inside a function, stops that region's later tests when they call it
(``BlockedByTimeout``). Without ``$PAGED_GRADE_LOG`` set every hook does nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys

from paged_course.grading.reports import _timeout_location

_LOG_ENV, _CHAPTERS_ENV = "PAGED_GRADE_LOG", "PAGED_GRADE_CHAPTERS"
_TIMEOUT_TEXT = (
    "from pytest-timeout"  # pytest-timeout's failure: "Timeout (>10.0s) from pytest-timeout."
)


class BlockedByTimeout(Exception):
    """Raised on entering a function that timed out in an earlier test of the same region: that test is
    reported ``blocked`` at once instead of waiting out its own time limit."""


_exercise_of: dict[str, str] = {}  # nodeid -> exercise id, from collection
_timed_out: dict[
    str, dict
] = {}  # exercise id -> where its first timeout stopped: file, line, func, test


def _timeout_frame(output: str) -> dict | None:
    """``{"file", "line", "func"}`` of the innermost frame outside the tests and pytest where pytest-timeout
    stopped a test, read from its traceback; None when it cannot be told."""
    spot = _timeout_location(output)
    m = re.fullmatch(r"(\S+\.py):(\d+) \(in (\w+)\)", spot or "")
    if m is None or re.match(r"(.*/)?tests/", m[1]):  # stopped in a test's own code: block nothing
        return None
    return {"file": m[1], "line": int(m[2]), "func": m[3]}


def _blocking_tracer(spot: dict):
    """A ``sys.settrace`` function that raises :class:`BlockedByTimeout` when ``spot``'s function is called
    (same name, same file); it traces calls only, never lines."""
    name, file = spot["func"], spot["file"].replace("\\", "/")

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == name and code.co_filename.endswith(file):
            raise BlockedByTimeout(
                f"blocked: calls {name} ({spot['file']}:{spot['line']}), which timed out in "
                f"{spot['test']}; not run again (fix that loop first)"
            )
        return None

    return tracer


def pytest_runtest_setup(item):
    """A later test of a region whose function timed out stops as soon as it calls that function."""
    if _LOG_ENV not in os.environ:
        return
    spot = _timed_out.get(_exercise_of.get(item.nodeid, ""))
    if spot is not None:
        sys.settrace(_blocking_tracer(spot))


def pytest_runtest_teardown(item):
    if _LOG_ENV in os.environ and item.nodeid in _exercise_of:
        sys.settrace(None)


def _log(event: dict) -> None:
    with open(os.environ[_LOG_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def _exercise(item) -> tuple[str, int] | None:
    marker = item.get_closest_marker("exercise")
    if marker is None:
        return None
    ex_id = marker.kwargs.get("id", marker.args[0] if marker.args else "?")
    points = marker.kwargs.get("points", marker.args[1] if len(marker.args) > 1 else 1)
    return str(ex_id), int(points)


def _all_or_nothing(item) -> bool:
    marker = item.get_closest_marker("exercise")
    return bool(marker is not None and marker.kwargs.get("all_or_nothing", False))


def _own_timeout(item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    return float(value) if value is not None else None


def pytest_collection_modifyitems(config, items):
    if _LOG_ENV not in os.environ:
        return
    import pytest

    wanted = [c for c in os.environ.get(_CHAPTERS_ENV, "").split(",") if c]
    keep, drop = [], []
    for item in items:
        ex = _exercise(item)
        ok = ex is not None and (not wanted or ex[0].split(".")[0] in wanted)
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    try:
        default = config.getoption("timeout")  # pytest-timeout's --timeout; None when not given
    except ValueError:  # pytest-timeout not installed (collect-only callers)
        default = None
    default = float(default) if default else None
    for item in keep:
        ex_id, points = _exercise(item)
        own = _own_timeout(item)
        limit = max(x for x in (own, default, 0.0) if x is not None) or None
        if (
            own is not None and limit != own
        ):  # --timeout larger than the test's own limit: the larger wins
            item.add_marker(pytest.mark.timeout(limit), append=False)
        uses = list(item.get_closest_marker("exercise").kwargs.get("uses", ()))
        _exercise_of[item.nodeid] = ex_id
        _log(
            {
                "event": "collected",
                "nodeid": item.nodeid,
                "id": ex_id,
                "points": points,
                "timeout": limit,
                "uses": uses,
                "all_or_nothing": _all_or_nothing(item),
            }
        )


def pytest_runtest_logstart(nodeid, location):
    if _LOG_ENV in os.environ:
        _log({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    if _LOG_ENV not in os.environ:
        return
    if (
        report.when == "call" or report.outcome != "passed"
    ):  # setup/teardown only matter when they fail
        if report.skipped:
            reason = (
                report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            )
            text = f"skipped: {str(reason).removeprefix('Skipped: ')}"
        else:
            text = report.longreprtext
        timed_out = report.failed and _TIMEOUT_TEXT in text and "Timeout (>" in text
        blocked = report.failed and "BlockedByTimeout: blocked:" in text
        ex_id = _exercise_of.get(report.nodeid)
        if timed_out and ex_id and ex_id not in _timed_out:
            spot = _timeout_frame(text)
            if spot is not None:
                _timed_out[ex_id] = dict(spot, test=report.nodeid.rsplit("::", 1)[-1])
        _log(
            {
                "event": "result",
                "nodeid": report.nodeid,
                "when": report.when,
                "outcome": report.outcome,
                "output": text[-4000:],
                "duration": report.duration,
                "timeout": timed_out,
                "blocked": blocked,
            }
        )


def pytest_runtest_logfinish(nodeid, location):
    if _LOG_ENV in os.environ:
        _log({"event": "finish", "nodeid": nodeid})
