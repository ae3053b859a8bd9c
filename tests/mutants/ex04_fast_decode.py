"""Planted wrong answers for ``solutions/ex04_fast_decode.py`` (``python -m paged course mutants``).

The region is a whole kernel, so each mutant is the reference's region with one plausible slip, written
as a replacement of the reference's text (``variant`` fails when its anchor is not there once).
"""

from paged_course.grading.mutants import variant


def _with(old: str, new: str) -> str:
    return variant("ex04_fast_decode.py", "ch04.ex3", old, new)


MUTANTS = {
    "ch04.ex3": {
        "each token's block looked up in tiles of BLOCK_N, not blocks of BLOCK_SIZE": _with(
            "tokens // BLOCK_SIZE", "tokens // BLOCK_N"
        ),
        "positions past the context keep the score of a zero key (no -inf)": _with(
            's = tl.where(t_mask[None, :], s, float("-inf"))', "s = s"
        ),
        "the accumulator not rescaled when the running max grows": _with(
            "acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot("
        ),
        "exp2 without log2(e) folded into the scale": _with(
            "qk_scale = scale * 1.4426950408889634", "qk_scale = scale"
        ),
    },
}
