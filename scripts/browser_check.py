"""Check the chapters the way a learner meets them: in JupyterLab, in a real (headless) browser.

nbval proves that a notebook's kernel code runs; it cannot see what JupyterLab shows. This script
starts ``jupyter lab`` (this interpreter's) on a free loopback port with a random token and throwaway
config/runtime/settings/workspace folders, drives Debian's ``chromium`` through ``chromedriver`` and
Selenium, and for each notebook:

1. opens ``lab/tree/<path>``, waits for the kernel, clears the saved outputs and runs every cell with
   JupyterLab's own command (``notebook:run-all-cells`` from the app's command registry);
2. waits (bounded) until the run has finished and the kernel is idle;
3. fails on: an error output (a traceback), a code cell that never ran, a figure shown as
   ``<Figure size ...>`` text, no rendered plot image, a widget output that is not a live widget
   ("Loading widget...", "Error displaying widget", ipywidgets' red error box, the text fallback shown
   when the widget extension is missing), or a first widget that does not answer a real input event
   (slider dragged / dropdown changed / button clicked: some output must change). Warnings on stderr
   are allowed and listed;
4. saves a PNG screenshot of the whole notebook to ``--out``.

The server, its kernels and the browser are stopped on every path (process groups killed), bounded by
an overall timeout. The notebooks are never saved (autosave off; the check fails if JupyterLab saved one).

    python scripts/browser_check.py                 # every chapters/NN_*.ipynb
    python scripts/browser_check.py 01 03 --out out/browser --chapter-timeout 60

Exit status 0 when every check passed, 1 otherwise (a summary lists each failure). The processes live in
``lab_browser.py``; the code that runs in the page in ``browser_check.js`` (both next to this file).
Needs ``chromium`` and ``chromium-driver`` (Debian/Ubuntu: ``apt-get install chromium chromium-driver``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from check_lines import EXPECTATIONS
from lab_browser import WINDOW, Lab, browser_session, kernel_cpu_seconds
from learner_check import Expectation

from paged_course.publish import runtimes
from paged_course.publish.kernel_watch import SILENCE, Watch

REPO = Path(__file__).resolve().parents[1]
JS = (Path(__file__).parent / "browser_check.js").read_text()
ANSWER_TIMEOUT = 15.0  # seconds for the kernel to answer the first widget's input
MAX_SCREENSHOT_HEIGHT = 16000  # pixels; taller notebooks are cut off at the bottom


class CheckTimeout(Exception):
    """The overall time budget ran out (raised from SIGALRM so that every ``finally`` still runs)."""


@dataclass
class Result:
    """What one notebook's check found."""

    notebook: str
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    stall: str | None = (
        None  # the phase a kernel stalled in (silent and idle for the watchdog's window)
    )

    @property
    def ok(self) -> bool:
        return not self.failures


# --------------------------------------------------------------------------------------------------
# Which notebooks


