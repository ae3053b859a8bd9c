"""Pick the next token of every running sequence from its logits, in one batched pass.

``Sampler.sample(logits, params, generators)`` takes logits ``[S, vocab]`` (float32, one row per
sequence), one ``SamplingParams`` per row and one ``torch.Generator`` (or ``None``) per row, and returns
``S`` token ids. Rows with ``temperature == 0`` take the argmax (greedy). The other rows are scaled by
``1 / temperature``, cut to their ``top_k`` largest logits and to the smallest set of tokens whose
probability reaches ``top_p`` (nucleus sampling), then sampled by inverse CDF from one uniform number
per row. That number comes from the row's generator: a request with a ``seed`` gets its own generator,
so its tokens do not depend on what else is in the batch (vLLM v0: per-request ``generator`` in
``vllm/model_executor/layers/sampler.py``, 0.10.2; v1: ``SamplingMetadata.generators``,
``vllm/v1/sample/metadata.py``, 0.11.1). Only drawing the uniforms loops over rows; sorting,
masking and the CDF search are batched.
"""

from __future__ import annotations

import torch

from paged.core.sequence import SamplingParams


def make_generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded with ``seed`` (the sampler draws its uniforms on the CPU), or ``None`` (use
    the engine's shared generator)."""
    return None if seed is None else torch.Generator().manual_seed(int(seed))


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row and mask what top-k / top-p remove.

    logits [S, V] float32; top_k [S] int64 (``V`` or more = off); top_p [S] float32 in (0, 1].
    Returns ``(probs_sorted [S, V], order [S, V])``: renormalized probabilities in descending-logit
    order (removed tokens have probability 0) and the token id at each sorted position. The most likely
    token is always kept.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
    probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), 0.0)
    return probs / probs.sum(dim=-1, keepdim=True), order


class Sampler:
    """Batched greedy / temperature / top-k / top-p sampling with per-row generators.

    Args:
        seed: seed of the shared generator used by rows without their own (``None``: 0).
    """

    def __init__(self, seed: int | None = None):
        self.generator = torch.Generator().manual_seed(0 if seed is None else int(seed))

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None] | None = None,
    ) -> list[int]:
        """Token ids for the ``S`` rows of ``logits [S, V]``.

        Raises:
            ValueError: ``len(params)`` (or ``len(generators)``) differs from the number of rows.
        """
        num_rows, vocab = logits.shape
        generators = generators if generators is not None else [None] * num_rows
        if len(params) != num_rows or len(generators) != num_rows:
            raise ValueError(
                f"sample: {num_rows} logit rows but {len(params)} params and {len(generators)} generators"
            )
        # greedy: first maximal index (as argmax), faster on CPU
        tokens = logits.max(dim=-1).indices
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            temps = torch.tensor([params[i].temperature for i in random_rows], device=logits.device)
            top_k = torch.tensor(
                [params[i].top_k if params[i].top_k > 0 else vocab for i in random_rows],
                device=logits.device,
            )
            top_p = torch.tensor([params[i].top_p for i in random_rows], device=logits.device)
            probs, order = filter_top_k_top_p(logits[rows].float() / temps[:, None], top_k, top_p)
            uniforms = torch.cat(
                [torch.rand(1, generator=generators[i] or self.generator) for i in random_rows]
            )
            cdf = probs.cumsum(dim=-1)
            pick = torch.searchsorted(cdf, (uniforms.to(cdf.device) * cdf[:, -1])[:, None]).clamp_(
                max=vocab - 1
            )
            tokens[rows] = order.gather(1, pick).squeeze(1)
        return tokens.tolist()
