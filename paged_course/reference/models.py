"""Tiny transformers models for tests and chapters: 2-layer, 64-hidden Llama, Qwen2, Mistral and GPT-2
(fixed seed, fp32, eval mode). The built-in default model lives in the engine (``paged/models.py``).
"""

from __future__ import annotations

import torch

TINY_ARCHS = ("llama", "qwen2", "mistral", "gpt2")


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
    """A small transformers config of architecture ``arch`` (one of ``TINY_ARCHS``).

    GPT-2 has no GQA (its KV heads equal its heads). eos is the last vocab id.

    Raises:
        ValueError: unknown ``arch``.
    """
    import transformers as tf

    common = dict(vocab_size=vocab_size, eos_token_id=vocab_size - 1, bos_token_id=0)
    if arch == "gpt2":
        return tf.GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    classes = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}
    if arch not in classes:
        raise ValueError(f"arch must be one of {TINY_ARCHS}, got {arch!r}")
    return classes[arch](
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        initializer_range=0.1,
        **common,
    )


def tiny_model(arch: str = "llama", seed: int = 0, **kwargs):
    """A fp32 eval-mode ``AutoModelForCausalLM`` of ``tiny_config(arch, **kwargs)`` built from ``seed``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kwargs))
    return model.float().eval()
