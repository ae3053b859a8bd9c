from paged_course.predict import reveal


def test_reveal_without_a_prediction_just_shows_the_answer(capsys):
    # None: a cell ending in reveal(...) shows no stray value
    assert reveal(None, 7, "the block handed out next", why="first in, first out") is None
    out = capsys.readouterr().out
    assert (
        out.startswith("the block handed out next: 7 (set `prediction`")
        and "why: first in, first out" in out
    )


def test_reveal_compares_a_prediction(capsys):
    for prediction, answer, tolerance in (
        (7, 7, None),
        (3, 7, None),
        (0.1353, 0.135335, 1e-3),
        ((4, 1), [4, 1], None),
    ):
        assert reveal(prediction, answer, "x", tolerance=tolerance) is None
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "x: 7; you predicted 7: right",
        "x: 7; you predicted 3: not this time",
        "x: 0.135335; you predicted 0.1353: right",
        "x: [4, 1]; you predicted (4, 1): right",
    ]


def test_every_chapter_01_to_06_asks_for_a_prediction_before_the_reveal():
    """Each of chapters 01-06 has a cell that sets ``prediction = None`` and, in a later cell, reveals the
    answer with ``reveal(prediction, ...)``; the markdown before the prediction says "Predict, then run"."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "chapters" / "src"
    for number in ("01", "02", "03", "04", "05", "06"):
        (path,) = root.glob(f"{number}_*.py")
        cells = re.split(r"^# %%.*$", path.read_text(), flags=re.M)
        asks = [i for i, c in enumerate(cells) if re.search(r"^prediction = None\b", c, re.M)]
        shown = [
            i
            for i in asks
            if any("reveal(" in c and "prediction" in c for c in cells[i + 1 : i + 3])
            and "predict" in cells[i - 1].lower()
        ]
        assert shown, f"{path.name}: no prediction cell followed by its reveal"
