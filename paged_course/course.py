"""Course tooling: ``python -m paged course {sync,notebooks,release,autograder,classroom} ...``.

These commands read and write course files (solutions/, exercises/, chapters/); the engine in
``paged/`` never imports them.
"""

from __future__ import annotations

import sys
from importlib import import_module

ACTIONS = {
    "sync": "paged_course.sync",
    "notebooks": "paged_course.notebooks",
    "release": "paged_course.release",
    "autograder": "paged_course.autograder",
    "classroom": "paged_course.classroom",
    "mutants": "paged_course.mutants",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ACTIONS:
        print(
            "usage: python -m paged course {" + ",".join(ACTIONS) + "} [options]", file=sys.stderr
        )
        return 2
    try:
        module = import_module(ACTIONS[argv[0]])
    except ModuleNotFoundError as err:
        if err.name != ACTIONS[argv[0]]:
            raise
        print(
            f"python -m paged course {argv[0]}: not in this copy of the course (a student release ships "
            "without the instructor's release, classroom and autograder tools)",
            file=sys.stderr,
        )
        return 2
    return int(module.main(argv[1:]) or 0)
