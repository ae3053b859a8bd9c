"""The ungraded "make it faster" exercise (``solutions/ex04_fast_decode.py``, ch04.ex3).

Both the reference answer and the generated starter (the teaching kernel) pass the exercise's own
self-check under the interpreter, agree with the engine's kernel, and keep the contract's errors; the
starter really is the teaching kernel (broadcast-and-sum, one block per step).
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


@pytest.mark.parametrize("package", ["solutions", "exercises"])
def test_self_check_passes_and_matches_the_engine_kernel(package):
    module = importlib.import_module(f"{package}.ex04_fast_decode")
    rows = module.self_check(verbose=False)
    assert len(rows) >= 3 and all(r["ok"] for r in rows), f"{package}: {rows}"
    inputs = make_paged([3, 64, 130], 8, 2, 32, 8, dtype=torch.float16, seed=4)
    out = module.learner_decode(*inputs)
    assert max_err(out, naive_decode(*inputs)) < 2e-3, f"{package}: learner kernel != reference"
    with pytest.raises(ValueError, match="3 % 2"):
        module.learner_decode(inputs[0][:, :3], *inputs[1:])


def test_starter_is_the_teaching_kernel_and_the_answer_uses_tl_dot():
    starter = (ROOT / "exercises" / "ex04_fast_decode.py").read_text()
    answer = (ROOT / "solutions" / "ex04_fast_decode.py").read_text().split("# END SOLUTION")[0]
    assert "tl.sum(q[:, None, :] * k[None, :, :], axis=2)" in starter and "tl.dot(" not in starter
    assert answer.count("tl.dot(") == 2 and '"num_stages": 3' in answer
