# Generated from solutions/ex01_kv_pool.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

"""Exercise 01, part 3: sizing the KV pool from a model's config and a byte budget (chapter 01).

Before the engine serves anything it must decide how many KV blocks its pool has: read the model's
KV shape from its transformers config, price one block, and divide the memory it may spend by that
price. You write ``size_kv_pool`` (ch01.ex6). The engine's own version is ``kv_shape`` and the budget
branch of ``init_kv_cache`` in ``paged/worker/worker.py``, with ``block_bytes`` in
``paged/worker/kv_cache.py``; the chapter's calculator ``paged_course.reference.memory`` prices tokens
the same way (``kv_spec`` reads the shape: write the region without it).

Sources: vLLM v0 ``vllm/worker/cache_engine.py`` (``CacheEngine.get_cache_block_size``: 2 x layers x
KV heads x head size x block size x dtype bytes) and ``vllm/worker/worker.py``
(``determine_num_available_blocks``: the memory left for the KV cache divided by the block size in
bytes), 0.10.2; vLLM v1 ``vllm/v1/core/kv_cache_utils.py`` (``get_kv_cache_config``: the same division,
and an error when no block fits), 0.10.2; ``transformers.PretrainedConfig.get_text_config``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PoolSize(NamedTuple):
    """What ``size_kv_pool`` decided: the KV shape, the price of a block, and the blocks bought."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    bytes_per_block: int
    num_blocks: int


def size_kv_pool(
    config,
    dtype: torch.dtype,
    block_size: int,
    budget_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
) -> PoolSize:
    """The KV pool that ``budget_bytes`` of memory buys for the model of ``config``.

    Args:
        config: a transformers ``PretrainedConfig`` (left unchanged). Its text model's config,
            ``config.get_text_config()`` (the config itself for a text-only model; the language model's for
            a multimodal one), names the layers ``num_hidden_layers`` (GPT-2 style: ``n_layer``), the
            attention heads ``num_attention_heads`` (``n_head``) and the width ``hidden_size``
            (``n_embd``); ``num_key_value_heads`` is set for grouped-query attention and absent or
            ``None`` for multi-head attention (as many KV heads as attention heads); ``head_dim``, when
            set and not ``None``, wins over ``hidden_size // num_attention_heads``.
        dtype: the cache's element type (``dtype.itemsize`` bytes).
        block_size: tokens per block (> 0).
        budget_bytes: memory the pool may take.
        max_num_seqs, max_model_len: the most sequences at once and the most tokens in one (> 0).

    Returns:
        ``PoolSize(num_layers, num_kv_heads, head_dim, bytes_per_block, num_blocks)``, ints:
        ``bytes_per_block`` is a block's K and V over every layer; ``num_blocks`` is the whole blocks the
        budget holds, but never more than ``max_num_seqs`` sequences of ``max_model_len`` tokens can use
        at once (each sequence's last block counts whole).

    Raises:
        ValueError: the budget holds no block; the message gives the budget and the bytes per block.
    """
    raise NotImplementedError(
        "ch01.ex6: (layers, KV heads, head_dim) of the text model, a block's bytes, the blocks bought"
    )
