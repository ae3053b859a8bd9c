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
