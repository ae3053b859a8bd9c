"""``python -m paged {demo,bench,grade,doctor,info,course} ...``: dispatch to the tooling modules.

Each sub-command lives in its own module of ``paged_course`` with its own ``main(argv)``;
``paged/__main__.py`` calls ``main`` here.
"""

from __future__ import annotations

import sys
from importlib import import_module

COMMANDS = {
    "demo": (
        "paged_course.tools.demo",
        "run the engine on the built-in model and a built-in workload (the main job)",
    ),
    "bench": (
        "paged_course.bench",
        "benchmarks: sim, allocator, prefix, scheduler, kernel, engine, all",
    ),
    "grade": (
        "paged_course.grading",
        "grade your exercises/ (score table; --report DIR for instructors)",
    ),
    "doctor": (
        "paged_course.tools.doctor",
        "check the toolchain: python, torch, triton, device, a tiny kernel",
    ),
    "info": ("paged_course.tools.doctor", "print versions and the device (no kernel run)"),
    "course": (
        "paged_course.tools.course",
        "course tooling: sync exercises, execute notebooks, release, autograder",
    ),
}


def usage() -> str:
    lines = ["usage: python -m paged COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = import_module(COMMANDS[name][0])
    entry = module.info_main if name == "info" else module.main
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
