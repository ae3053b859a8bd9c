from paged_course.predict import reveal


def test_reveal_without_a_prediction_just_shows_the_answer(capsys):
    assert reveal(None, 7, "the block handed out next", why="first in, first out") is None
    out = capsys.readouterr().out
    assert (
        out.startswith("the block handed out next: 7 (set `prediction`")
        and "why: first in, first out" in out
    )


def test_reveal_compares_a_prediction(capsys):
    assert reveal(7, 7, "next block") is True
    assert reveal(3, 7, "next block") is False
    assert reveal(0.1353, 0.135335, "alpha", tolerance=1e-3) is True
    assert reveal((4, 1), [4, 1], "blocks") is True
    out = capsys.readouterr().out
    assert "you predicted 7: right" in out and "you predicted 3: not this time" in out
