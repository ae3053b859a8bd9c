"""``python -m paged course``: a help that lists every subcommand, and the exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from paged_course.tools import course


@pytest.mark.parametrize("argv", [[], ["-h"], ["--help"]])
def test_bare_and_help_list_every_subcommand_and_exit_0(argv, capsys):
    assert course.main(argv) == 0
    out = capsys.readouterr().out
    for name in course.ACTIONS:
        line = next((row for row in out.splitlines() if row.strip().startswith(name + " ")), None)
        assert line is not None and len(line.split()) > 3, f"no help line for {name!r} in:\n{out}"
    assert "--help" in out, "the help says how to get one command's options"


def test_unknown_subcommand_exits_2_with_the_help(capsys):
    assert course.main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown course command 'bogus'" in err and "sync" in err and "mutants" in err


def test_help_from_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "paged", "course", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "commands:" in done.stdout, done.stdout + done.stderr
