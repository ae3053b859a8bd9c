"""The "make it faster" exercise (``solutions/ex04_fast_decode.py``, ch04.ex3): its starter and answer.

The reference answer passes the exercise's own self-check under the interpreter, agrees with the engine's
kernel and keeps the contract's errors. The generated starter is the teaching kernel's frame around a call
of the learner's ch04.ex2 walk (``walk_blocks``): it holds no copy of that answer, fails its self-check while
ch04.ex2 is a stub, and passes once the walk is written.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from test_kernels import make_paged, max_err, naive_decode

from paged import kernels

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[2]


def _check_passes(module, package):
    rows = module.self_check(verbose=False)
    assert len(rows) >= 3 and all(r["ok"] for r in rows), f"{package}: {rows}"
    inputs = make_paged([3, 64, 130], 8, 2, 32, 8, dtype=torch.float16, seed=4)
    out = module.learner_decode(*inputs)
    assert max_err(out, naive_decode(*inputs)) < 2e-3, f"{package}: learner kernel != reference"
    with pytest.raises(ValueError, match="3 % 2"):
        module.learner_decode(inputs[0][:, :3], *inputs[1:])


def test_answer_passes_its_self_check_and_matches_the_engine_kernel():
    _check_passes(importlib.import_module("solutions.ex04_fast_decode"), "solutions")


def test_starter_runs_the_learners_walk_fails_on_a_stub_and_passes_once_it_is_written(monkeypatch):
    starter = importlib.import_module("exercises.ex04_fast_decode")
    stub_walk = importlib.import_module("exercises.ex04_online_softmax").walk_blocks
    monkeypatch.setattr(
        starter, "walk_blocks", stub_walk
    )  # the untouched ch04.ex2 stub: an empty loop
    rows = starter.self_check(verbose=False)
    assert not any(r["ok"] for r in rows), f"the starter passes with an unwritten ch04.ex2: {rows}"
    reference_walk = importlib.import_module("solutions.ex04_online_softmax").walk_blocks
    monkeypatch.setattr(starter, "walk_blocks", reference_walk)  # as if the learner wrote ch04.ex2
    _check_passes(starter, "exercises (with a written ch04.ex2)")


def test_starter_is_the_teaching_frame_without_the_ch04_ex2_loop_and_the_answer_uses_tl_dot():
    starter = (ROOT / "exercises" / "ex04_fast_decode.py").read_text()
    answer = (ROOT / "solutions" / "ex04_fast_decode.py").read_text().split("# END SOLUTION")[0]
    assert "from .ex04_online_softmax import walk_blocks" in starter and "walk_blocks(" in starter
    assert (
        "for b in range(" not in starter and "tl.sum(q[:, None, :] * k[None, :, :]" not in starter
    ), "the starter holds the teaching kernel's loop, the answer of ch04.ex2"
    assert "tl.dot(" not in starter
    assert answer.count("tl.dot(") == 2 and '"num_stages": 3' in answer
