"""grading: scoring the learner's exercises and packaging the grader for Gradescope and GitHub Classroom.

Owns the grader, one concern per module: the pytest plugin that runs inside the test process (``plugin``),
the supervisor that runs pytest in a subprocess with a watchdog and reruns after a crash (``runner``), the
results and their Gradescope / JUnit / Markdown writers (``reports``), the live progress and failure lines
(``progress``) and ``python -m paged grade`` (``command``); beside it the Gradescope bundle (``autograder``), the
GitHub Classroom config (``classroom``) and the planted-bug runner (``mutants``). It may import ``check`` and
``publish`` (the sync markers, the release builder) but never ``bench``, ``sim``, ``viz`` or ``tools``.
"""

from paged_course.grading.command import main
from paged_course.grading.reports import Report, TestResult, apply_all_or_nothing
from paged_course.grading.runner import (
    DEFAULT_TIMEOUT,
    GradingInterrupted,
    grade,
    normalize_chapter,
    watchdog_seconds,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "GradingInterrupted",
    "Report",
    "TestResult",
    "apply_all_or_nothing",
    "grade",
    "main",
    "normalize_chapter",
    "watchdog_seconds",
]
