"""KV-cache memory calculator: formulas, the built-in configs, transformers configs, seed errors E7/E8, claim C4."""

from __future__ import annotations

import pytest
import torch

from paged_course.reference.memory import KNOWN_MODELS, KVSpec, dtype_bytes, kv_spec


@pytest.mark.parametrize(
    "dtype, size",
    [
        ("float32", 4),
        ("fp32", 4),
        ("float16", 2),
        ("fp16", 2),
        ("half", 2),
        ("bfloat16", 2),
        ("bf16", 2),
        ("float8", 1),
        ("fp8", 1),
        ("int8", 1),
        ("FP16", 2),
        ("torch.float16", 2),
        (torch.float32, 4),
        (torch.float16, 2),
        (torch.bfloat16, 2),
        (torch.int8, 1),
    ],
)
def test_dtype_bytes(dtype, size):
    assert dtype_bytes(dtype) == size


def test_unknown_dtype_lists_valid_names():
    with pytest.raises(ValueError, match="dtype.*bf16.*float16"):
        dtype_bytes("float12")
    with pytest.raises(ValueError, match="dtype"):
        KVSpec(2, 2, 8, dtype="nope")


@pytest.mark.parametrize(
    "field, args",
    [
        ("num_layers", (0, 8, 128)),
        ("num_kv_heads", (32, -1, 128)),
        ("head_dim", (32, 8, 0)),
    ],
)
def test_zero_or_negative_sizes_are_named(field, args):
    with pytest.raises(ValueError, match=field):
        KVSpec(*args)


def test_bad_block_size_and_budget():
    spec = KVSpec(2, 2, 8)
    with pytest.raises(ValueError, match="block_size"):
        spec.bytes_per_block(0)
    with pytest.raises(ValueError, match="budget_bytes"):
        spec.num_blocks_for_budget(-1, 16)
    with pytest.raises(ValueError, match="num_tokens"):
        spec.bytes_per_sequence(-5)


def test_formula_on_a_small_spec():
    spec = KVSpec(num_layers=3, num_kv_heads=2, head_dim=8, dtype="float32")
    assert spec.bytes_per_token == 2 * 3 * 2 * 8 * 4 == 384
    assert spec.bytes_per_block(16) == 384 * 16
    assert spec.bytes_per_sequence(10) == 3840
    assert spec.num_blocks_for_budget(384 * 16 * 5 + 100, 16) == 5


def test_claim_c4_llama2_7b_and_13b():
    # C4: ~1.1 GB and ~1.7 GB per 2048-token sequence in fp16 (the seed's Table 4.2 rows are right)
    seven, thirteen = kv_spec("meta-llama/Llama-2-7b-hf"), kv_spec("llama-2-13b")
    assert seven.bytes_per_token == 524_288  # 0.5 MiB per token
    assert seven.bytes_per_sequence(2048) == 2**30  # exactly 1 GiB = 1.07 GB
    assert thirteen.bytes_per_sequence(2048) == 1_677_721_600  # 1.68 GB
    assert (
        KNOWN_MODELS["facebook/opt-13b"].bytes_per_token == 819_200
    )  # the paper's 800 KB per token


def test_error_e7_llama2_70b_uses_gqa():
    spec = kv_spec("Llama-2-70B")  # case-insensitive alias
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (80, 8, 128)
    assert spec.bytes_per_sequence(2048) == 671_088_640  # 0.67 GB, not the seed's 5.2 GB
    mha = KVSpec(80, 64, 128)  # the same model without GQA: what the seed's 5.2 GB resembles
    assert mha.bytes_per_sequence(2048) / 1e9 == pytest.approx(5.37, abs=0.01)


def test_error_e8_bytes_per_block():
    spec = kv_spec("llama-2-7b")
    assert spec.bytes_per_block(16) == 2 * 32 * 32 * 128 * 16 * 2 == 8 * 2**20  # 8 MiB per block
    seed_formula = (
        16 * 2 * 4096 * 32 * 128 * 2
    )  # the seed multiplies hidden (=32 x 128) by 128 again
    assert seed_formula == 128 * spec.bytes_per_block(16)


def test_known_models_have_aliases_and_gqa_values():
    expected = {
        "llama-3-8b": (32, 8, 128),
        "mistral-7b": (32, 8, 128),
        "qwen2.5-7b": (28, 4, 128),
        "opt-13b": (40, 40, 128),
    }
    for name, shape in expected.items():
        spec = KNOWN_MODELS[name]
        assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == shape, name
    assert KNOWN_MODELS["Qwen/Qwen2.5-7B"] is KNOWN_MODELS["qwen2.5-7b"]


def test_dtype_override():
    assert kv_spec("llama-2-7b", dtype="fp32").bytes_per_token == 2 * 524_288
    assert kv_spec("llama-2-7b", dtype=torch.float8_e4m3fn).bytes_per_token == 524_288 // 2


def test_transformers_configs():
    from transformers import GPT2Config, LlamaConfig, OPTConfig

    gpt2 = kv_spec(GPT2Config(n_layer=4, n_head=6, n_embd=384))
    assert (gpt2.num_layers, gpt2.num_kv_heads, gpt2.head_dim) == (4, 6, 64)
    opt = kv_spec(OPTConfig(num_hidden_layers=3, num_attention_heads=4, hidden_size=256))
    assert (opt.num_layers, opt.num_kv_heads, opt.head_dim) == (3, 4, 64)
    gqa = kv_spec(
        LlamaConfig(
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            hidden_size=256,
            head_dim=48,
        )
    )  # explicit head_dim wins over 256 // 8
    assert (gqa.num_layers, gqa.num_kv_heads, gqa.head_dim) == (2, 2, 48)
    mha = kv_spec(
        LlamaConfig(
            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=None, hidden_size=256
        )
    )
    assert (mha.num_kv_heads, mha.head_dim) == (8, 32)


def test_local_path_through_autoconfig(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64
    ).save_pretrained(tmp_path)
    spec = kv_spec(str(tmp_path), dtype="bf16")
    assert spec.bytes_per_token == 2 * 2 * 2 * 16 * 2


def test_unknown_name_lists_builtin_names(tmp_path):
    with pytest.raises(ValueError, match="model_or_config.*llama-2-7b"):
        kv_spec(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="Did you mean 'llama-2-13b'"):
        kv_spec(str(tmp_path / "llama-2-13"))
