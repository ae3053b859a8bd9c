"""Old path of ``paged_course.reference.models``, kept because the chapters import it here (the same module object)."""

import sys

from paged_course.reference import models

sys.modules[__name__] = models
