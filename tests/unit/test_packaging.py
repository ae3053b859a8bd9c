"""pyproject.toml is the only package list; environment.yml must agree with it, and `kernels/` is `paged.kernels`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11 (the course's environment.yml pins 3.11)
yaml = pytest.importorskip("yaml")


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _pip_lines(env: dict) -> list[str]:
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def test_environment_pins_python_and_installs_the_project_with_its_extras(env, pyproject):
    deps = env["dependencies"]
    assert "python=3.11" in deps and "pip" in deps, deps
    pip = _pip_lines(env)
    assert "torch==2.13.0" in pip, "environment.yml installs the torch the course is tested with"
    editable = [line for line in pip if line.startswith("-e")]
    assert editable == ["-e .[notebooks,dev]"], "the package list comes from pyproject.toml only"
    extras = pyproject["project"]["optional-dependencies"]
    assert {"notebooks", "dev"} <= set(extras), "the extras environment.yml asks for exist"
    names = {re.split(r"[<>=!~; \[]", line, maxsplit=1)[0].lower() for line in pip if not line.startswith("-")}
    assert names == {"torch"}, f"environment.yml lists packages of its own (keep them in pyproject): {names}"


def test_pyproject_torch_and_triton(pyproject):
    from packaging.requirements import Requirement

    reqs = {Requirement(r).name: Requirement(r) for r in pyproject["project"]["dependencies"]}
    assert reqs["torch"].specifier.contains("2.13.0"), "torch==2.13.0 must satisfy pyproject's torch range"
    assert reqs["triton"].marker is not None and "linux" in str(reqs["triton"].marker), \
        "triton has Linux wheels only: it needs an environment marker"
    assert re.search(r"3\.1[01]", pyproject["project"]["requires-python"]) or \
        pyproject["project"]["requires-python"].startswith(">="), "python 3.11 must be allowed"


def test_kernels_folder_is_paged_kernels_only(pyproject):
    setuptools = pyproject["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"paged.kernels": "kernels"}
    assert "paged.kernels" in setuptools["packages"] and "kernels" not in setuptools["packages"], \
        "no top-level import named `kernels` (transformers probes for a different package of that name)"
    probe = ("import importlib.util as u; "  # find_spec does not import paged.kernels (no torch, no triton)
             "print(u.find_spec('kernels') is None, u.find_spec('paged.kernels').origin)")
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True)
    missing, path = out.stdout.split()
    assert missing == "True", "`import kernels` must fail outside the repository"
    assert Path(path).resolve() == (ROOT / "kernels" / "__init__.py").resolve()
