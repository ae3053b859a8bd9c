"""Command line: ``python -m paged {demo,bench,grade,doctor,info,course} ...``.

The sub-commands are course tooling and live in the ``paged_course`` package beside the engine; this
thin entry point is the only engine file that imports it.
"""

import sys

from paged_course.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
