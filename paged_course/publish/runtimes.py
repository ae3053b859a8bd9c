"""Each chapter's committed runtime (``chapters/src/runtimes.json``) and the time budget CI holds it to.

``python -m paged course notebooks execute NN`` records the seconds chapter NN took on the reference
(``solutions``) when it writes the notebook. CI fails a chapter run that takes longer than
:func:`budget`: ``FACTOR`` x its committed runtime + ``SLACK`` seconds (a chapter with no committed
runtime gets no budget). Runtimes are measured on whatever machine re-executed the chapter last (the
CPU, Triton's interpreter): they are a yardstick against a chapter that stalls or grows tenfold, not a
benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path

RUNTIMES = Path(__file__).resolve().parents[2] / "chapters" / "src" / "runtimes.json"
FACTOR = 3.0
SLACK = 30.0  # seconds
ABOUT = (
    "Seconds each chapter took on the reference (solutions/) the last time `python -m paged course "
    "notebooks execute` wrote it; CI fails a chapter run over 3x this + 30 s."
)


def load(path: Path | None = None) -> dict[str, float]:
    """``{"NN_slug": seconds}`` from ``path`` (default :data:`RUNTIMES`); empty when the file does not exist."""
    path = RUNTIMES if path is None else path
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text())["seconds"])


def record(seconds: dict[str, float], path: Path | None = None) -> None:
    """Merge ``seconds`` (``{"NN_slug": seconds}``, positive) into ``path`` (default :data:`RUNTIMES`), keys sorted,
    0.1 s precision; ``ValueError`` for a runtime that is not positive."""
    path = RUNTIMES if path is None else path
    bad = {k: v for k, v in seconds.items() if not v > 0}
    if bad:
        raise ValueError(f"runtimes must be positive seconds, got {bad}")
    merged = load(path) | {k: round(float(v), 1) for k, v in seconds.items()}
    path.write_text(
        json.dumps({"about": ABOUT, "seconds": dict(sorted(merged.items()))}, indent=2) + "\n"
    )


def budget(chapter: str, runtimes: dict[str, float] | None = None) -> float | None:
    """Seconds chapter ``chapter`` (``NN_slug``) may take in CI; ``None`` without a committed runtime."""
    runtimes = load() if runtimes is None else runtimes
    if chapter not in runtimes:
        return None
    return FACTOR * runtimes[chapter] + SLACK


def over_budget(seconds: dict[str, float], runtimes: dict[str, float] | None = None) -> list[str]:
    """One line per chapter in ``seconds`` that took longer than its :func:`budget`."""
    runtimes = load() if runtimes is None else runtimes
    lines = []
    for chapter, took in seconds.items():
        limit = budget(chapter, runtimes)
        if limit is not None and took > limit:
            lines.append(
                f"{chapter} took {took:.1f} s, over its budget of {limit:.0f} s "
                f"({FACTOR:.0f} x its committed {runtimes[chapter]:.1f} s + {SLACK:.0f} s)"
            )
    return lines
