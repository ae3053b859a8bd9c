"""Fixtures of the engine's own tests: tiny transformers models and the greedy-agreement rule.

The engine's tests import nothing from the course package (``tests/engine/test_stands_alone.py`` checks
it), so they build their models here: 2 layers, hidden 64, vocab 128, fp32, eval mode, weights drawn
from a fixed seed through ``AutoModelForCausalLM.from_config``. Llama, Qwen2 and Mistral with 4 query
heads over 2 KV heads (GQA); GPT-2 without GQA. eos is the last vocabulary id.
``tests/unit/test_tiny_models.py`` checks that the course's tiny models are these same models.

Two greedy runs of one prompt *agree* when their tokens are equal, or when, at the first position where
they differ, the two chosen tokens' logits under a plain forward of the model are a near-tie (batching
reorders fp32 sums by ~1e-6; vLLM's tests compare the same way, ``tests/models/utils.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TINY_ARCHS = ("llama", "qwen2", "mistral", "gpt2")
NEAR_TIE = 1e-3  # logit units


def tiny_config(
    arch: str = "llama",
    *,
    vocab_size: int = 128,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 512,
):
    """The transformers config of a tiny ``arch`` model (one of ``TINY_ARCHS``)."""
    import transformers

    ids = {"vocab_size": vocab_size, "eos_token_id": vocab_size - 1, "bos_token_id": 0}
    if arch == "gpt2":
        return transformers.GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    config_class = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }[arch]
    return config_class(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        initializer_range=0.1,
        **ids,
    )


def tiny_model(arch: str = "llama", seed: int = 0, **kwargs):
    """A fp32 eval-mode tiny ``arch`` model whose weights come from ``torch.manual_seed(seed)``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(arch, **kwargs)).float().eval()


@dataclass
class Agreement:
    """``equal`` tokens, or the first differing ``position`` and the logit ``gap`` there."""

    equal: bool
    position: int | None = None
    gap: float | None = None

    @property
    def ok(self) -> bool:
        return self.equal or (self.gap is not None and self.gap <= NEAR_TIE)


@torch.inference_mode()
def greedy_agreement(model, prompt: list[int], a: list[int], b: list[int]) -> Agreement:
    """Whether the greedy continuations ``a`` and ``b`` of ``prompt`` agree (module docstring).

    ``model`` runs a plain transformers attention; continuations of different lengths that agree on
    their shared part do not agree (no gap to measure).
    """
    position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if position is None:
        if len(a) == len(b):
            return Agreement(True)
        return Agreement(False, min(len(a), len(b)), None)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(a[:position])], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
    return Agreement(False, position, float((logits[a[position]] - logits[b[position]]).abs()))
