"""How many bytes the KV cache needs: per token, per block, per sequence, for a model config.

Every decoder layer stores one key and one value vector per KV head for every token it has seen, so

    bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_dim x dtype bytes
    bytes per block = bytes per token x block_size

``num_kv_heads`` is the number of *key/value* heads: equal to the attention heads for multi-head
attention (MHA), fewer with grouped-query attention (GQA, e.g. 8 for Llama-2-70B). This is the
arithmetic behind vLLM v0's ``vllm/worker/cache_engine.py`` (``CacheEngine.get_cache_block_size``, 0.10.2) and
the PagedAttention paper's §3 example (OPT-13B: 800 KB per token in fp16).

The built-in ``KNOWN_MODELS`` are written from the models' public ``config.json`` values, so the
calculator works offline; ``kv_spec`` reads any other config through ``transformers.AutoConfig``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from paged.config import check_int  # the engine's positive-int check, one copy

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype``: a ``torch.dtype`` or a name such as ``"fp16"`` or ``"bfloat16"``.

    Raises:
        ValueError: an unknown name or object (the message lists the valid names).
    """
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key in _DTYPE_BYTES:
            return _DTYPE_BYTES[key]
    else:
        itemsize = getattr(dtype, "itemsize", None)  # torch.dtype and numpy dtypes carry their size
        if isinstance(itemsize, int) and itemsize > 0:
            return itemsize
    raise ValueError(
        f"dtype: unknown dtype {dtype!r}; valid names: {', '.join(sorted(_DTYPE_BYTES))} "
        f"(or a torch.dtype)"
    )


