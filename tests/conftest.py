"""Shared test configuration: ``--impl``, device skips, progress bars off, Triton mode.

``--impl {solutions,exercises,DIR}`` picks which copy of the graded exercises ``tests/exercises`` imports
(default ``solutions`` so that the README's test command passes; ``python -m paged grade`` runs the
learner's ``exercises``; a folder of ``exNN_*.py`` files is how ``python -m paged course mutants`` runs
its planted wrong answers). ``PAGED_IMPL`` tells the chapters which parts to build on: the notebooks
nbval runs use the reference (``solutions``) where that folder exists, so their saved outputs compare.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in test output or nbval kernels
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault(
    "PAGED_IMPL",
    "solutions" if (Path(__file__).resolve().parents[1] / "solutions").is_dir() else "exercises",
)

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    HAS_CUDA = False
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        default="solutions",
        help="which exercise implementation the graded tests import: solutions (default), "
        "exercises, or a folder of exNN_*.py files",
    )


def pytest_configure(config):
    impl = config.getoption("--impl")
    if impl not in ("solutions", "exercises") and not Path(impl).is_dir():
        raise pytest.UsageError(
            f"--impl must be solutions, exercises or a folder of exNN_*.py files, got {impl!r}"
        )


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
