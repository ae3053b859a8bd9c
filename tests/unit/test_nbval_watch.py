"""nbval under paged_course/publish/nbval_watch.py: a stalled chapter is restarted once, a second stall fails.

Each test runs pytest in a subprocess on a small notebook with a short ``--kernel-silence``: a cell
whose kernel sleeps silently the first time (restarted, the earlier cells re-run, then it passes), and
a kernel (tests/unit/planted_stall_kernel.py) that never answers nbval's post-start ``kernel_info``
(reported, restarted, then failed naming the chapter and the phase).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

HERE = Path(__file__).resolve().parent
SILENCE = os.environ.get("PAGED_PLANTED_STALL_SILENCE", "5")


def _pytest(
    tmp_path: Path, notebook: Path, *args: str
) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider"]
    cmd += ["-p", "paged_course.publish.nbval_watch", "--nbval-lax", "--kernel-silence", SILENCE]
    cmd += [*args, str(notebook)]
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path))
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    return out, time.monotonic() - start


@pytest.mark.slow
def test_a_cell_that_goes_silent_restarts_its_chapter_once_then_passes(tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "from pathlib import Path\nruns = Path('runs.txt')\n"
                "runs.write_text(runs.read_text() + 'x' if runs.exists() else 'x')"
            ),
            nbformat.v4.new_code_cell(
                "import time\nif runs.read_text() == 'x':\n    time.sleep(120)  # silent and idle\n"
                "print('second run:', runs.read_text())"
            ),
        ]
    )
    path = tmp_path / "98_silent_cell.ipynb"
    nbformat.write(nb, path)
    out, took = _pytest(tmp_path, path, "--nbval-current-env")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "98_silent_cell: the kernel stalled in Cell 1" in text, text
    assert "restarting 98_silent_cell once from the top" in text, text
    assert (tmp_path / "runs.txt").read_text() == "xx"
    assert not list(tmp_path.glob("kernel-ipc*"))
    assert took < 70, took
    lost = next(line for line in text.splitlines() if line.startswith("98_silent_cell: "))
    assert "lost to a stall, not charged" in lost, (
        f"the stalled wait and the replay are listed apart from the chapter's time: {lost!r}"
    )


@pytest.mark.slow
def test_a_kernel_that_never_answers_kernel_info_fails_naming_chapter_and_phase(tmp_path):
    spec = tmp_path / "kernels" / "planted-stall"
    spec.mkdir(parents=True)
    argv = [sys.executable, str(HERE / "planted_stall_kernel.py"), "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "planted"}))
    path = tmp_path / "99_planted.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), path)
    out, took = _pytest(tmp_path, path, "--nbval-kernel-name", "planted-stall")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "99_planted: the kernel stalled in post-start kernel_info" in text, text
    assert "restarting 99_planted once from the top" in text, text
    assert "99_planted (stalled again after 1 restart): the kernel stalled in post-start" in text
    assert took < 70, took
