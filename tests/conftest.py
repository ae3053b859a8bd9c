"""Shared test configuration: ``--impl``, device skips, progress bars off, Triton mode.

``--impl {solutions,exercises}`` picks which copy of the graded exercises ``tests/exercises`` imports
(default ``solutions`` so that the README's test command passes; ``python -m paged grade`` runs the
learner's ``exercises``).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in test output or nbval kernels
os.environ.setdefault("PYTHONHASHSEED", "0")

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    HAS_CUDA = False
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported


def pytest_addoption(parser):
    parser.addoption("--impl", choices=["solutions", "exercises"], default="solutions",
                     help="which exercise implementation the graded tests import (default: solutions)")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
