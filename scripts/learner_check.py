"""The learner's side of ``scripts/browser_check.py``: what the check cells must say, and one round trip.

``Expectation("stubs")`` requires ``exercises/`` to hold the untouched stubs (what ``python -m paged course
sync`` writes) and, after each chapter has run in JupyterLab, that its check cells and capstone tables say
so (``check_lines.problems``). ``Expectation("typed-in")`` writes every region of ``solutions/`` into
``exercises/`` for the run, as a learner who has finished would have them, and puts the stubs back
afterwards, byte for byte, however the run ends. With ``round_trip=True`` (stubs only), chapter 03 gets a
learner's round trip in the browser: open ``exercises/ex03_block_tables.py`` from JupyterLab's file
browser, type a wrong answer into region ch03.ex1 (a planted one from ``tests/mutants``) and save, run the
region's check cell and see the failure; type the right answer, save, run it again and see the pass line;
the stub is put back at the end.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import check_lines

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from paged_course.capstone import PART_SOURCES  # noqa: E402
from paged_course.grading import mutants  # noqa: E402
from paged_course.publish.sync import exercise_ids, make_stub  # noqa: E402

ROUND_TRIP = ("03", "ex03_block_tables", "ch03.ex1")  # chapter, exercise file, region


def _stubs() -> dict[Path, str]:
    return {
        REPO / "exercises" / p.name: make_stub(p.read_text(), f"solutions/{p.name}")
        for p in sorted((REPO / "solutions").glob("ex*.py"))
    }


class Expectation:
    """What the chapters' check lines must say for one state of ``exercises/`` (see the module docstring)."""

    def __init__(self, expect: str, round_trip: bool = False):
        if expect not in check_lines.EXPECTATIONS:
            raise ValueError(f"expect must be one of {check_lines.EXPECTATIONS}, got {expect!r}")
        if round_trip and expect != "stubs":
            raise ValueError(
                "the learner round trip starts from the untouched stubs (--expect stubs)"
            )
        self.expect, self.round_trip = expect, round_trip

    @contextlib.contextmanager
    def prepared(self):
        """``exercises/`` in the state this expectation is about, for the length of the ``with`` block."""
        stubs = _stubs()
        edited = [p.name for p, text in stubs.items() if not p.exists() or p.read_text() != text]
        if edited:
            raise RuntimeError(
                "exercises/ is not the untouched stubs ("
                + ", ".join(edited)
                + "): the check needs "
                "them as `python -m paged course sync` writes them (commit or move your answers first)"
            )
        if self.expect == "stubs":
            yield
            return
        try:
            for path in sorted((REPO / "solutions").glob("ex*.py")):
                source = path.read_text()
                (REPO / "exercises" / path.name).write_text(
                    make_stub(source, f"solutions/{path.name}", keep=tuple(exercise_ids(source)))
                )
            yield
        finally:
            for path, text in stubs.items():
                path.write_text(text)

    def after_run(self, driver, rel: str, report: dict, result, deadline: float) -> None:
        """Add to ``result.failures`` what the chapter's cells said against the expectation; run the round
        trip in chapter 03."""
        chapter = Path(rel).stem
        parts = tuple(PART_SOURCES) if chapter.startswith("07") else ()
        result.failures += check_lines.problems(chapter, report["cells"], self.expect, parts)
        checks = check_lines.check_cells(report["cells"])
        result.notes.append(f"{len(checks)} check cell(s) read, expecting {self.expect}")
        if self.round_trip and chapter.startswith(ROUND_TRIP[0]):
            round_trip(driver, rel, report, result, deadline)


def round_trip(driver, rel: str, report: dict, result, deadline: float) -> None:
    """The learner's loop in the browser (module docstring); failures go to ``result.failures``."""
    from browser_check import js, js_async
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _, module, exercise = ROUND_TRIP
    path = REPO / "exercises" / f"{module}.py"
    rel_file = f"exercises/{module}.py"
    cell = next((i for i, ex in check_lines.check_cells(report["cells"]) if ex == exercise), None)
    if cell is None:
        result.failures.append(f"round trip: no check({exercise!r}) cell in {rel}")
        return
    source = (REPO / "solutions" / f"{module}.py").read_text()
    wrong_code = next(iter(mutants.load_mutants()[f"{module}.py"][exercise].values()))
    right = make_stub(source, f"solutions/{module}.py", keep=(exercise,))
    wrong = make_stub(
        mutants.apply(source, exercise, wrong_code), f"solutions/{module}.py", (exercise,)
    )
    original = path.read_bytes()
    try:
        listing = js_async(driver, "browseTo", "exercises")
        if f"{module}.py" not in listing.get("items", []):
            result.failures.append(
                f"round trip: the file browser does not list {rel_file}: {listing}"
            )
            return
        item = next(
            el
            for el in driver.find_elements(By.CSS_SELECTOR, ".jp-DirListing-item")
            if el.text.strip().startswith(f"{module}.py")
        )
        ActionChains(driver).double_click(item).perform()
        while not js(driver, "isOpen", rel_file):
            if time.monotonic() > deadline:
                result.failures.append(f"round trip: {rel_file} did not open from the file browser")
                return
            time.sleep(0.2)
        for text, want in ((wrong, f"{exercise}: "), (right, f"{exercise} passes:")):
            saved = js_async(driver, "typeAndSave", rel_file, text)
            if not saved.get("ok"):
                result.failures.append(f"round trip: saving {rel_file} failed: {saved}")
                return
            ran = js_async(
                driver, "runCell", rel, cell, int(max(1.0, deadline - time.monotonic()) * 1000)
            )
            said = (ran.get("stdout") or "").strip()
            if not ran.get("ok") or not said.startswith(want):
                result.failures.append(
                    f"round trip: after typing {'the right' if 'passes' in want else 'a wrong'} answer "
                    f"into {exercise}, its check cell should start with {want!r}; it said: "
                    f"{said.splitlines()[0] if said else ran}"
                )
                return
            result.notes.append(f"round trip: {said.splitlines()[0][:100]}")
    finally:
        path.write_bytes(original)
