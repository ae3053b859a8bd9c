"""JupyterLab and headless Chromium for ``scripts/browser_check.py``: started together, always stopped.

``browser_session(root)`` runs ``python -m jupyterlab`` (this interpreter's) serving ``root`` on a free
loopback port with a random token and throwaway config, runtime, settings, workspace and checkpoint
folders, and Debian's ``chromium`` under ``chromedriver`` (Selenium), headless with background
networking off. Both run in their own process groups; leaving the ``with`` block (normally, on an
exception or on SIGALRM) kills the groups and any kernel the server left behind.
"""

from __future__ import annotations

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
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
CHROME_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
    "--hide-scrollbars",
]
WINDOW = (1280, 900)

# JupyterLab user settings for the throwaway settings folder: never write the notebook (autosave off),
# start the default kernel without a dialog when a notebook names none, no news/update toasts.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


# --------------------------------------------------------------------------------------------------
# Processes


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


def kernel_pids(tmp: Path) -> list[int]:
    """Kernels of this server: ipykernel processes whose connection file is in ``tmp``."""
    pids = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "ipykernel" in cmdline and str(tmp) in cmdline:
            pids.append(int(proc_dir.name))
    return pids


def kernel_cpu_seconds(tmp: Path) -> float:
    """CPU seconds (user + system, children included) of this server's live kernels: the watchdog's sign of work."""
    from paged_course.publish.kernel_watch import process_cpu_seconds

    return sum(process_cpu_seconds(pid) or 0.0 for pid in kernel_pids(tmp))


def kill_kernels_of(tmp: Path) -> None:
    """SIGKILL kernels left by this server (kernels run in their own session; their connection file is in ``tmp``)."""
    for pid in kernel_pids(tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def server_env(tmp: Path) -> dict[str, str]:
    """The server's (and so the kernels') environment: throwaway Jupyter folders, CPU-friendly defaults."""
    env = dict(os.environ)
    for var in (
        "JUPYTER_CONFIG_DIR",
        "JUPYTER_RUNTIME_DIR",
        "JUPYTERLAB_SETTINGS_DIR",
        "JUPYTERLAB_WORKSPACES_DIR",
    ):
        folder = tmp / var.lower()
        folder.mkdir()
        env[var] = str(folder)
    for rel, settings in LAB_SETTINGS.items():
        path = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    # no language-server extension: it would write .virtual_documents/ into the served folder
    (Path(env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_lsp": False}}})
    )
    env.pop("MPLBACKEND", None)  # the learner's default (inline), whatever the CI shell sets
    env.pop("PAGED_IMPL", None)  # a learner never sets it: the kernels build on exercises/
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
        req = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
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
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # JupyterLab makes a checkpoint copy when it opens a notebook: keep it out of the repository
        f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}",
    ]
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=server_env(tmp),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, log)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with code {proc.returncode}:\n{lab.log_tail()}"
                )
            try:
                lab.api("GET", "/api/status")
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"jupyter lab did not answer in {start_timeout:.0f} s:\n{lab.log_tail()}"
                    ) from None
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
            raise RuntimeError(
                f"{exe} not found: install it with `apt-get install chromium chromium-driver`"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp / 'chromium-profile'}")
    options.unhandled_prompt_behavior = "accept"  # a "leave page?" prompt must never block the run
    service = Service(
        CHROMEDRIVER, log_output=str(tmp / "chromedriver.log"), popen_kw={"start_new_session": True}
    )
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            if service.process is not None:
                kill_group(service.process, grace=2.0)


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