def find_notebooks(names: list[str]) -> list[Path]:
    """Chapter notebooks for ``names`` (``01``, ``01_kv_memory``, or a path to any .ipynb); all by default."""
    chapters = sorted((REPO / "chapters").glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return chapters
    found = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            found.append(path.resolve())
            continue
        hits = [p for p in chapters if p.stem.startswith(name) or p.name == name]
        if not hits:
            raise SystemExit(
                f"no notebook matches {name!r} (chapters present: "
                f"{', '.join(p.stem for p in chapters) or 'none'})"
            )
        found.extend(hits)
    return found


def serving_root(notebooks: list[Path]) -> Path:
    """The repository root, or (for notebooks outside it) the folder that holds them all."""
    if all(REPO in p.parents for p in notebooks):
        return REPO
    return Path(os.path.commonpath([p.parent for p in notebooks]))


# --------------------------------------------------------------------------------------------------
# The page side lives in scripts/browser_check.js

# First interactive control inside a rendered widget, in document order.
CONTROLS = ", ".join(
    ".jp-OutputArea-output " + sel
    for sel in (
        ".widget-slider .noUi-handle",
        ".widget-dropdown select",
        ".widget-toggle-buttons button",
        ".widget-checkbox input",
        "button.widget-button",
        ".widget-text input",
        ".widget-radio-box input",
    )
)


def js(driver, name: str, *args):
    """Call ``window.__browserCheck.<name>(*args)`` (scripts/browser_check.js) in the page."""
    return driver.execute_script(f"{JS}\nreturn window.__browserCheck.{name}(...arguments);", *args)


def js_async(driver, name: str, *args):
    """Await the promise of ``window.__browserCheck.<name>(*args)``; a rejection becomes ``{ok: false, error}``."""
    return driver.execute_async_script(
        f"{JS}\nconst done = arguments[arguments.length - 1];\n"
        f"window.__browserCheck.{name}(...Array.from(arguments).slice(0, -1))"
        ".then(done, (e) => done({ok: false, error: String(e)}));",
        *args,
    )


# --------------------------------------------------------------------------------------------------
# One notebook


def _wait_for_run(driver, rel: str, deadline: float, watch: Watch | None = None) -> dict:
    """Poll until run-all has finished and the kernel is idle with no cell pending; return the state.

    With a ``watch``: a kernel the page has heard nothing from for the watch's silence while its CPU time
    stands still has stalled; the state then names the phase (``stalled``)."""
    stable = 0
    state = {}
    while time.monotonic() < deadline:
        state = js(driver, "state", rel)
        if state.get("error"):
            return state
        if watch is not None and state.get("heardMsAgo") is not None:
            watch.last_heard = time.monotonic() - state["heardMsAgo"] / 1000  # the page's clock
            stalled, used = watch.check()
            if stalled:
                cell = state.get("runningCell")
                state["stalled"] = (
                    f"cell {cell}" if cell is not None else "run-all (no cell running)"
                )
                state["stalled_cpu"] = used
                return state
        finished = state["run"]["done"] and state["status"] == "idle" and state["pending"] == 0
        stable = stable + 1 if finished else 0
        if stable >= 2:
            return state
        time.sleep(0.5)
    state["timed_out"] = True
    return state


def _inspect(driver, rel: str, result: Result, timed_out: bool = False) -> dict:
    report = js(driver, "inspect", rel)
    not_run = [c for c in report["cells"] if not c["executed"] and not c["empty"]]
    if not_run and not timed_out:  # after a timeout the pending cells are already reported
        result.failures.append(
            f"{len(not_run)} code cell(s) never ran, first: cell {not_run[0]['index']} "
            f"`{not_run[0]['head']}`"
        )
    for c in report["cells"]:
        where = f"cell {c['index']} `{c['head']}`"
        for err in c["errors"]:
            last = [line for line in _strip_ansi(err["traceback"]).splitlines() if line.strip()][
                -3:
            ]
            result.failures.append(
                f"{where}: {err['ename']}: {err['evalue']}\n      " + "\n      ".join(last)
            )
        if c["domErrors"] and not c["errors"]:
            result.failures.append(f"{where}: error output shown: {c['domErrors'][0][:200]}")
        for text in c["figureText"]:
            result.failures.append(
                f"{where}: a figure shown as text instead of an image: {text[:120]!r}"
            )
        dead = [w for w in c["widgets"] if not w["live"]]
        for w in dead:
            result.failures.append(
                f"{where}: widget output is not a live widget (is "
                f"@jupyter-widgets/jupyterlab-manager installed?), it shows: {w['text'][:160]!r}"
            )
        for text in c["badWidgetText"]:
            if not any(text == w["text"] for w in dead):
                result.failures.append(f"{where}: widget error text: {text[:160]!r}")
        for text in c["stderr"]:
            result.notes.append(f"stderr in {where}: {text[:160]}")
    if report["images"] == 0:
        result.failures.append("no rendered plot image in any output")
    return report


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def _poke_first_widget(driver, rel: str, deadline: float, result: Result) -> None:
    """Give the first widget control a real input event; some output must change within the deadline."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    controls = driver.find_elements(By.CSS_SELECTOR, CONTROLS)
    if not controls:
        result.notes.append("no interactive widget control found (nothing to move)")
        return
    el = controls[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    time.sleep(0.3)
    before = js(driver, "signature", rel)["sig"]
    kind = el.tag_name.lower()
    classes = el.get_attribute("class") or ""
    if "noUi-handle" in classes:
        slider = el.find_element(By.XPATH, "./ancestor::*[contains(@class, 'widget-slider')][1]")
        track = slider.find_element(By.CSS_SELECTOR, ".noUi-target")
        readout = slider.find_elements(By.CSS_SELECTOR, ".widget-readout")
        old = readout[0].text if readout else ""
        # drag the handle a third of the track towards the far side (left when it sits right of centre)
        handle_x = el.location["x"] - track.location["x"]
        dx = track.size["width"] // 3 * (1 if handle_x < track.size["width"] / 2 else -1)
        ActionChains(driver).click_and_hold(el).move_by_offset(dx, 0).release().perform()
        time.sleep(0.3)
        if readout and readout[0].text == old:  # a drag that did not move it: use the keyboard
            el.send_keys(Keys.ARROW_RIGHT if dx > 0 else Keys.ARROW_LEFT)
        action = f"dragged slider {old!r} -> {readout[0].text if readout else '?'}"
    elif kind == "select":
        select = Select(el)
        current = select.first_selected_option.text if select.all_selected_options else None
        options = [o.text for o in select.options]
        target = next((i for i, o in enumerate(options) if o != current), None)
        if target is None:
            result.notes.append(
                "first widget is a dropdown with a single option (nothing to change)"
            )
            return
        select.select_by_index(target)
        action = f"dropdown {current!r} -> {options[target]!r}"
    elif kind == "input" and (el.get_attribute("type") or "") in ("text", "number"):
        el.send_keys(Keys.END, "1", Keys.ENTER)
        action = "typed into a text box"
    else:
        el.click()
        action = f"clicked <{kind} class={classes!r}>"
    answer_by = min(deadline, time.monotonic() + ANSWER_TIMEOUT)
    while time.monotonic() < answer_by:
        time.sleep(0.5)
        now = js(driver, "signature", rel)
        if now["sig"] != before and now["status"] == "idle":
            result.notes.append(f"first widget answered: {action}")
            return
    result.failures.append(
        f"first widget did not change any output within {ANSWER_TIMEOUT:.0f} s of a real input "
        f"({action})"
    )


def _screenshot(driver, rel: str, path: Path) -> Path | None:
    try:
        # off-screen cells have estimated heights (content-visibility) until shown: grow until it settles
        size = WINDOW[1]
        for _ in range(6):
            want = min(
                MAX_SCREENSHOT_HEIGHT, max(WINDOW[1], int(js(driver, "fullHeight", rel) or 0))
            )
            if abs(want - size) < 20:
                break
            size = want
            driver.set_window_size(WINDOW[0], size)
            time.sleep(1.0)
        js(driver, "fullHeight", rel)  # back to the top after the re-layout
        time.sleep(0.3)
        return path if driver.save_screenshot(str(path)) else None
    except Exception:  # noqa: BLE001 - a screenshot is evidence, never the reason a check fails
        try:
            return path if driver.save_screenshot(str(path)) else None
        except Exception:  # noqa: BLE001
            return None
    finally:
        try:
            driver.set_window_size(*WINDOW)
        except Exception:  # noqa: BLE001
            pass


def _fingerprint(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in paths if p.exists()}


def check_notebook(
    driver,
    lab: Lab,
    notebook: Path,
    root: Path,
    out: Path,
    timeout: float,
    expectation: Expectation | None = None,
    silence: float = SILENCE,
) -> Result:
    """Open ``notebook`` in JupyterLab, run all cells, check the outputs (and, with an ``expectation``, what
    the check cells said), poke the first widget, screenshot."""
    rel = notebook.relative_to(root).as_posix()
    out.mkdir(parents=True, exist_ok=True)
    result = Result(notebook.stem)
    start = time.monotonic()
    deadline = start + timeout
    tmp = lab.log.parent  # the server's throwaway folder: its kernels' connection files are there
    watch = Watch(silence=silence, pid=0, cpu=lambda _pid: kernel_cpu_seconds(tmp))
    files = [notebook, notebook.with_suffix(".py")]
    before = _fingerprint(files)
    try:
        driver.set_script_timeout(max(10.0, timeout))
        driver.get(f"{lab.url}/lab/tree/{rel}?reset&token={lab.token}")
        opened = js_async(driver, "openAndRun", rel, int(timeout * 1000), int(silence * 1000))
        if not opened["ok"]:
            if "waiting for a kernel" in opened["error"] or "kernel to be idle" in opened["error"]:
                result.stall = "kernel start"
                result.failures.append(
                    f"{notebook.stem}: the kernel stalled in kernel start (not idle within "
                    f"{silence:.0f} s)"
                )
                return result
            result.failures.append(f"could not open and run the notebook: {opened['error']}")
            return result
        state = _wait_for_run(driver, rel, deadline, watch)
        if state.get("stalled"):
            result.stall = state["stalled"]
            result.failures.append(
                f"{notebook.stem}: the kernel stalled in {result.stall} ({silence:.0f} s with no "
                f"kernel message, {state['stalled_cpu'] or 0:.2f} s of kernel CPU)"
            )
            return result
        if state.get("timed_out"):
            result.failures.append(
                f"run-all did not finish in {timeout:.0f} s (kernel {state.get('status')}, "
                f"{state.get('pending')} cell(s) pending, {state.get('executed')}/"
                f"{state.get('code')} executed)"
            )
        elif state.get("error"):
            result.failures.append(state["error"])
        elif state["run"].get("error"):
            result.failures.append(f"notebook:run-all-cells failed: {state['run']['error']}")
        report = _inspect(driver, rel, result, timed_out=bool(state.get("timed_out")))
        if not state.get("timed_out"):
            _poke_first_widget(driver, rel, deadline, result)
            if expectation is not None:
                expectation.after_run(driver, rel, report, result, deadline)
    except CheckTimeout:
        result.failures.append("overall timeout reached during this notebook")
        raise
    except Exception as exc:  # noqa: BLE001 - report, keep checking the other notebooks
        result.failures.append(
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        )
    finally:
        result.seconds = time.monotonic() - start
        result.screenshot = _screenshot(driver, rel, out / f"{notebook.stem}.png")
        try:
            js(driver, "markClean")
            lab.shutdown_kernels()
        except Exception:  # noqa: BLE001
            pass
        saved = f"Saving file at /{rel}" in lab.log.read_text(errors="replace")
        if saved:
            result.failures.append(f"JupyterLab saved {rel} during the check (restore it with git)")
        changed = [p.name for p, stamp in _fingerprint(files).items() if before.get(p) != stamp]
        if changed and not saved:
            result.notes.append(
                f"{', '.join(changed)} changed on disk during the check (not saved by JupyterLab: "
                "someone edited or re-executed it; the check ran the version it opened)"
            )
    if result.seconds > timeout:
        result.failures.append(f"took {result.seconds:.0f} s, over the {timeout:.0f} s budget")
    return result


# --------------------------------------------------------------------------------------------------
# Driver


def run_checks(
    notebooks: list[Path],
    out: Path,
    chapter_timeout: float = 60.0,
    overall_timeout: float | None = None,
    echo=print,
    expectation: Expectation | None = None,
    silence: float = SILENCE,
) -> list[Result]:
    """Check ``notebooks`` in one JupyterLab + one browser; both stopped on every path.

    A notebook whose kernel stalls (``silence`` seconds with no kernel message while idle) is checked once
    more from the top, with one line saying so; a second stall fails it naming the phase. With
    ``PAGED_CHAPTER_BUDGET=1`` a chapter over its budget (``paged_course.publish.runtimes``) fails."""
    out.mkdir(parents=True, exist_ok=True)
    root = serving_root(notebooks)
    overall = overall_timeout or 120 + (len(notebooks) + 1) * (chapter_timeout + 30)
    table = runtimes.load() if os.environ.get("PAGED_CHAPTER_BUDGET") == "1" else {}
    results: list[Result] = []

    def on_alarm(signum, frame):
        raise CheckTimeout(f"overall timeout of {overall:.0f} s reached")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(overall))
    try:
        with browser_session(root) as (lab, driver):
            for notebook in notebooks:
                result = check_notebook(
                    driver, lab, notebook, root, out, chapter_timeout, expectation, silence
                )
                if result.stall:
                    echo(f"{result.failures[-1]}; restarting {notebook.stem} once from the top")
                    result = check_notebook(
                        driver, lab, notebook, root, out, chapter_timeout, expectation, silence
                    )
                    if result.stall:
                        result.failures.append(
                            f"{notebook.stem} stalled again after 1 restart, in {result.stall}"
                        )
                result.failures.extend(
                    runtimes.over_budget({result.notebook: result.seconds}, table)
                )
                results.append(result)
                echo(
                    f"{'PASS' if result.ok else 'FAIL'} {result.notebook} ({result.seconds:.1f} s)"
                )
                for note in result.notes:
                    echo(f"    note: {note}")
                for failure in result.failures:
                    echo(f"    FAIL: {failure}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "chapters", nargs="*", help="chapter numbers, names or .ipynb paths (default: all)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "out" / "browser", help="folder for the PNG screenshots"
    )
    parser.add_argument(
        "--chapter-timeout", type=float, default=60.0, help="seconds per notebook (default 60)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="overall seconds (default: 120 + (chapter timeout + 30) per notebook, and one more)",
    )
    parser.add_argument(
        "--kernel-silence",
        type=float,
        default=SILENCE,
        help=f"seconds with no kernel message while idle that make a stall (default {SILENCE:.0f}): "
        "the notebook is checked once more, a second stall fails it",
    )
    parser.add_argument(
        "--expect",
        choices=EXPECTATIONS,
        default=None,
        help="also check what the check cells say: 'stubs' (exercises/ untouched: nothing passes, "
        "every capstone part is the reference's) or 'typed-in' (solutions/ written into exercises/ "
        "for the run and put back after: every check passes, every part is yours)",
    )
    parser.add_argument(
        "--round-trip",
        action="store_true",
        help="with --expect stubs: in chapter 03, type a wrong then the right answer into ch03.ex1 in "
        "JupyterLab's editor and read its check cell each time",
    )
    args = parser.parse_args(argv)
    if args.round_trip and args.expect != "stubs":
        parser.error("--round-trip needs --expect stubs")
    expectation = Expectation(args.expect, args.round_trip) if args.expect else None
    notebooks = find_notebooks(args.chapters)
    if not notebooks:
        print("no chapter notebooks found (chapters/NN_*.ipynb)")
        return 1
    t0 = time.monotonic()
    try:
        with expectation.prepared() if expectation else contextlib.nullcontext():
            results = run_checks(
                notebooks,
                args.out,
                args.chapter_timeout,
                args.timeout,
                expectation=expectation,
                silence=args.kernel_silence,
            )
    except (CheckTimeout, RuntimeError) as exc:
        print(f"browser check aborted: {exc}")
        return 1
    failed = [r for r in results if not r.ok]
    print(
        f"\nbrowser check: {len(results) - len(failed)}/{len(results)} notebooks passed in "
        f"{time.monotonic() - t0:.0f} s; screenshots in {args.out}"
    )
    for r in failed:
        print(
            f"  {r.notebook}: {len(r.failures)} failure(s); first: {r.failures[0].splitlines()[0]}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
