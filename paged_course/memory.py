"""Old path of ``paged_course.reference.memory``, kept because the chapters import it here (the same module object)."""

import sys

from paged_course.reference import memory

sys.modules[__name__] = memory
