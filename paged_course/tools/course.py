"""Course tooling: ``python -m paged course {sync,notebooks,release,autograder,classroom,mutants} ...``.

These commands read and write course files (solutions/, exercises/, chapters/); the engine in
``paged/`` never imports them. ``python -m paged course`` (or ``-h``, ``--help``) lists them; each takes
``--help`` for its own options.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import import_module

ACTIONS = {
    "sync": (
        "paged_course.publish.sync",
        "write exercises/ from solutions/ (regions become stubs); --check: exit 1 if stale",
    ),
    "notebooks": (
        "paged_course.publish.notebooks",
        "execute the chapter notebooks from chapters/src/ (execute [NN ...]) or check the pairs agree",
    ),
    "release": (
        "paged_course.publish.release",
        "write a student copy of the course: release OUT [--without-solutions] [--hidden-tests DIR]",
    ),
    "autograder": (
        "paged_course.grading.autograder",
        "build a Gradescope autograder bundle: autograder OUT.zip [--hidden-tests DIR]",
    ),
    "classroom": (
        "paged_course.grading.classroom",
        "write .github/classroom/autograding.json from the graded tests' markers; "
        "'classroom plan': points and sizes per chapter",
    ),
    "mutants": (
        "paged_course.grading.mutants",
        "plant wrong answers in a copy of solutions/ and check the graded tests catch each one",
    ),
}


def usage() -> str:
    """The help text: one line per subcommand, marking those this copy of the course does not have."""
    lines = ["usage: python -m paged course COMMAND [options]", "", "commands:"]
    for name, (module, help_) in ACTIONS.items():
        missing = importlib.util.find_spec(module) is None
        lines.append(f"  {name:<11} {help_}" + (" (not in this copy)" if missing else ""))
    lines += ["", "python -m paged course COMMAND --help shows the options of one command."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in ACTIONS:
        print(f"unknown course command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = import_module(ACTIONS[argv[0]][0])
    except ModuleNotFoundError as err:
        if err.name != ACTIONS[argv[0]][0]:
            raise
        print(
            f"python -m paged course {argv[0]}: not in this copy of the course (a student release ships "
            "without the instructor's release, classroom and autograder tools)",
            file=sys.stderr,
        )
        return 2
    return int(module.main(argv[1:]) or 0)
