"""The built-in default model and tiny transformers models for tests.

``default_model_path()`` returns a folder holding a small Llama-architecture model (4 layers, hidden
256, 8 query heads over 2 KV heads (GQA), 2048 positions) with random weights from a fixed seed, and
a byte-level tokenizer (token id = byte value, plus ``<bos>``, ``<eos>``, ``<pad>``) made offline with
the ``tokenizers`` library. The folder is written once with ``save_pretrained`` and loaded back with
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``: exactly the path a hub
model takes, so the engine never has a special case for it.

Random weights produce babble, and a plain random transformer's greedy babble collapses into one
repeated character. Two cheap edits (``_readable_babble``) make it look like varied text while keeping
the architecture untouched: the residual branches (``o_proj``, ``down_proj``) are scaled by 0.3 so each
token's own embedding stays visible at the top, and the LM head maps that embedding to a fixed random
permutation of the printable characters (a cipher, blurred by the context the layers mix in). Every
other row of the LM head is zero: non-printable bytes and the special tokens get logit exactly 0 while
the likely printable ones get large positive logits, so greedy and top-k text stays printable and EOS
is never chosen greedily (lengths are set by ``max_tokens``). It is still babble; only its look changed.

"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

DEFAULT_MODEL_VERSION = 2
SPECIAL_TOKENS = ["<bos>", "<eos>", "<pad>"]
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # 259: one token per byte, then the specials


def build_byte_tokenizer():
    """A ``PreTrainedTokenizerFast`` with token id = byte value (0-255) and ids 256-258 for
    ``<bos>``, ``<eos>``, ``<pad>``. No merges: every UTF-8 byte is one token. Prepends ``<bos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    # byte-level BPE's byte -> printable character table (GPT-2's): printable bytes keep their
    # character, the others are shifted past 255, so every byte has a visible, unique symbol
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    for i, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        model_max_length=2048,
    )


def default_config():
    """The built-in model's ``LlamaConfig``: 4 layers, hidden 256, 8 heads / 2 KV heads, head_dim 32."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )


def _readable_babble(
    model, seed: int = 1, branch_scale: float = 0.3, logit_scale: float = 4.0
) -> None:
    """Shrink the residual branches and make the LM head a printable-character cipher (module docstring)."""
    printable = [10] + list(range(32, 127))  # newline and printable ASCII
    order = torch.randperm(len(printable), generator=torch.Generator().manual_seed(seed)).tolist()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(branch_scale)
            layer.mlp.down_proj.weight.mul_(branch_scale)
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        head.zero_()
        for i, char in enumerate(printable):  # after `char`, prefer printable[order[i]]
            head[printable[order[i]]] = logit_scale * embed[char] / embed[char].norm()


def build_default_model(seed: int = 0):
    """The built-in model object (random weights from ``seed``), before saving."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(default_config())
    _readable_babble(model)
    return model.eval()


@contextmanager
def quiet_progress_bars():
    """Silence transformers' own progress bars ("Loading weights", "Writing model shards") inside the block.

    They ignore ``TQDM_DISABLE`` and would show as live widgets in JupyterLab (and as stale text in saved
    notebooks). The previous state (transformers' and huggingface_hub's switches) is restored afterwards.
    """
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging

    was_enabled, hub_was_disabled = logging.is_progress_bar_enabled(), are_progress_bars_disabled()
    logging.disable_progress_bar()  # also turns off huggingface_hub's bars
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()  # also turns huggingface_hub's back on
            if hub_was_disabled:
                disable_progress_bars()


def default_model_path() -> Path:
    """Folder of the built-in model and tokenizer, under ``$PAGED_CACHE`` if set, else
    ``~/.cache/paged``; built and saved on first use (atomic rename), so several processes may race
    safely. Rebuilt when missing or incomplete."""
    root = Path(os.environ.get("PAGED_CACHE") or Path.home() / ".cache" / "paged")
    target = root / f"default-model-v{DEFAULT_MODEL_VERSION}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".default-model-", dir=target.parent))
    try:
        with quiet_progress_bars():
            build_default_model().save_pretrained(tmp)
            build_byte_tokenizer().save_pretrained(tmp)
        if target.exists():  # incomplete leftover
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_default(dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` of the built-in model, loaded through the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    with quiet_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        return model.eval(), AutoTokenizer.from_pretrained(path)
