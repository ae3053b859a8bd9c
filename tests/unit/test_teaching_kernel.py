"""The teaching decode kernel of chapter 04 (``paged_course.kernel_lab.teaching_decode``, the interpreter on
CPU, tiny shapes), and where its loop, the answer of ch04.ex2, lives.

The kernel is ``_decode_kernel`` of ``ex04_online_softmax.py`` around ``walk_blocks`` (region ch04.ex2): these
tests run it from the reference answers and check it against the float64 loop of ``test_kernels``, with
split-K and empty splits, inf past the context, fp16 scores that would overflow, a context of 0, and the
shared input checks. A student release has no ``solutions/``, so it drops this file; there the teaching kernel
is the learner's own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_kernels import DEVICE, TOL, make_paged, max_err, naive_decode

from paged import kernels
from paged.kernels import paged_attention_decode
from paged_course.kernel_lab import decode_teaching, teaching_decode
from paged_course.reference import paged_attention_gather

pytest.importorskip("solutions.ex04_online_softmax")
if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[2]


def test_the_teaching_kernel_runs_the_reference_walk_where_the_course_has_solutions():
    assert decode_teaching.kernel_module().__name__ == "solutions.ex04_online_softmax"


def test_no_file_a_student_can_open_holds_the_ch04_ex2_walk():
    """The loop of the teaching kernel is the answer of ch04.ex2: it sits in solutions/ only (the teaching
    kernel and the ch04.ex3 starter call it), never in a file that a student release ships. The engine's
    tuned kernel (which ships) shares the online-softmax update's lines; the walk's own lines must be nowhere."""

    def code_lines(text: str) -> set[str]:
        return {line.split("#")[0].strip() for line in text.splitlines()}

    source = (ROOT / "solutions" / "ex04_online_softmax.py").read_text()
    region = re.search(r"# BEGIN SOLUTION ch04\.ex2.*?\n(.*?)# END SOLUTION", source, re.S).group(1)
    engine = set().union(*(code_lines(p.read_text()) for p in (ROOT / "kernels").glob("*.py")))
    answer = {line for line in code_lines(region) if "tl." in line and len(line) > 20} - engine
    assert len(answer) >= 5, f"too few lines of the walk to look for: {answer}"
    shipped = [
        p
        for folder in ("paged", "paged_course", "exercises", "chapters/src", "scripts")
        for p in sorted((ROOT / folder).rglob("*.py"))
    ]
    for path in shipped:
        found = sorted(answer & code_lines(path.read_text()))
        assert not found, f"{path.relative_to(ROOT)} holds lines of the ch04.ex2 answer: {found}"


@pytest.mark.parametrize(
    "dtype,heads,kv_heads,head_dim,block_size",
    [
        (torch.float32, 4, 4, 16, 8),
        (torch.float32, 14, 2, 24, 16),  # group 7, head dim not a power of two
        (torch.float16, 8, 2, 40, 32),
        (
            torch.bfloat16,
            6,
            3,
            16,
            8,
        ),  # broadcast-and-sum on upcast loads: bf16 is exact enough here
    ],
)
def test_teaching_decode_matches_references(dtype, heads, kv_heads, head_dim, block_size):
    lens = [1, block_size, block_size + 1, 2 * block_size + 3]
    inputs = make_paged(
        lens, heads, kv_heads, head_dim, block_size, dtype=dtype, seed=heads * head_dim
    )
    out = teaching_decode(*inputs)
    assert out.dtype == dtype and torch.isfinite(out).all(), (
        "junk in unused slots (NaN) leaked into the output"
    )
    assert max_err(out, naive_decode(*inputs)) < TOL[dtype], (
        f"teaching kernel differs from the reference ({dtype})"
    )
    gather = paged_attention_gather(*[t.float() if t.is_floating_point() else t for t in inputs])
    assert max_err(out, gather) < TOL[dtype]


@pytest.mark.parametrize("num_splits", [2, 3, 8])
def test_teaching_split_k_equals_single_pass_and_the_tuned_kernel(num_splits):
    # table width 6 blocks of 8; with 8 splits, 2 of them start past every context
    inputs = make_paged([1, 8, 17, 37], 4, 2, 32, 8, seed=7)
    single = teaching_decode(*inputs)
    split = teaching_decode(*inputs, num_splits=num_splits)
    assert torch.isfinite(split).all(), "an empty split (lse = -inf) produced NaN/inf in the merge"
    assert max_err(split, single) < 1e-6, f"split-K with {num_splits} splits != single pass"
    assert max_err(split, paged_attention_decode(*inputs)) < 1e-6, (
        "teaching and tuned kernels disagree"
    )


def test_teaching_decode_inf_past_the_context_fp16_overflow_and_context_zero():
    inputs = make_paged([0, 5, 9], 8, 2, 16, 4, seed=3, fill=float("inf"))
    out = teaching_decode(*inputs, num_splits=2)
    assert torch.equal(out[0].cpu(), torch.zeros(8, 16)), "context 0 must give a zero output"
    assert torch.isfinite(out).all() and max_err(out, naive_decode(*inputs)) < 1e-5, (
        "inf past the context leaked"
    )
    key_cache = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16, device=DEVICE)
    value_cache = torch.zeros(2, 4, 1, 64, dtype=torch.float16, device=DEVICE)
    value_cache[0, :3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16, device=DEVICE)[
        :, None, None
    ]
    out16 = teaching_decode(
        torch.full((1, 1, 64), 32.0, dtype=torch.float16, device=DEVICE),
        key_cache,
        value_cache,
        torch.tensor([[0, 1]], dtype=torch.int32, device=DEVICE),
        torch.tensor([3], dtype=torch.int32, device=DEVICE),
    )
    assert torch.equal(out16.cpu(), torch.full((1, 1, 64), 2.0, dtype=torch.float16)), (
        "fp16 scores overflowed"
    )


def test_teaching_decode_shares_the_input_checks():
    q, k, v, bt, cl = make_paged([5, 9], 4, 2, 16, 8)
    with pytest.raises(ValueError, match="3 % 2"):
        teaching_decode(q[:, :3], k, v, bt, cl)
    with pytest.raises(ValueError, match="25 exceeds"):
        teaching_decode(q, k, v, bt, torch.tensor([5, 25], dtype=torch.int32, device=DEVICE))
