"""Course tooling: ``python -m paged course {sync,notebooks,release,autograder,classroom} ...``.

These commands read and write course files (solutions/, exercises/, chapters/); the engine in
``paged/`` never imports them.
"""

from __future__ import annotations

import sys
from importlib import import_module

ACTIONS = {
    "sync": "paged.course.sync",
    "notebooks": "paged.course.notebooks",
    "release": "paged.course.release",
    "autograder": "paged.course.autograder",
    "classroom": "paged.course.classroom",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ACTIONS:
        print("usage: python -m paged course {" + ",".join(ACTIONS) + "} [options]", file=sys.stderr)
        return 2
    return int(import_module(ACTIONS[argv[0]]).main(argv[1:]) or 0)
