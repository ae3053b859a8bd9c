"""Predict, then run: a chapter asks for a prediction in a plain variable, then reveals the answer.

A prediction cell sets ``prediction = None`` (the learner replaces ``None`` with a guess); the next cell
computes the answer with the course's own code and calls :func:`reveal`, which prints the answer and, when a
prediction was made, whether it was right. With the prediction left at ``None`` (a chapter run top to bottom
without a human, as CI does) the cell just shows the answer.
"""

from __future__ import annotations

import math


def _same(prediction, answer, tolerance: float | None) -> bool:
    if (
        tolerance is not None
        and isinstance(prediction, (int, float))
        and isinstance(answer, (int, float))
    ):
        return math.isclose(float(prediction), float(answer), rel_tol=tolerance, abs_tol=tolerance)
    if isinstance(answer, list) and isinstance(prediction, tuple):
        prediction = list(prediction)
    return prediction == answer


def reveal(prediction, answer, what: str, why: str = "", tolerance: float | None = None) -> None:
    """Print ``what`` and its ``answer``; with a ``prediction``, whether it matches (within ``tolerance`` for
    numbers). ``why`` is printed after it. Returns nothing, so the cell shows only the printed lines."""
    if prediction is None:
        print(
            f"{what}: {answer!r} (set `prediction` in the cell above and run both again to test yourself)"
        )
    else:
        said = "right" if _same(prediction, answer, tolerance) else "not this time"
        print(f"{what}: {answer!r}; you predicted {prediction!r}: {said}")
    if why:
        print(f"why: {why}")
