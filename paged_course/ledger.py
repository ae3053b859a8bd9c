"""Old path of ``paged_course.reference.ledger``, kept because the chapters import it here (the same module object)."""

import sys

from paged_course.reference import ledger

sys.modules[__name__] = ledger
