"""Run a notebook in a Jupyter kernel without ever waiting in silence: a stalled kernel is found in seconds.

A notebook executor waits on the kernel in several places: the start-up handshake, the ``kernel_info``
request nbclient sends after it (``NotebookClient.async_execute`` waits for that reply with the whole
cell timeout), every cell, and the shutdown. If the client stops hearing a live kernel, each of those
waits lasts its full timeout (600 s per chapter here). This module bounds them all by one rule:

* the kernel is **heard** when a shell or iopub message arrives from it;
* the kernel is **working** when its processes' CPU time (user + system, children included) advances by
  at least ``busy_fraction`` of the silence window: a long computation that prints nothing is not a stall;
* ``silence`` seconds (default 60) neither heard nor working is a **stall**: the run is stopped, the
  kernel killed, and :class:`KernelStall` names the notebook and the phase it stalled in
  (``kernel start``, ``post-start kernel_info``, ``cell N``, ``shutdown``).

:func:`run_notebook` restarts a stalled notebook once from the top, with one line saying so, and raises
:class:`KernelStall` on a second stall. The kernel talks to the client over the ``ipc`` transport (Unix
sockets; on POSIX systems) in a private temporary folder that is removed afterwards (``transport="tcp"``
gives Jupyter's default, loopback TCP ports). ``docs/notebook_stalls.md`` has the measurements behind these choices.

CPU time comes from ``psutil`` when it is installed (ipykernel depends on it), else from ``/proc``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SILENCE = 60.0  # seconds with no message from a kernel that is not computing, then it is stalled
BUSY_FRACTION = (
    0.1  # a kernel using >= 10% of one core over the silence window is working, not stalled
)
PHASES = ("kernel start", "post-start kernel_info", "cell", "shutdown")
TRANSPORT = (
    "ipc" if os.name == "posix" else "tcp"
)  # Unix sockets; Windows keeps Jupyter's loopback TCP


class KernelStall(RuntimeError):
    """A kernel neither sent a message nor used CPU for ``silence`` seconds.

    ``notebook``: the notebook's name; ``phase``: one of :data:`PHASES` (cells as ``cell N``, N the cell's
    index in the notebook); ``silence``: the window in seconds; ``cpu``: the kernel's CPU seconds in it.
    """

    def __init__(self, notebook: str, phase: str, silence: float, cpu: float | None = None):
        self.notebook, self.phase, self.silence, self.cpu = notebook, phase, silence, cpu
        used = "" if cpu is None else f", {cpu:.2f} s of kernel CPU"
        super().__init__(
            f"{notebook}: the kernel stalled in {phase} ({silence:.0f} s with no shell or iopub message"
            f"{used})"
        )


# --------------------------------------------------------------------------------------------------
# Liveness of a kernel process


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its live descendants; ``None`` when it is gone."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - ipykernel installs psutil
        psutil = None
    if psutil is not None:
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
        return total
    return _proc_cpu_seconds(pid)  # pragma: no cover


def _proc_cpu_seconds(pid: int) -> float | None:
    """``/proc/PID/stat`` fields utime + stime (+ waited-for children's), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(f) for f in fields[11:15]) / ticks  # utime, stime, cutime, cstime


@dataclass
class Watch:
    """When a kernel was last heard from, and whether its CPU time advances; decides what is a stall.

    ``pid``: the kernel process (set once it is started); ``silence``: seconds; ``busy_fraction``: the
    share of one core over the window that counts as working; ``clock``/``cpu``: injectable for tests.
    """

    silence: float = SILENCE
    busy_fraction: float = BUSY_FRACTION
    pid: int | None = None
    phase: str = "kernel start"
    clock: Callable[[], float] = time.monotonic
    cpu: Callable[[int], float | None] = process_cpu_seconds
    last_heard: float = field(default=0.0)
    samples: deque = field(default_factory=deque)

    def __post_init__(self):
        self.last_heard = self.clock()

    def heard(self) -> None:
        self.last_heard = self.clock()

    def enter(self, phase: str) -> None:
        """A new phase starts its silence clock afresh (its first message may take a while)."""
        self.phase = phase
        self.heard()

    def quiet_for(self) -> float:
        return self.clock() - self.last_heard

    def check(self) -> tuple[bool, float | None]:
        """Sample the CPU; ``(stalled, cpu seconds used over the window)``. Call about once a second."""
        now = self.clock()
        used = None
        if self.pid is not None:
            cpu = self.cpu(self.pid)
            if cpu is not None:
                self.samples.append((now, cpu))
                while len(self.samples) > 1 and self.samples[1][0] <= now - self.silence:
                    self.samples.popleft()
                used = cpu - self.samples[0][1]
        if now - self.last_heard < self.silence:
            return False, used
        if used is not None and now - self.samples[0][0] >= self.silence * 0.9:
            if used >= self.busy_fraction * self.silence:
                return False, used  # computing without printing: alive and working
        elif used is not None:
            return False, used  # not a full window of CPU samples yet
        return True, used


# --------------------------------------------------------------------------------------------------
# nbclient with a watchdog


def _client_class():
    from jupyter_client.asynchronous import AsyncKernelClient

    class WatchedKernelClient(AsyncKernelClient):
        """Tells its :class:`Watch` whenever a shell or iopub message arrives."""

        watch: Watch | None = None

        def start_channels(self, *args, **kwargs):
            super().start_channels(*args, **kwargs)
            for channel in (self.shell_channel, self.iopub_channel):
                channel.get_msg = self._heard(channel.get_msg)

        def _heard(self, get_msg):
            async def get_msg_heard(*args, **kwargs):
                msg = await get_msg(*args, **kwargs)
                if self.watch is not None:
                    self.watch.heard()
                return msg

            return get_msg_heard

    return WatchedKernelClient


def _notebook_client_class():
    from nbclient import NotebookClient

    class WatchedNotebookClient(NotebookClient):
        """``NotebookClient`` that reports its phase to a :class:`Watch` and can use the ipc transport."""

        def __init__(self, nb, watch: Watch, transport: str = TRANSPORT, **kwargs):
            super().__init__(nb, **kwargs)
            self.watch = watch
            self.transport = transport
            self.socket_dir: Path | None = None

        def create_kernel_manager(self):
            km = super().create_kernel_manager()
            km.client_factory = _client_class()
            if self.transport == "ipc":
                self.socket_dir = Path(tempfile.mkdtemp(prefix="paged-kernel-"))
                km.transport = "ipc"
                km.connection_file = str(self.socket_dir / "kernel.json")
                km.ip = str(self.socket_dir / "kernel-ipc")
            return km

        async def async_start_new_kernel(self, **kwargs):
            self.watch.enter("kernel start")
            await super().async_start_new_kernel(**kwargs)
            process = getattr(getattr(self.km, "provisioner", None), "process", None)
            self.watch.pid = getattr(process, "pid", None)

        async def async_start_new_kernel_client(self):
            original = self.km.client

            def client(**kwargs):
                kc = original(**kwargs)
                kc.watch = self.watch
                return kc

            self.km.client = client
            try:
                kc = await super().async_start_new_kernel_client()
            except RuntimeError as exc:  # wait_for_ready gave up (startup_timeout)
                raise KernelStall(self.nb_name, "kernel start", self.startup_timeout) from exc
            self.watch.enter("post-start kernel_info")
            return kc

        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            if cell.cell_type == "code" and cell.source.strip():
                self.watch.enter(f"cell {cell_index}")
            return await super().async_execute_cell(cell, cell_index, *args, **kwargs)

        async def _async_cleanup_kernel(self):
            self.watch.enter("shutdown")
            try:
                await super()._async_cleanup_kernel()
            finally:
                if self.socket_dir is not None:
                    shutil.rmtree(self.socket_dir, ignore_errors=True)

        @property
        def nb_name(self) -> str:
            return getattr(self, "_nb_name", "notebook")

    return WatchedNotebookClient


def _kill(pid: int | None) -> None:
    if pid is None:
        return
    try:
        import psutil

        procs = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
        for p in procs:
            p.kill()
    except ImportError:  # pragma: no cover
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    except Exception:  # noqa: BLE001 - already gone
        pass


async def _run_watched(client, watch: Watch, name: str, poll: float) -> None:
    task = asyncio.ensure_future(client.async_execute())
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll)
        if done:
            task.result()  # re-raises the executor's own errors (a failing cell, a dead kernel)
            return
        stalled, used = watch.check()
        if stalled:
            phase, pid = watch.phase, watch.pid
            task.cancel()
            try:
                await asyncio.wait_for(task, timeout=15)
            except (asyncio.CancelledError, asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass
            _kill(pid)
            if client.socket_dir is not None:
                shutil.rmtree(client.socket_dir, ignore_errors=True)
            raise KernelStall(name, phase, watch.silence, used)


def execute_once(
    nb,
    name: str,
    *,
    cwd: str | Path | None = None,
    timeout: int = 600,
    kernel_name: str = "python3",
    silence: float = SILENCE,
    transport: str = TRANSPORT,
    poll: float = 1.0,
    watch: Watch | None = None,
):
    """Execute ``nb`` (an ``nbformat`` notebook, outputs written into it) once; return the :class:`Watch`.

    ``timeout``: nbclient's per-cell limit in seconds (a kernel computing that long still fails);
    ``silence``: seconds without a message from a kernel that is not computing, then :class:`KernelStall`
    (``ValueError`` when not positive). Cell errors raise ``nbclient.exceptions.CellExecutionError``.
    """
    if not silence > 0:
        raise ValueError(f"silence must be a positive number of seconds, got {silence}")
    if transport not in ("ipc", "tcp"):
        raise ValueError(f"transport must be 'ipc' or 'tcp', got {transport!r}")
    watch = watch or Watch(silence=silence)
    resources = {"metadata": {"path": str(cwd)}} if cwd is not None else {}
    client = _notebook_client_class()(
        nb,
        watch,
        transport=transport,
        timeout=timeout,
        startup_timeout=int(max(silence, 1)),
        kernel_name=kernel_name,
        resources=resources,
    )
    client._nb_name = name
    asyncio.run(_run_watched(client, watch, name, poll))
    return watch


def run_notebook(
    nb,
    name: str,
    *,
    retries: int = 1,
    echo: Callable[[str], None] = print,
    **kwargs,
):
    """:func:`execute_once`, restarting the notebook from the top (a fresh copy of ``nb``) up to ``retries``
    times after a :class:`KernelStall`, with one line each; returns the executed notebook. A stall after
    the last retry re-raises, naming the notebook and the phase."""
    import copy

    for attempt in range(retries + 1):
        run = copy.deepcopy(nb)
        try:
            execute_once(run, name, **kwargs)
            return run
        except KernelStall as stall:
            if attempt == retries:
                if retries:
                    raise KernelStall(
                        f"{name} (stalled again after {retries} restart(s))",
                        stall.phase,
                        stall.silence,
                        stall.cpu,
                    ) from stall
                raise
            echo(f"{stall}; restarting {name} once from the top")
    raise AssertionError("unreachable")  # pragma: no cover
