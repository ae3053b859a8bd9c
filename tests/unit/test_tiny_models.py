"""The course's tiny models (``paged_course.reference.models``) are the engine tests' tiny models
(``tests/engine/tiny.py``): same configs, same weights for a seed, same greedy-agreement rule."""

from __future__ import annotations

import pytest
import torch

from paged_course.reference import compare, models
from tests.engine import tiny


def test_the_same_architectures_and_near_tie():
    assert tiny.TINY_ARCHS == models.TINY_ARCHS
    assert tiny.NEAR_TIE == compare.NEAR_TIE


@pytest.mark.parametrize("arch", tiny.TINY_ARCHS)
def test_the_same_config_and_weights(arch):
    assert tiny.tiny_config(arch).to_dict() == models.tiny_config(arch).to_dict()
    ours, theirs = tiny.tiny_model(arch, seed=3), models.tiny_model(arch, seed=3)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), f"{arch}: weights differ for one seed"


def test_the_same_agreement():
    model = tiny.tiny_model("llama")
    prompt = [1, 2, 3]
    for a, b in (([4, 5], [4, 5]), ([4, 5], [4]), ([4, 5, 6], [4, 9, 6])):
        ours, theirs = (
            tiny.greedy_agreement(model, prompt, a, b),
            compare.greedy_agreement(model, prompt, a, b),
        )
        assert (ours.equal, ours.position, ours.ok) == (theirs.equal, theirs.position, theirs.ok)
        assert ours.gap == pytest.approx(theirs.gap) if theirs.gap is not None else ours.gap is None
