"""Compare greedy outputs of two runs, leniently like vLLM's model tests (``check_logprobs_close`` in
``tests/models/utils.py`` of vLLM's repository, which compares top log-probabilities instead of logits).

Two correct engines can legitimately part ways: batching changes the order of floating-point sums,
moving fp32 logits by ~1e-6, and when the two best tokens are that close, greedy picks may differ.
So two greedy continuations of one prompt *agree* when they are equal, or when at the first position
where they differ the two chosen tokens' logits are a near-tie under a plain contiguous forward pass
of the reference model (after which the continuations are no longer comparable).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or the shorter length if one is a prefix), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Agreement:
    """Result of ``greedy_agreement``: ``equal`` tokens, or the first divergence and its logit gap."""

    equal: bool
    position: int | None = None
    gap: float | None = None

    @property
    def ok(self) -> bool:
        return self.equal or (self.gap is not None and self.gap <= NEAR_TIE)


NEAR_TIE = 1e-3  # logit units: fp32 batching noise is ~1e-6; random-weight models rarely tie closer than 1e-3


@torch.inference_mode()
def greedy_agreement(model, prompt: list[int], a: list[int], b: list[int]) -> Agreement:
    """Whether two greedy continuations ``a`` and ``b`` of ``prompt`` agree (module docstring).

    ``model`` must run a plain transformers attention (``"sdpa"`` / ``"eager"``); it scores the context
    ``prompt + a[:i]`` at the first divergence ``i``. Continuations of different lengths that agree
    on the shared part count as a divergence with no gap (not ok).
    """
    i = first_divergence(a, b)
    if i is None:
        return Agreement(True)
    if i >= min(len(a), len(b)):
        return Agreement(False, i, None)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(a[:i])], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
    return Agreement(False, i, float((logits[a[i]] - logits[b[i]]).abs()))
