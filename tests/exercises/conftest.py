"""Graded tests import the exercise module chosen by ``--impl`` through the ``impl`` fixture.

A learner's syntax error or missing function fails only the tests that use that module.
"""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.fixture
def impl(pytestconfig):
    """``impl("ex02_allocator")`` returns ``solutions.ex02_allocator`` or ``exercises.ex02_allocator``."""
    package = pytestconfig.getoption("--impl")

    def load(name: str):
        module_name = f"{package}.{name}"
        if module_name in sys.modules:
            return sys.modules[module_name]
        return importlib.import_module(module_name)

    return load
