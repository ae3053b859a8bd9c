"""Notebook checks must not flake on split output streams or stderr warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbval")
nbclient = pytest.importorskip("nbclient")

PRINTS = """import sys, time
for i in range(3):
    print(f"line {i}: {i * 0.5:.2f}")
    sys.stdout.flush()  # three separate stream messages
    time.sleep(0.05)"""
WARNS = """import warnings, sys
warnings.warn("careful: this goes to stderr")
sys.stderr.write("a plain stderr line\\n")
print("after the warning: 42")"""


# A warning's stderr names the cell's temporary file (/tmp/ipykernel_<pid>/<hash>.py), different in every
# kernel: tests/nbval_sanitize.cfg normalizes it (rule "ipykernel cell paths").
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def run_nbval(path: Path, sanitize: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(path),
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--nbval-lax",
        "--nbval-current-env",
        f"--nbval-sanitize-with={sanitize}",
    ]
    return subprocess.run(
        cmd,
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "default"},
    )


@pytest.mark.notebook
def test_split_streams_and_stderr_pass_nbval(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for source in (PRINTS, WARNS):
        nb.cells.append(
            nbformat.v4.new_code_cell(source, metadata={"tags": ["nbval-check-output"]})
        )
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    streams = [o for o in nb.cells[0].outputs if o.output_type == "stream"]
    assert "".join(o.text for o in streams) == "line 0: 0.00\nline 1: 0.50\nline 2: 1.00\n"
    path = tmp_path / "streams.ipynb"
    nbformat.write(nb, path)
    run = run_nbval(path, SANITIZE)
    assert run.returncode == 0, (
        f"nbval failed on split streams / stderr:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    )
    assert "2 passed" in run.stdout, run.stdout[-500:]
