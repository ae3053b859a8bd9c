"""paged.models: the built-in model (saved once, loaded through the Auto classes) and tiny test models."""

from __future__ import annotations

import pytest
import torch

from paged import models
from paged_course.reference import models as tiny_models


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("paged-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PAGED_CACHE", str(path))
        yield path


def test_byte_tokenizer_round_trip():
    tok = models.build_byte_tokenizer()
    ids = tok("Hé!")["input_ids"]
    assert ids == [models.BOS_ID, 72, 0xC3, 0xA9, 33], "token id = UTF-8 byte value, after <bos>"
    assert tok.decode(ids, skip_special_tokens=True) == "Hé!"
    assert len(tok) == models.VOCAB_SIZE == 259
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)


def test_default_model_saved_once_and_loaded_through_auto_classes(cache_dir):
    path = models.default_model_path()
    assert path == cache_dir / f"default-model-v{models.DEFAULT_MODEL_VERSION}"
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert (
        models.default_model_path() == path and (path / "config.json").stat().st_mtime_ns == stamp
    ), "a second call must reuse the saved folder"
    model, tok = models.load_default()
    cfg = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.max_position_embeddings,
        cfg.vocab_size,
    ) == (4, 256, 8, 2, 2048, 259)
    fresh = models.build_default_model()
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), f"weights of {name} must come from the fixed seed"
    ids = torch.tensor([tok("The KV cache")["input_ids"]])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False
        )[0, ids.shape[1] :]
    text = tok.decode(out)
    assert len(out) == 24 and all(32 <= t < 127 or t == 10 for t in out.tolist()), (
        f"greedy text must stay printable ASCII and never hit EOS, got {text!r}"
    )


def test_default_model_rebuilt_when_incomplete(cache_dir):
    path = models.default_model_path()
    (path / "config.json").unlink()
    assert (models.default_model_path() / "config.json").exists(), (
        "a folder missing config.json is rebuilt"
    )
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".default-model-")], (
        "no temp folder left"
    )


@pytest.mark.parametrize(
    "arch, cls, kv_heads",
    [
        ("llama", "LlamaForCausalLM", 2),
        ("qwen2", "Qwen2ForCausalLM", 2),
        ("mistral", "MistralForCausalLM", 2),
        ("gpt2", "GPT2LMHeadModel", 4),
    ],
)
def test_tiny_models(arch, cls, kv_heads):
    from paged.worker.worker import kv_shape

    model = tiny_models.tiny_model(arch)
    assert type(model).__name__ == cls and not model.training
    assert kv_shape(model) == (2, kv_heads, 16), "2 layers, head_dim 64 / 4 heads; GPT-2 has no GQA"
    assert torch.equal(tiny_models.tiny_model(arch).lm_head.weight, model.lm_head.weight), (
        "fixed seed"
    )


def test_tiny_config_unknown_arch():
    with pytest.raises(ValueError, match="arch must be one of"):
        tiny_models.tiny_config("opt")


def test_demo_runs_and_agrees_with_transformers(cache_dir, capsys):
    from paged_course.tools import demo

    assert (
        demo.main(["--num-requests", "6", "--check", "2", "--no-baseline", "--kv-memory-mb", "4"])
        == 0
    )
    out = capsys.readouterr().out
    for expected in (
        "KV cache:",
        "requests            6",
        "prefix cache",
        "2/2 sampled requests agree",
    ):
        assert expected in out, f"demo report lacks {expected!r}:\n{out}"


def test_loading_shows_no_transformers_progress_bars(tmp_path, monkeypatch):
    """transformers' "Loading weights" bar ignores TQDM_DISABLE (JupyterLab shows it as a widget); the course
    turns transformers' progress-bar switch off while it loads, and restores it afterwards."""
    import transformers.core_model_loading as loading
    from transformers.utils import logging

    from paged.engine.model_loader import load_model

    tiny_models.tiny_model("llama").save_pretrained(tmp_path)
    seen = []
    real_tqdm = loading.tqdm

    def spy(*args, **kwargs):
        seen.append((kwargs.get("desc"), logging.is_progress_bar_enabled()))
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(loading, "tqdm", spy)
    assert logging.is_progress_bar_enabled(), "precondition: transformers' bars on"
    load_model(str(tmp_path), None)
    assert seen and ("Loading weights", False) in seen, (
        f"bars must be off while loading, saw {seen}"
    )
    assert logging.is_progress_bar_enabled(), "the previous progress-bar state must be restored"