@dataclass(frozen=True)
class KVSpec:
    """The KV-cache shape of one model: what decides its memory per token.

    Args:
        num_layers: decoder layers (each has its own K and V cache), > 0.
        num_kv_heads: key/value heads per layer (GQA: fewer than the query heads), > 0.
        head_dim: size of one head's key (and value) vector, > 0.
        dtype: element type of the cache (name or ``torch.dtype``), see ``dtype_bytes``.
        name: a label for tables.

    Raises:
        ValueError: a zero or negative size (named in the message) or an unknown dtype.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Any = "float16"
    name: str = ""

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_dim"):
            check_int(field_name, getattr(self, field_name))
        dtype_bytes(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def bytes_per_block(self, block_size: int) -> int:
        """Bytes of one KV block holding ``block_size`` tokens, over all layers (seed error E8 corrected)."""
        check_int("block_size", block_size)
        return self.bytes_per_token * block_size

    def bytes_per_sequence(self, num_tokens: int) -> int:
        """Bytes of the KV of a ``num_tokens``-token sequence stored contiguously (no block rounding)."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
        return self.bytes_per_token * num_tokens

    def num_blocks_for_budget(self, budget_bytes: int, block_size: int) -> int:
        """How many whole blocks of ``block_size`` tokens fit in ``budget_bytes`` (floor)."""
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes!r}")
        return int(budget_bytes // self.bytes_per_block(block_size))

    def with_dtype(self, dtype: Any) -> KVSpec:
        """The same model with another cache dtype."""
        return KVSpec(self.num_layers, self.num_kv_heads, self.head_dim, dtype, self.name)


def _spec(name: str, layers: int, kv_heads: int, head_dim: int) -> KVSpec:
    return KVSpec(layers, kv_heads, head_dim, "float16", name)


# From each model's public config.json (num_hidden_layers, num_key_value_heads, hidden_size / heads).
_HUB = {
    "meta-llama/Llama-2-7b-hf": (_spec("Llama-2-7B", 32, 32, 128), "llama-2-7b"),  # MHA, 32 heads
    "meta-llama/Llama-2-13b-hf": (
        _spec("Llama-2-13B", 40, 40, 128),
        "llama-2-13b",
    ),  # MHA, 40 heads
    "meta-llama/Llama-2-70b-hf": (
        _spec("Llama-2-70B", 80, 8, 128),
        "llama-2-70b",
    ),  # GQA 64 q / 8 kv
    "meta-llama/Meta-Llama-3-8B": (
        _spec("Llama-3-8B", 32, 8, 128),
        "llama-3-8b",
    ),  # GQA 32 q / 8 kv
    "mistralai/Mistral-7B-v0.1": (_spec("Mistral-7B", 32, 8, 128), "mistral-7b"),  # GQA 32 q / 8 kv
    "Qwen/Qwen2.5-7B": (_spec("Qwen2.5-7B", 28, 4, 128), "qwen2.5-7b"),  # GQA 28 q / 4 kv
    "facebook/opt-13b": (_spec("OPT-13B", 40, 40, 128), "opt-13b"),  # MHA, 40 heads
}

KNOWN_MODELS: dict[str, KVSpec] = {}
for _hub_name, (_kv, _alias) in _HUB.items():
    KNOWN_MODELS[_hub_name] = _kv
    KNOWN_MODELS[_alias] = _kv


def _lookup(name: str) -> KVSpec | None:
    if name in KNOWN_MODELS:
        return KNOWN_MODELS[name]
    lowered = {k.lower(): v for k, v in KNOWN_MODELS.items()}
    return lowered.get(name.lower())


def _first(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def spec_from_config(config: Any, dtype: Any = "float16", name: str = "") -> KVSpec:
    """A ``KVSpec`` from a transformers ``PretrainedConfig`` (Llama, Mistral, Qwen2, GPT-2, OPT, ...).

    Uses ``num_hidden_layers`` (``n_layer``), ``num_key_value_heads`` (absent: MHA, equal to
    ``num_attention_heads`` / ``n_head``), and ``head_dim`` when the config sets it explicitly, else
    ``hidden_size`` (``n_embd``) // heads. Multimodal configs are read through ``get_text_config()``.

    Raises:
        ValueError: the config lacks the layer, head or hidden-size fields.
    """
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head", "num_heads")
    kv_heads = _first(config, "num_key_value_heads", "num_kv_heads") or heads
    head_dim = _first(config, "head_dim")
    if head_dim is None:
        hidden = _first(config, "hidden_size", "n_embd", "d_model")
        if hidden is None or not heads:
            raise ValueError(
                f"config {type(config).__name__}: cannot find hidden_size/num_attention_heads "
                "to derive head_dim"
            )
        head_dim = hidden // heads
    if layers is None or kv_heads is None:
        raise ValueError(
            f"config {type(config).__name__}: cannot find num_hidden_layers / num_attention_heads"
        )
    label = name or getattr(config, "_name_or_path", "") or getattr(config, "model_type", "")
    return KVSpec(int(layers), int(kv_heads), int(head_dim), dtype, str(label))


def kv_spec(model_or_config: Any, dtype: Any = "float16") -> KVSpec:
    """The ``KVSpec`` of a model: a ``KNOWN_MODELS`` name, a ``PretrainedConfig``, or any name/path.

    Known names (hub names or short aliases, case-insensitive) need no network. Any other string
    goes to ``transformers.AutoConfig.from_pretrained`` (a local folder with ``config.json``, or
    the Hugging Face hub when it can be reached).

    Raises:
        ValueError: an unknown name that ``AutoConfig`` cannot load (the message lists the built-in
            names), or a bad dtype.
    """
    if isinstance(model_or_config, KVSpec):
        return model_or_config.with_dtype(dtype)
    if isinstance(model_or_config, str):
        known = _lookup(model_or_config)
        if known is not None:
            return known.with_dtype(dtype)
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model_or_config)
        except Exception as err:  # OSError (not found / offline), ValueError (unrecognized model)
            last = model_or_config.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
            close = difflib.get_close_matches(last, [k.lower() for k in KNOWN_MODELS], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"model_or_config: {model_or_config!r} is not a built-in name and could not be "
                f"loaded with AutoConfig ({type(err).__name__}).{hint} Built-in names: "
                f"{', '.join(KNOWN_MODELS)}"
            ) from err
        return spec_from_config(config, dtype, name=model_or_config)
    return spec_from_config(model_or_config, dtype)


def format_bytes(num_bytes: float) -> str:
    """Decimal units as in the seed's tables (1 GB = 1e9 bytes; 1 GiB = 1.074 GB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"
