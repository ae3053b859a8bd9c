"""Old path of ``paged_course.reference.models``, kept because chapter 07 imports it here.

The same module object: importing either path gives one module.
"""

import sys

from paged_course.reference import models

sys.modules[__name__] = models
