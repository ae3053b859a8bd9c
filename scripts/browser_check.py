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

Exit status 0 when every check passed, 1 otherwise (a summary lists each failure).
Needs ``chromium`` and ``chromium-driver`` (Debian/Ubuntu: ``apt-get install chromium chromium-driver``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
CHROME_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,900", "--hide-scrollbars",
]
WINDOW = (1280, 900)
ANSWER_TIMEOUT = 15.0  # seconds for the kernel to answer the first widget's input
MAX_SCREENSHOT_HEIGHT = 16000  # pixels; taller notebooks are cut off at the bottom

# JupyterLab user settings for the throwaway settings folder: never write the notebook (autosave off),
# start the default kernel without a dialog when a notebook names none, no news/update toasts.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


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
            raise SystemExit(f"no notebook matches {name!r} (chapters present: "
                             f"{', '.join(p.stem for p in chapters) or 'none'})")
        found.extend(hits)
    return found


def serving_root(notebooks: list[Path]) -> Path:
    """The repository root, or (for notebooks outside it) the folder that holds them all."""
    if all(REPO in p.parents for p in notebooks):
        return REPO
    return Path(os.path.commonpath([p.parent for p in notebooks]))


# --------------------------------------------------------------------------------------------------
# Processes: JupyterLab and Chromium


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group ``proc`` leads, then SIGKILL what is left after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_kernels_of(tmp: Path) -> None:
    """SIGKILL kernels left by this server (kernels run in their own session; their connection file is in ``tmp``)."""
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "ipykernel" in cmdline and str(tmp) in cmdline:
            try:
                os.kill(int(proc_dir.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def server_env(tmp: Path) -> dict[str, str]:
    """The server's (and so the kernels') environment: throwaway Jupyter folders, CPU-friendly defaults."""
    env = dict(os.environ)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        folder = tmp / var.lower()
        folder.mkdir()
        env[var] = str(folder)
    for rel, settings in LAB_SETTINGS.items():
        path = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    # no language-server extension: it would write .virtual_documents/ into the served folder
    (Path(env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_lsp": False}}}))
    env.pop("MPLBACKEND", None)  # the learner's default (inline), whatever the CI shell sets
    env["TQDM_DISABLE"] = "1"
    env.setdefault("PYTHONHASHSEED", "0")
    if not Path("/dev/nvidia0").exists():
        env["TRITON_INTERPRET"] = "1"
    return env


@dataclass
class Lab:
    url: str
    token: str
    log: Path

    def api(self, method: str, path: str) -> object:
        req = urllib.request.Request(self.url + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")
        for kernel in self.api("GET", "/api/kernels") or []:
            self.api("DELETE", f"/api/kernels/{kernel['id']}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@contextmanager
def jupyter_lab(root: Path, tmp: Path, start_timeout: float = 90.0):
    """Run ``jupyter lab`` serving ``root`` on a free loopback port; yield a :class:`Lab`; always stop it."""
    token = secrets.token_hex(24)
    port = free_port()
    log = tmp / "jupyter-lab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}",
           f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           # JupyterLab makes a checkpoint copy when it opens a notebook: keep it out of the repository
           f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}"]
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=server_env(tmp), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {proc.returncode}:\n{lab.log_tail()}")
            try:
                lab.api("GET", "/api/status")
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not answer in {start_timeout:.0f} s:\n"
                                       f"{lab.log_tail()}") from None
                time.sleep(0.3)
        yield lab
    finally:
        try:
            lab.shutdown_kernels()
        except (urllib.error.URLError, OSError, ValueError):
            pass
        kill_group(proc)
        kill_kernels_of(tmp)


@contextmanager
def chromium(tmp: Path):
    """Headless Chromium under chromedriver (both in their own process group); always quit both."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists():
            raise RuntimeError(f"{exe} not found: install it with `apt-get install chromium chromium-driver`")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp / 'chromium-profile'}")
    options.unhandled_prompt_behavior = "accept"  # a "leave page?" prompt must never block the run
    service = Service(CHROMEDRIVER, log_output=str(tmp / "chromedriver.log"),
                      popen_kw={"start_new_session": True})
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            if service.process is not None:
                kill_group(service.process, grace=2.0)


# --------------------------------------------------------------------------------------------------
# JavaScript run inside JupyterLab (window.jupyterapp is exposed by --LabApp.expose_app_in_browser)

JS_PANEL = """
const findPanel = (path) => {
  const app = window.jupyterapp;
  return app ? Array.from(app.shell.widgets('main')).find(w => w.context && w.context.path === path) : undefined;
};
"""

JS_OPEN = JS_PANEL + """
const [path, timeoutMs] = arguments; const done = arguments[arguments.length - 1];
const sleep = (ms) => new Promise(r => setTimeout(r, ms));
(async () => {
  const t0 = Date.now();
  const wait = async (what, test) => {
    while (!test()) {
      if (Date.now() - t0 > timeoutMs) throw new Error('timed out waiting for ' + what);
      await sleep(100);
    }
  };
  await wait('window.jupyterapp', () => window.jupyterapp);
  const app = window.jupyterapp;
  await app.started; await app.restored;
  await wait('the notebook tab', () => findPanel(path));
  const panel = findPanel(path);
  await panel.context.ready; await panel.sessionContext.ready;
  await wait('a kernel', () => panel.sessionContext.session && panel.sessionContext.session.kernel);
  const kernel = panel.sessionContext.session.kernel;
  await wait('the kernel to be idle', () => kernel.status === 'idle');
  app.shell.collapseLeft();  // the notebook gets the whole width (and the screenshot)
  app.shell.activateById(panel.id);
  await app.commands.execute('notebook:clear-all-cell-outputs');
  window.__browserCheckRun = {done: false};
  app.commands.execute('notebook:run-all-cells').then(
    (ok) => { window.__browserCheckRun = {done: true, ok: ok}; },
    (err) => { window.__browserCheckRun = {done: true, ok: false, error: String(err)}; });
  return {kernel: kernel.name};
})().then(r => done({ok: true, ...r}), e => done({ok: false, error: String(e)}));
"""

JS_STATE = JS_PANEL + """
const panel = findPanel(arguments[0]);
if (!panel) return {error: 'notebook tab is gone'};
const session = panel.sessionContext.session;
const cells = panel.content.widgets.filter(c => c.model.type === 'code');
const pending = cells.filter(c => (c.model.executionState === 'running') ||
  /\\[\\*\\]/.test((c.node.querySelector('.jp-InputPrompt') || {}).textContent || '')).length;
return {run: window.__browserCheckRun || {done: false},
        status: session && session.kernel ? session.kernel.status : 'none', pending: pending,
        executed: cells.filter(c => c.model.executionCount !== null).length, code: cells.length};
"""

JS_INSPECT = JS_PANEL + """
const panel = findPanel(arguments[0]);
const WIDGET = 'application/vnd.jupyter.widget-view+json';
const BAD_WIDGET_TEXT = /Loading widget|Error displaying widget|Failed to load model class|model not found/i;
const ERROR_VIEW = '.jupyter-widgets-error-widget';  // ipywidgets' red "Click to show javascript error." box
const text = (el) => (el ? el.textContent || '' : '').replace(/\\s+/g, ' ').trim().slice(0, 300);
const report = {cells: [], images: 0};
panel.content.widgets.forEach((cell, index) => {
  if (cell.model.type !== 'code') return;
  const source = cell.model.sharedModel.getSource();
  const outputs = cell.model.outputs.toJSON();
  // cell.outputArea.widgets holds one child per model output, in order: pair them up
  const children = cell.outputArea.widgets.map(w => w.node.querySelector('.jp-OutputArea-output') || w.node);
  const errors = outputs.filter(o => o.output_type === 'error').map(o =>
    ({ename: o.ename, evalue: o.evalue, traceback: (o.traceback || []).join('\\n')}));
  const domErrors = children.filter(o => o.matches('[data-mime-type="application/vnd.jupyter.error"]') ||
    o.querySelector('[data-mime-type="application/vnd.jupyter.error"]')).map(text);
  // JupyterLab renders tracebacks with the stderr mime type too: keep the stream outputs only
  const stderr = children.filter((o, i) => outputs[i] && outputs[i].output_type === 'stream' &&
    outputs[i].name === 'stderr').map(text);
  const widgets = [];
  outputs.forEach((o, i) => {
    if (!(o.data && o.data[WIDGET])) return;
    const el = children[i];
    widgets.push({live: !!(el && el.querySelector('.jupyter-widgets') && !el.querySelector(ERROR_VIEW)) &&
                        !BAD_WIDGET_TEXT.test(text(el)),
                  text: el ? text(el) : '(no output element)'});
  });
  const badWidgetText = Array.from(cell.node.querySelectorAll('.jp-OutputArea-output'))
    .filter(o => o.querySelector(ERROR_VIEW) || BAD_WIDGET_TEXT.test(text(o))).map(text);
  const figureText = Array.from(cell.node.querySelectorAll('.jp-OutputArea-output')).map(text)
    .filter(t => /^<Figure size [^>]*>$/.test(t));
  const images = Array.from(cell.node.querySelectorAll('.jp-OutputArea-output img'))
    .filter(img => img.complete && img.naturalWidth > 0).length;
  report.images += images;
  report.cells.push({index: index, executed: cell.model.executionCount !== null, empty: !source.trim(),
    head: source.trim().split('\\n')[0].slice(0, 80), errors: errors, domErrors: domErrors, stderr: stderr,
    widgets: widgets, badWidgetText: badWidgetText, figureText: figureText, images: images});
});
return report;
"""

# A fingerprint of everything the kernel can change in the outputs: text (slider read-outs excluded,
# the browser changes those by itself) and images (hashed).
JS_SIGNATURE = JS_PANEL + """
const panel = findPanel(arguments[0]);
const hash = (s) => {
  let h = 5381;
  for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0;
  return h;
};
let sig = '';
panel.content.node.querySelectorAll('.jp-Cell-outputArea').forEach(area => {
  const walk = document.createTreeWalker(area, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    if (n.nodeType === 1) {
      if (n.tagName === 'IMG') sig += '[img ' + hash(n.src) + ']';
      if (n.tagName === 'TEXTAREA') sig += '[textarea ' + n.value + ']';  // ipywidgets Textarea logs
    }
    else if (!n.parentElement.closest('.widget-readout')) sig += n.nodeValue;
  }
});
return {sig: sig, status: panel.sessionContext.session.kernel.status};
"""

# The notebook scrolls inside .jp-WindowedPanel-outer: grow the window by what is hidden, scroll to the top.
JS_HEIGHT = JS_PANEL + """
const panel = findPanel(arguments[0]);
const outer = panel.content.node.querySelector('.jp-WindowedPanel-outer') || panel.content.node;
outer.scrollTop = 0;
const cells = panel.content.widgets;
if (!cells.length) return window.innerHeight;
// the last cell's bottom, not scrollHeight: "scroll past end" pads the notebook by a viewport's height
const bottom = cells[cells.length - 1].node.getBoundingClientRect().bottom - outer.getBoundingClientRect().top;
return window.innerHeight - outer.clientHeight + bottom + 150;
"""

JS_CLEAN = """
if (window.jupyterapp) Array.from(window.jupyterapp.shell.widgets('main')).forEach(w => {
  if (w.context && w.context.model) w.context.model.dirty = false; });
"""

# First interactive control inside a rendered widget, in document order.
CONTROLS = ", ".join(".jp-OutputArea-output " + sel for sel in (
    ".widget-slider .noUi-handle", ".widget-dropdown select", ".widget-toggle-buttons button",
    ".widget-checkbox input", "button.widget-button", ".widget-text input", ".widget-radio-box input"))


# --------------------------------------------------------------------------------------------------
# One notebook


def _wait_for_run(driver, rel: str, deadline: float) -> dict:
    """Poll until run-all has finished and the kernel is idle with no cell pending; return the state."""
    stable = 0
    state = {}
    while time.monotonic() < deadline:
        state = driver.execute_script(JS_STATE, rel)
        if state.get("error"):
            return state
        finished = state["run"]["done"] and state["status"] == "idle" and state["pending"] == 0
        stable = stable + 1 if finished else 0
        if stable >= 2:
            return state
        time.sleep(0.5)
    state["timed_out"] = True
    return state


def _inspect(driver, rel: str, result: Result, timed_out: bool = False) -> dict:
    report = driver.execute_script(JS_INSPECT, rel)
    not_run = [c for c in report["cells"] if not c["executed"] and not c["empty"]]
    if not_run and not timed_out:  # after a timeout the pending cells are already reported
        result.failures.append(f"{len(not_run)} code cell(s) never ran, first: cell {not_run[0]['index']} "
                               f"`{not_run[0]['head']}`")
    for c in report["cells"]:
        where = f"cell {c['index']} `{c['head']}`"
        for err in c["errors"]:
            last = [line for line in _strip_ansi(err["traceback"]).splitlines() if line.strip()][-3:]
            result.failures.append(f"{where}: {err['ename']}: {err['evalue']}\n      " + "\n      ".join(last))
        if c["domErrors"] and not c["errors"]:
            result.failures.append(f"{where}: error output shown: {c['domErrors'][0][:200]}")
        for text in c["figureText"]:
            result.failures.append(f"{where}: a figure shown as text instead of an image: {text[:120]!r}")
        dead = [w for w in c["widgets"] if not w["live"]]
        for w in dead:
            result.failures.append(f"{where}: widget output is not a live widget (is "
                                   f"@jupyter-widgets/jupyterlab-manager installed?), it shows: {w['text'][:160]!r}")
        for text in c["badWidgetText"]:
            if not any(text == w["text"] for w in dead):
                result.failures.append(f"{where}: widget error text: {text[:160]!r}")
        for text in c["stderr"]:
            result.notes.append(f"stderr in {where}: {text[:160]}")
    if report["images"] == 0:
        result.failures.append("no rendered plot image in any output")
    return report


def _strip_ansi(text: str) -> str:
    import re

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
    before = driver.execute_script(JS_SIGNATURE, rel)["sig"]
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
            result.notes.append("first widget is a dropdown with a single option (nothing to change)")
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
        now = driver.execute_script(JS_SIGNATURE, rel)
        if now["sig"] != before and now["status"] == "idle":
            result.notes.append(f"first widget answered: {action}")
            return
    result.failures.append(f"first widget did not change any output within {ANSWER_TIMEOUT:.0f} s of a real input "
                           f"({action})")


def _screenshot(driver, rel: str, path: Path) -> Path | None:
    try:
        # off-screen cells have estimated heights (content-visibility) until shown: grow until it settles
        size = WINDOW[1]
        for _ in range(6):
            want = min(MAX_SCREENSHOT_HEIGHT, max(WINDOW[1], int(driver.execute_script(JS_HEIGHT, rel) or 0)))
            if abs(want - size) < 20:
                break
            size = want
            driver.set_window_size(WINDOW[0], size)
            time.sleep(1.0)
        driver.execute_script(JS_HEIGHT, rel)  # back to the top after the re-layout
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


def check_notebook(driver, lab: Lab, notebook: Path, root: Path, out: Path, timeout: float) -> Result:
    """Open ``notebook`` in JupyterLab, run all cells, check the outputs, poke the first widget, screenshot."""
    rel = notebook.relative_to(root).as_posix()
    out.mkdir(parents=True, exist_ok=True)
    result = Result(notebook.stem)
    start = time.monotonic()
    deadline = start + timeout
    files = [notebook, notebook.with_suffix(".py")]
    before = _fingerprint(files)
    try:
        driver.set_script_timeout(max(10.0, timeout))
        driver.get(f"{lab.url}/lab/tree/{rel}?reset&token={lab.token}")
        opened = driver.execute_async_script(JS_OPEN, rel, int(timeout * 1000))
        if not opened["ok"]:
            result.failures.append(f"could not open and run the notebook: {opened['error']}")
            return result
        state = _wait_for_run(driver, rel, deadline)
        if state.get("timed_out"):
            result.failures.append(f"run-all did not finish in {timeout:.0f} s (kernel {state.get('status')}, "
                                   f"{state.get('pending')} cell(s) pending, {state.get('executed')}/"
                                   f"{state.get('code')} executed)")
        elif state.get("error"):
            result.failures.append(state["error"])
        elif state["run"].get("error"):
            result.failures.append(f"notebook:run-all-cells failed: {state['run']['error']}")
        _inspect(driver, rel, result, timed_out=bool(state.get("timed_out")))
        if not state.get("timed_out"):
            _poke_first_widget(driver, rel, deadline, result)
    except CheckTimeout:
        result.failures.append("overall timeout reached during this notebook")
        raise
    except Exception as exc:  # noqa: BLE001 - report, keep checking the other notebooks
        result.failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        result.seconds = time.monotonic() - start
        result.screenshot = _screenshot(driver, rel, out / f"{notebook.stem}.png")
        try:
            driver.execute_script(JS_CLEAN)
            lab.shutdown_kernels()
        except Exception:  # noqa: BLE001
            pass
        saved = f"Saving file at /{rel}" in lab.log.read_text(errors="replace")
        if saved:
            result.failures.append(f"JupyterLab saved {rel} during the check (restore it with git)")
        changed = [p.name for p, stamp in _fingerprint(files).items() if before.get(p) != stamp]
        if changed and not saved:
            result.notes.append(f"{', '.join(changed)} changed on disk during the check (not saved by JupyterLab: "
                                "someone edited or re-executed it; the check ran the version it opened)")
    if result.seconds > timeout:
        result.failures.append(f"took {result.seconds:.0f} s, over the {timeout:.0f} s budget")
    return result


# --------------------------------------------------------------------------------------------------
# Driver


@contextmanager
def browser_session(root: Path):
    """One JupyterLab serving ``root`` and one headless Chromium; yields ``(lab, driver)``; stops both."""
    tmp = Path(tempfile.mkdtemp(prefix="browser-check-"))
    try:
        with jupyter_lab(root, tmp) as lab, chromium(tmp) as driver:
            driver.set_window_size(*WINDOW)
            yield lab, driver
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_checks(notebooks: list[Path], out: Path, chapter_timeout: float = 60.0,
               overall_timeout: float | None = None, echo=print) -> list[Result]:
    """Check ``notebooks`` in one JupyterLab + one browser; both stopped on every path."""
    out.mkdir(parents=True, exist_ok=True)
    root = serving_root(notebooks)
    overall = overall_timeout or 120 + len(notebooks) * (chapter_timeout + 30)
    results: list[Result] = []

    def on_alarm(signum, frame):
        raise CheckTimeout(f"overall timeout of {overall:.0f} s reached")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(overall))
    try:
        with browser_session(root) as (lab, driver):
            for notebook in notebooks:
                result = check_notebook(driver, lab, notebook, root, out, chapter_timeout)
                results.append(result)
                echo(f"{'PASS' if result.ok else 'FAIL'} {result.notebook} ({result.seconds:.1f} s)")
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
    parser.add_argument("chapters", nargs="*", help="chapter numbers, names or .ipynb paths (default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "browser", help="folder for the PNG screenshots")
    parser.add_argument("--chapter-timeout", type=float, default=60.0, help="seconds per notebook (default 60)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="overall seconds (default: 120 + (chapter timeout + 30) per notebook)")
    args = parser.parse_args(argv)
    notebooks = find_notebooks(args.chapters)
    if not notebooks:
        print("no chapter notebooks found (chapters/NN_*.ipynb)")
        return 1
    t0 = time.monotonic()
    try:
        results = run_checks(notebooks, args.out, args.chapter_timeout, args.timeout)
    except (CheckTimeout, RuntimeError) as exc:
        print(f"browser check aborted: {exc}")
        return 1
    failed = [r for r in results if not r.ok]
    print(f"\nbrowser check: {len(results) - len(failed)}/{len(results)} notebooks passed in "
          f"{time.monotonic() - t0:.0f} s; screenshots in {args.out}")
    for r in failed:
        print(f"  {r.notebook}: {len(r.failures)} failure(s); first: {r.failures[0].splitlines()[0]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
