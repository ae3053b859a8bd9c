"""The notebook watchdog (paged_course/publish/kernel_watch.py): what counts as a stall, and a planted one caught.

The fast tests drive :class:`Watch` with a fake clock and fake CPU readings. The slow one starts a real
kernel process from a kernel spec (tests/unit/planted_stall_kernel.py) that answers the start-up
handshake and then never answers the post-start ``kernel_info``: the executor must report the stall,
restart the notebook once, and fail naming the notebook and the phase, well within 70 s.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

from paged_course.publish import kernel_watch, runtimes
from paged_course.publish.kernel_watch import KernelStall, Watch

HERE = Path(__file__).resolve().parent
PLANTED_SILENCE = float(os.environ.get("PAGED_PLANTED_STALL_SILENCE", "10"))


class Fake:
    def __init__(self):
        self.now = 0.0
        self.cpu_seconds = 0.0

    def clock(self):
        return self.now

    def cpu(self, pid):
        return self.cpu_seconds


def _watch(fake: Fake, silence: float = 60.0, pid: int | None = 123) -> Watch:
    watch = Watch(silence=silence, pid=pid, clock=fake.clock, cpu=fake.cpu)
    watch.check()  # the first CPU sample, at time 0
    return watch


def _advance(watch: Watch, fake: Fake, seconds: int, cpu_per_second: float = 0.0):
    result = (False, None)
    for _ in range(seconds):
        fake.now += 1.0
        fake.cpu_seconds += cpu_per_second
        result = watch.check()
    return result


def test_idle_kernel_that_sends_nothing_for_the_window_is_a_stall():
    fake = Fake()
    watch = _watch(fake)
    assert _advance(watch, fake, 59, cpu_per_second=0.001) == (False, pytest.approx(0.059))
    stalled, used = _advance(watch, fake, 1, cpu_per_second=0.001)
    assert stalled and used == pytest.approx(0.06)


def test_a_message_restarts_the_silence_clock():
    fake = Fake()
    watch = _watch(fake)
    _advance(watch, fake, 50)
    watch.heard()
    assert _advance(watch, fake, 59)[0] is False
    assert _advance(watch, fake, 1)[0] is True


def test_a_kernel_computing_without_printing_is_working_not_stalled():
    fake = Fake()
    watch = _watch(fake)
    assert _advance(watch, fake, 300, cpu_per_second=0.9)[0] is False  # five silent minutes of work
    stalled, used = _advance(watch, fake, 60, cpu_per_second=0.0)  # then it stops computing
    assert stalled and used == pytest.approx(0.0)


def test_cpu_below_the_busy_fraction_is_idle():
    fake = Fake()
    watch = _watch(fake, silence=60.0)
    stalled, used = _advance(watch, fake, 60, cpu_per_second=0.09)  # 5.4 s < 10% of 60 s
    assert stalled and used == pytest.approx(5.4)


def test_without_a_process_to_sample_silence_alone_decides():
    fake = Fake()
    watch = _watch(fake, silence=5.0, pid=None)
    assert _advance(watch, fake, 4) == (False, None)
    assert _advance(watch, fake, 1) == (True, None)


def test_entering_a_phase_names_it_and_restarts_the_clock():
    fake = Fake()
    watch = _watch(fake, silence=5.0, pid=None)
    _advance(watch, fake, 4)
    watch.enter("cell 3")
    assert watch.phase == "cell 3" and _advance(watch, fake, 4)[0] is False


def test_stall_names_notebook_phase_and_window():
    err = KernelStall("02_block_allocator", "post-start kernel_info", 60.0, 0.04)
    assert str(err) == (
        "02_block_allocator: the kernel stalled in post-start kernel_info (60 s with no shell or "
        "iopub message, 0.04 s of kernel CPU)"
    )


def test_bad_settings_are_named():
    nb = nbformat.v4.new_notebook()
    with pytest.raises(ValueError, match="silence must be a positive number of seconds, got 0"):
        kernel_watch.execute_once(nb, "x", silence=0)
    with pytest.raises(ValueError, match="transport must be 'ipc' or 'tcp', got 'udp'"):
        kernel_watch.execute_once(nb, "x", transport="udp")


def test_proc_cpu_seconds_reads_this_process():
    assert kernel_watch._proc_cpu_seconds(os.getpid()) > 0
    assert kernel_watch.process_cpu_seconds(os.getpid()) > 0
    assert kernel_watch._proc_cpu_seconds(2**22 + 12345) is None


# --------------------------------------------------------------------------------------------------
# Chapter runtimes and their budget


def test_runtimes_record_merges_and_budget_is_three_times_plus_thirty(tmp_path):
    path = tmp_path / "runtimes.json"
    runtimes.record({"02_b": 12.34}, path)
    runtimes.record({"01_a": 10.0}, path)
    data = json.loads(path.read_text())
    assert list(data["seconds"]) == ["01_a", "02_b"] and data["seconds"]["02_b"] == 12.3
    table = runtimes.load(path)
    assert runtimes.budget("01_a", table) == 60.0 and runtimes.budget("09_x", table) is None
    assert runtimes.over_budget({"01_a": 59.9, "02_b": 70.0, "09_x": 999.0}, table) == [
        "02_b took 70.0 s, over its budget of 67 s (3 x its committed 12.3 s + 30 s)"
    ]
    with pytest.raises(ValueError, match="runtimes must be positive seconds"):
        runtimes.record({"01_a": 0.0}, path)


def test_committed_runtimes_cover_every_chapter():
    from paged_course.publish.notebooks import chapter_sources

    table = runtimes.load()
    assert sorted(table) == sorted(p.stem for p in chapter_sources())
    assert all(0 < s < 600 for s in table.values()), table


# --------------------------------------------------------------------------------------------------
# A planted stall, end to end


@pytest.fixture
def planted_kernel(tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / "planted-stall"
    spec.mkdir(parents=True)
    argv = [sys.executable, str(HERE / "planted_stall_kernel.py"), "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "planted stall", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    return "planted-stall"


@pytest.mark.slow
def test_planted_stall_is_reported_restarted_once_and_fails_naming_the_phase(
    planted_kernel, tmp_path
):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    lines = []
    start = time.monotonic()
    with pytest.raises(KernelStall) as info:
        kernel_watch.run_notebook(
            nb,
            "99_planted",
            kernel_name=planted_kernel,
            silence=PLANTED_SILENCE,
            cwd=tmp_path,
            echo=lines.append,
        )
    took = time.monotonic() - start
    assert info.value.phase == "post-start kernel_info"
    assert "99_planted (stalled again after 1 restart(s))" in str(info.value)
    assert len(lines) == 1 and lines[0].startswith(
        "99_planted: the kernel stalled in post-start kernel_info"
    )
    assert lines[0].endswith("restarting 99_planted once from the top")
    assert took < 70, f"the planted stall took {took:.0f} s to report and retry"
    assert not list(Path.cwd().glob("kernel-ipc*")) and not list(tmp_path.glob("kernel-ipc*"))
    print(f"planted stall reported, restarted and failed in {took:.1f} s")


@pytest.mark.slow
def test_course_executor_writes_the_notebook_and_records_its_runtime(tmp_path, monkeypatch):
    from paged_course.publish import notebooks

    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "99_tiny.py"
    source.write_text("# %%\nprint(6 * 7)\n")
    for var in ("TQDM_DISABLE", "PYTHONHASHSEED", "MPLBACKEND", "PAGED_IMPL", "TRITON_INTERPRET"):
        monkeypatch.delenv(var, raising=False)  # the executor sets them; put back after the test
    monkeypatch.setattr(notebooks, "CHAPTERS", tmp_path)
    monkeypatch.setattr(runtimes, "RUNTIMES", tmp_path / "src" / "runtimes.json")
    seconds = notebooks.execute([source])
    executed = nbformat.read(tmp_path / "99_tiny.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert runtimes.load() == {"99_tiny": round(seconds["99_tiny"], 1)}
    assert not list(tmp_path.glob("kernel-ipc*")) and not list(Path.cwd().glob("kernel-ipc*"))
