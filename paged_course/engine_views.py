"""Views of the engine's objects that only the course reads (the engine itself never needs them).

``prefills`` / ``decodes``: a step's prompt chunks and decodes (``SchedulerOutputs.scheduled`` split by
``is_prefill``).
"""

from __future__ import annotations


def prefills(out) -> list:
    """The step's prompt chunks (entries of ``out.scheduled`` with ``is_prefill``), in schedule order."""
    return [s for s in out.scheduled if s.is_prefill]


def decodes(out) -> list:
    """The step's decodes (entries of ``out.scheduled`` computing one token), in schedule order."""
    return [s for s in out.scheduled if not s.is_prefill]
