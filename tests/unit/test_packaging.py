"""pyproject.toml is the only package list; environment.yml and the README's set-up commands agree with it and with
each other (one torch pin, PyPI by default, PyTorch's CPU index on request); `kernels/` is `paged.kernels`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
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
    names = {
        re.split(r"[<>=!~; \[]", line, maxsplit=1)[0].lower()
        for line in pip
        if not line.startswith("-")
    }
    assert names == {"torch"}, (
        f"environment.yml lists packages of its own (keep them in pyproject): {names}"
    )


def test_environment_leaves_the_torch_build_to_the_command_line(env):
    pip = _pip_lines(env)
    assert [line for line in pip if line.startswith("-") and not line.startswith("-e")] == [], (
        "an index line in environment.yml would give every machine the same torch build (README: CPU-only "
        "Linux sets PIP_EXTRA_INDEX_URL instead)"
    )
    assert (
        f"PIP_EXTRA_INDEX_URL={CPU_INDEX} conda env create -f environment.yml"
        in (ROOT / "environment.yml").read_text()
    ), "the file's comment gives the CPU-only command"


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Set up")
    section = readme[start : readme.index("\n## ", start + 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_readme_setup_commands_agree_with_environment_yml(env):
    commands = _setup_commands()
    pins = {pin for line in commands for pin in re.findall(r"torch==[\w.+]+", line)}
    assert pins == {"torch==2.13.0"} and "torch==2.13.0" in _pip_lines(env), (
        "one torch pin everywhere"
    )
    installs = [c for c in commands if "pip install" in c]
    cpu = [c for c in installs if f"--index-url {CPU_INDEX}" in c]
    default = [c for c in installs if "index-url" not in c]
    assert len(cpu) == len(default) == 1 and len(installs) == 2, installs
    assert "--extra-index-url" not in cpu[0] and cpu[0].count("pip install") == 2, (
        "CPU index for torch only: the course's other packages are not on PyTorch's index"
    )
    for command in installs:
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
        assert command.endswith('-e ".[notebooks,dev]" && python -m paged demo'), command
    conda = [c for c in commands if "conda env create" in c]
    assert conda == [
        f"PIP_EXTRA_INDEX_URL={CPU_INDEX} conda env create -f environment.yml && "
        f"conda activate {env['name']} && python -m paged demo"
    ], conda
    assert {c for c in commands if c.endswith("pytest")} == {
        ". .venv/bin/activate && pytest",
        f"conda activate {env['name']} && pytest",
    }, "the test command, twice"


def test_pyproject_torch_and_triton(pyproject):
    from packaging.requirements import Requirement

    reqs = {Requirement(r).name: Requirement(r) for r in pyproject["project"]["dependencies"]}
    assert reqs["torch"].specifier.contains("2.13.0"), (
        "torch==2.13.0 must satisfy pyproject's torch range"
    )
    assert reqs["triton"].marker is not None and "linux" in str(reqs["triton"].marker), (
        "triton has Linux wheels only: it needs an environment marker"
    )
    assert re.search(r"3\.1[01]", pyproject["project"]["requires-python"]) or pyproject["project"][
        "requires-python"
    ].startswith(">="), "python 3.11 must be allowed"


def test_kernels_folder_is_paged_kernels_only(pyproject):
    setuptools = pyproject["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"paged.kernels": "kernels"}
    assert "paged.kernels" in setuptools["packages"] and "kernels" not in setuptools["packages"], (
        "no top-level import named `kernels` (transformers probes for a different package of that name)"
    )
    probe = (
        "import importlib.util as u; "  # find_spec does not import paged.kernels (no torch, no triton)
        "print(u.find_spec('kernels') is None, u.find_spec('paged.kernels').origin)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True
    )
    missing, path = out.stdout.split()
    assert missing == "True", "`import kernels` must fail outside the repository"
    assert Path(path).resolve() == (ROOT / "kernels" / "__init__.py").resolve()
