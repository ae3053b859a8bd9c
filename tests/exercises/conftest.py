"""Graded tests import the exercise module chosen by ``--impl`` through the ``impl`` fixture.

A learner's syntax error or missing function fails only the tests that use that module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture
def impl(pytestconfig):
    """``impl("ex02_allocator")`` returns ``solutions.ex02_allocator`` or ``exercises.ex02_allocator``."""
    package = pytestconfig.getoption("--impl")

    def load(name: str):
        if package not in (
            "solutions",
            "exercises",
        ):  # a folder of planted wrong answers (course mutants)
            path = Path(package) / f"{name}.py"
            module_name = f"_impl_{abs(hash((str(path.resolve()), path.stat().st_mtime_ns)))}_{name}"  # edits reload
            if module_name not in sys.modules:
                spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
            return sys.modules[module_name]
        module_name = f"{package}.{name}"
        if module_name in sys.modules:
            return sys.modules[module_name]
        return importlib.import_module(module_name)

    return load
