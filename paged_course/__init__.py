"""paged_course: the course and instructor tooling beside the engine.

Demo, doctor, grading, course sync / notebooks / release / classroom / autograder, the seed-claims
ledger, benchmarks, simulators, plots and the reference attentions the chapters teach with. It imports
the engine (``paged``); the engine never imports it (``python -m paged`` dispatches here through
``paged/__main__.py``, the one exception).
"""
