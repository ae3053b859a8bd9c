"""tools: the commands a learner or instructor types.

Owns the ``python -m paged`` dispatcher (``cli``), ``demo``, ``doctor`` and the ``course`` sub-command
table. Modules here may import any other sub-package; nothing outside ``tools`` imports ``tools`` (the one
exception is ``paged/__main__.py``, which dispatches to ``cli``).
"""
