"""Planted wrong answers for ``solutions/ex04_fast_decode.py`` (``python -m paged course mutants``).

The region is a whole kernel, so each mutant is the reference's region with one plausible slip, written
as a replacement of the reference's text (the test below the table checks that each one applies).
"""

from pathlib import Path

_SOURCE = (Path(__file__).resolve().parents[2] / "solutions" / "ex04_fast_decode.py").read_text()
_REGION = _SOURCE.split("# BEGIN SOLUTION ch04.ex3")[1].split("\n", 1)[1].split("# END SOLUTION")[0]
_REGION = "\n".join(line for line in _REGION.splitlines() if not line.startswith("# "))


def _with(old: str, new: str) -> str:
    assert _REGION.count(old) == 1, (
        f"the mutant's anchor {old!r} is not in the reference region once"
    )
    return _REGION.replace(old, new)


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
