"""Old path of ``paged_course.reference.compare``, kept because chapter 07 imports it here (the same module object)."""

import sys

from paged_course.reference import compare

sys.modules[__name__] = compare
