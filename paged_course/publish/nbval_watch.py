"""pytest plugin (``-p paged_course.publish.nbval_watch`` in pyproject's addopts): nbval's kernel waits, bounded.

nbval waits on its kernel with long timeouts (the start-up handshake, its ``kernel_info`` check, each
cell's reply up to ``--nbval-cell-timeout``). This plugin applies ``paged_course.publish.kernel_watch``'s rule to
every one of those waits: a kernel that sends no shell or iopub message for ``--kernel-silence`` seconds
(default 60; ``PAGED_KERNEL_SILENCE`` in the environment) while its CPU time does not advance has
stalled. The chapter is then restarted once from the top (a fresh kernel; the cells before the stalled
one re-run without comparing outputs) with one line saying so; a second stall fails the cell naming the
chapter and the phase. nbval's kernels use the ``ipc`` transport (POSIX) in a private temporary folder.

It also sums each notebook's time (its cells' setup, call and teardown) and lists it after the run next
to the chapter's budget (``paged_course.publish.runtimes``); with ``PAGED_CHAPTER_BUDGET=1`` in the environment
(CI sets it) a chapter over its budget fails the run. A recovered stall's cost (the silent wait and the replay
of the cells before it) is listed and not charged to the budget: the budget measures the chapter's own work.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time
from pathlib import Path
from queue import Empty

import pytest

from paged_course.publish import runtimes
from paged_course.publish.kernel_watch import SILENCE, TRANSPORT, KernelStall, Watch

_times: dict[str, float] = collections.defaultdict(float)
_lost: dict[str, float] = collections.defaultdict(
    float
)  # seconds a recovered stall cost: not charged
_events: list[str] = []
_config = None


def pytest_addoption(parser):
    parser.addoption(
        "--kernel-silence",
        type=float,
        default=float(os.environ.get("PAGED_KERNEL_SILENCE", SILENCE)),
        help="seconds a notebook kernel may send nothing while idle before it counts as stalled "
        f"(default {SILENCE:.0f}, or PAGED_KERNEL_SILENCE)",
    )


def _echo(line: str) -> None:
    _events.append(line)
    reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
    if reporter is not None:
        reporter.write_line(line)


def _stop(kernel) -> None:
    try:
        kernel.stop()
    except Exception:  # noqa: BLE001 - a stalled kernel may not shut down politely; it is killed
        pass


def pytest_configure(config):
    global _config
    _config = config
    try:
        from nbval import kernel as nbk
        from nbval import plugin as nbp
    except ImportError:  # pragma: no cover - nbval is a dev dependency
        return
    if getattr(nbk, "_paged_watched", False):
        return
    nbk._paged_watched = True
    silence = config.getoption("--kernel-silence")

    def start_new_kernel(startup_timeout=60, kernel_name="python", **kwargs):
        """nbval's ``start_new_kernel`` over the ipc transport, sockets in a private folder."""
        folder = Path(tempfile.mkdtemp(prefix="paged-kernel-"))
        sockets = (
            {"transport": "ipc", "ip": str(folder / "kernel-ipc")} if TRANSPORT == "ipc" else {}
        )
        km = nbk.KernelManager(
            kernel_name=kernel_name,
            kernel_spec_manager=nbk.NbvalKernelspecManager(),
            connection_file=str(folder / "kernel.json"),
            **sockets,
        )
        km._paged_socket_dir = folder
        km.start_kernel(**kwargs)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=min(startup_timeout, silence))
        except RuntimeError as exc:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            shutil.rmtree(folder, ignore_errors=True)
            raise KernelStall("notebook", "kernel start", min(startup_timeout, silence)) from exc
        return km, kc

    nbk.start_new_kernel = start_new_kernel
    ensure_iopub_up = nbk.RunningKernel._ensure_iopub_up
    get_message = nbk.RunningKernel.get_message
    stop = nbk.RunningKernel.stop

    def watched_ensure_iopub_up(self):
        self._watch = Watch(silence=silence)
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        self._watch.pid = getattr(process, "pid", None)
        self._watch.enter("post-start kernel_info")
        try:
            ensure_iopub_up(self)
        except (RuntimeError, KernelStall) as exc:
            _stop(self)
            if isinstance(exc, KernelStall):
                raise
            raise KernelStall("notebook", "post-start kernel_info", silence) from exc

    def watched_get_message(self, stream, timeout=None):
        watch = getattr(self, "_watch", None)
        if watch is None:
            return get_message(self, stream, timeout=timeout)
        pending = self.__dict__.setdefault("_pending_iopub", collections.deque())
        if stream == "iopub" and pending:
            return pending.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                msg = get_message(self, stream, timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                # nbval reads iopub only after a cell's reply: take what the kernel said there meanwhile
                while stream == "shell" and self.kc.iopub_channel.msg_ready():
                    pending.append(get_message(self, "iopub", timeout=0))
                    watch.heard()
                stalled, used = watch.check()
                if stalled:
                    raise KernelStall("notebook", watch.phase, watch.silence, used) from None
                continue
            watch.heard()
            return msg

    def watched_stop(self):
        if getattr(self, "_watch", None) is not None:
            self._watch.enter("shutdown")
        folder = getattr(getattr(self, "km", None), "_paged_socket_dir", None)
        try:
            stop(self)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    nbk.RunningKernel._ensure_iopub_up = watched_ensure_iopub_up
    nbk.RunningKernel.get_message = watched_get_message
    nbk.RunningKernel.stop = watched_stop

    file_setup = nbp.IPyNbFile.setup
    cell_runtest = nbp.IPyNbCell.runtest

    def name_of(node) -> str:
        return Path(str(node.fspath)).stem

    def again(name: str, stall: KernelStall) -> KernelStall:
        return KernelStall(
            f"{name} (stalled again after 1 restart)", stall.phase, stall.silence, stall.cpu
        )

    def watched_setup(self):
        start = time.monotonic()
        try:
            file_setup(self)
            return
        except KernelStall as stall:
            if getattr(self, "_paged_restarted", False):
                raise again(name_of(self), stall) from None
            self._paged_restarted = True
            _lost[name_of(self)] += time.monotonic() - start
            _echo(
                f"{str(stall).replace('notebook', name_of(self), 1)}; restarting "
                f"{name_of(self)} once from the top"
            )
        try:
            file_setup(self)
        except KernelStall as stall:
            raise again(name_of(self), stall) from None

    def replay_before(self) -> None:
        """A fresh kernel for this cell's notebook, with the notebook's earlier cells run in it."""
        notebook = self.parent
        if notebook.kernel is not None:
            _stop(notebook.kernel)
        notebook.kernel = None
        watched_setup(notebook)
        kernel = notebook.kernel
        timeout = self.config.option.nbval_cell_timeout
        for item in self.session.items:
            if item.parent is notebook and item.cell_num < self.cell_num:
                if item.options.get("skip"):
                    continue
                kernel._watch.enter(f"Cell {item.cell_num} (re-run)")
                msg_id = kernel.execute_cell_input(item.cell.source, allow_stdin=False)
                kernel.await_reply(msg_id, timeout=timeout)
                kernel.await_idle(msg_id, item.output_timeout)

    def watched_runtest(self):
        kernel = self.parent.kernel
        if kernel is not None and getattr(kernel, "_watch", None) is not None:
            kernel._watch.enter(f"Cell {self.cell_num}")
        start = time.monotonic()
        try:
            return cell_runtest(self)
        except KernelStall as stall:
            name = name_of(self.parent)
            if getattr(self.parent, "_paged_restarted", False):
                raise again(name, stall) from None
            self.parent._paged_restarted = True
            _echo(f"{str(stall).replace('notebook', name, 1)}; restarting {name} once from the top")
        try:
            replay_before(self)  # the stalled wait and the replay of the earlier cells: not charged
            _lost[name_of(self.parent)] += time.monotonic() - start
            self.parent.kernel._watch.enter(f"Cell {self.cell_num}")
            return cell_runtest(self)
        except KernelStall as stall:
            raise again(name_of(self.parent), stall) from None

    nbp.IPyNbFile.setup = watched_setup
    nbp.IPyNbCell.runtest = watched_runtest


def pytest_runtest_logreport(report):
    path, _, rest = report.nodeid.partition("::")
    if path.endswith(".ipynb") and rest.startswith("Cell "):
        _times[Path(path).stem] += report.duration


def _over_budget() -> list[str]:
    if os.environ.get("PAGED_CHAPTER_BUDGET") != "1":
        return []
    return runtimes.over_budget(charged())


def charged() -> dict[str, float]:
    """Each notebook's time without what a recovered stall cost (the stall itself is reported)."""
    return {name: took - _lost.get(name, 0.0) for name, took in _times.items()}


def pytest_sessionfinish(session, exitstatus):
    if _over_budget() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if not _times and not _events:
        return
    terminalreporter.section("notebook kernels")
    table = runtimes.load()
    for name, took in sorted(_times.items()):
        limit = runtimes.budget(name, table)
        budget = f" (budget {limit:.0f} s)" if limit is not None else ""
        lost = (
            f", {_lost[name]:.1f} s of it lost to a stall, not charged" if _lost.get(name) else ""
        )
        terminalreporter.write_line(f"{name}: {took:.1f} s{budget}{lost}")
    for line in _events:
        terminalreporter.write_line(line)
    for line in _over_budget():
        terminalreporter.write_line(f"FAIL: {line}")
