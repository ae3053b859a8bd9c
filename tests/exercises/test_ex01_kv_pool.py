"""Graded: chapter 01, sizing the KV pool (exercises/ex01_kv_pool.py).

``size_kv_pool`` is compared with the plain formula written out in each test: the KV shape of every kind of
config the engine meets (Llama with grouped-query attention, GPT-2's ``n_layer`` / ``n_head`` / ``n_embd``
names, an explicit ``head_dim`` that differs from ``hidden_size / heads``, a ``head_dim`` or
``num_key_value_heads`` set to ``None``, a multimodal config whose vision tower has other numbers), the bytes of
a block for four dtypes and two block sizes, the blocks bought at every remainder of the budget around a
multiple of the block's price, the cap at every position of ``max_model_len`` within a block, the error's
numbers on every budget below one block, random configs (a GQA config without a ``head_dim`` field among
them), and the config left unchanged.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, LlavaConfig, PretrainedConfig

BIG = 1 << 60  # a budget no cap is below


def configs():
    """``(label, config, (layers, kv_heads, head_dim))`` for every kind of config the contract names."""
    llama = dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, hidden_size=256)
    return [
        ("Llama, GQA 8 heads / 2 KV heads", LlamaConfig(**llama), (4, 2, 32)),
        ("Llama, explicit head_dim 48", LlamaConfig(**llama, head_dim=48), (4, 2, 48)),
        ("GPT-2", GPT2Config(n_layer=3, n_head=4, n_embd=64), (3, 4, 16)),
        (
            "GPT-2 names only (no attribute map)",
            PretrainedConfig(n_layer=5, n_head=6, n_embd=96),
            (5, 6, 16),
        ),
        (
            "MHA, num_key_value_heads and head_dim None",
            PretrainedConfig(
                num_hidden_layers=2,
                num_attention_heads=4,
                hidden_size=64,
                num_key_value_heads=None,
                head_dim=None,
            ),
            (2, 4, 16),
        ),
        (
            "GQA 8 heads / 2 KV heads, no head_dim field (a config transformers does not define)",
            PretrainedConfig(**llama),
            (4, 2, 32),
        ),
        (
            "multimodal: Llava over a GQA Llama with head_dim 48",
            LlavaConfig(text_config=LlamaConfig(**llama, head_dim=48).to_dict()),
            (4, 2, 48),
        ),
    ]


def plain(shape, dtype, block_size):
    layers, kv_heads, head_dim = shape
    return 2 * layers * kv_heads * head_dim * block_size * dtype.itemsize


def size(ex, config, dtype=torch.float16, block_size=16, budget=BIG, seqs=1 << 20, max_len=1 << 20):
    return ex.size_kv_pool(config, dtype, block_size, budget, seqs, max_len)


# ================================================================ ch01.ex6: sizing the pool
@pytest.mark.exercise("ch01.ex6", points=1)
@pytest.mark.parametrize("index", range(7))
def test_kv_shape_of_every_kind_of_config(impl, index):
    ex = impl("ex01_kv_pool")
    label, config, shape = configs()[index]
    before = config.to_dict()
    got = size(ex, config)
    assert tuple(got[:3]) == shape, (
        f"{label}: (layers, KV heads, head_dim) {tuple(got[:3])}, expected {shape}"
    )
    assert all(type(v) is int for v in got), f"{label}: every field is an int, got {got}"
    assert config.to_dict() == before, f"{label}: size_kv_pool changed the config"


@pytest.mark.exercise("ch01.ex6", points=1)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
)
def test_bytes_per_block_for_each_dtype_and_block_size(impl, dtype):
    ex = impl("ex01_kv_pool")
    for label, config, shape in configs():
        for block_size in (1, 16):
            got = size(ex, config, dtype, block_size).bytes_per_block
            want = plain(shape, dtype, block_size)
            assert got == want, (
                f"{label}, {dtype}, blocks of {block_size}: {got} bytes per block, expected {want} "
                f"(K and V, every layer and KV head, {dtype.itemsize} bytes each)"
            )


@pytest.mark.exercise("ch01.ex6", points=1)
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_blocks_the_budget_buys_at_every_remainder(impl, block_size):
    ex = impl("ex01_kv_pool")
    _, config, shape = configs()[0]
    price = plain(shape, torch.float16, block_size)
    for whole in (1, 2, 7):
        for extra in (0, 1, price // 2, price - 1):
            budget = whole * price + extra
            got = size(ex, config, torch.float16, block_size, budget)
            assert got.num_blocks == whole and got.bytes_per_block == price, (
                f"a budget of {budget} bytes, {price} bytes per block: {got.num_blocks} blocks, "
                f"expected {whole} (whole blocks only)"
            )


@pytest.mark.exercise("ch01.ex6", points=1)
@pytest.mark.parametrize("block_size", [1, 4])
def test_the_cap_counts_each_sequence_s_last_block_whole(impl, block_size):
    ex = impl("ex01_kv_pool")
    _, config, shape = configs()[2]
    price = plain(shape, torch.float32, block_size)
    for seqs in (1, 2, 3):
        for max_len in range(1, 3 * block_size + 2):
            cap = seqs * -(-max_len // block_size)
            for budget_blocks, want in (
                (cap + 5, cap),
                (cap, cap),
                (max(cap - 1, 1), max(cap - 1, 1)),
            ):
                budget = budget_blocks * price
                got = size(ex, config, torch.float32, block_size, budget, seqs, max_len).num_blocks
                assert got == want, (
                    f"{seqs} sequences of at most {max_len} tokens, blocks of {block_size}, a budget "
                    f"of {budget_blocks} blocks: {got} blocks, expected {want} (at most {seqs} x "
                    f"{-(-max_len // block_size)} blocks are ever used at once)"
                )


@pytest.mark.exercise("ch01.ex6", points=1)
@pytest.mark.parametrize("index", [0, 6])
def test_a_budget_below_one_block_raises_with_the_numbers(impl, index):
    ex = impl("ex01_kv_pool")
    label, config, shape = configs()[index]
    price = plain(shape, torch.bfloat16, 16)
    for budget in (0, 1, price // 2, price - 1):
        before = config.to_dict()
        with pytest.raises(ValueError) as err:
            size(ex, config, torch.bfloat16, 16, budget)
        message = str(err.value)
        assert str(budget) in message and str(price) in message, (
            f"{label}: a budget of {budget} bytes, {price} bytes per block: the error should give both "
            f"numbers, it says {message!r}"
        )
        assert config.to_dict() == before, f"{label}: size_kv_pool changed the config"


@pytest.mark.exercise("ch01.ex6", points=1)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_configs_against_the_plain_formula(impl, seed):
    ex = impl("ex01_kv_pool")
    rng = random.Random(seed)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
    for trial in range(40):
        layers, kv_heads = rng.randrange(1, 9), rng.randrange(1, 5)
        heads = kv_heads * rng.choice([1, 2, 4])
        width = heads * rng.choice([8, 16, 24])
        explicit = rng.choice([None, rng.choice([8, 40, 64])])
        kind = rng.randrange(4)
        if kind == 0:
            config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width)
            kv_heads, explicit = heads, None
        elif kind == 1:
            config = LlamaConfig(
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                hidden_size=width,
                head_dim=explicit,
            )
        elif kind == 3:
            fields = dict(num_key_value_heads=kv_heads, hidden_size=width)
            if explicit:
                fields["head_dim"] = explicit
            config = PretrainedConfig(num_hidden_layers=layers, num_attention_heads=heads, **fields)
        else:
            text = LlamaConfig(
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                hidden_size=width,
                head_dim=explicit,
            )
            config = LlavaConfig(text_config=text.to_dict())
        shape = (layers, kv_heads, explicit or width // heads)
        dtype, block_size = rng.choice(dtypes), rng.choice([1, 2, 8, 16, 32])
        price = plain(shape, dtype, block_size)
        seqs, max_len = rng.randrange(1, 9), rng.randrange(1, 200)
        cap = seqs * -(-max_len // block_size)
        budget = rng.randrange(price, price * (2 * cap + 2))
        got = size(ex, config, dtype, block_size, budget, seqs, max_len)
        want = (*shape, price, min(budget // price, cap))
        assert tuple(got) == want, (
            f"trial {trial} ({type(config).__name__}, {dtype}, blocks of {block_size}, budget {budget}, "
            f"{seqs} x {max_len} tokens): got {tuple(got)}, expected {want}"
        )
