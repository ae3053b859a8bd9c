"""Planted wrong answers for ``solutions/ex01_kv_pool.py`` (``python -m paged course mutants ch01``)."""

from textwrap import dedent


def _join(*parts: str) -> str:
    """One region body from pieces written at different indents."""
    return "".join(dedent(part) for part in parts)


_READ = """
text = config.get_text_config()

def read(*names):
    values = [getattr(text, name, None) for name in names]
    return next((int(v) for v in values if v is not None), None)

layers, heads = read("num_hidden_layers", "n_layer"), read("num_attention_heads", "n_head")
"""

_SHAPE = """
kv_heads = read("num_key_value_heads") or heads
head_dim = read("head_dim") or read("hidden_size", "n_embd") // heads
"""

_PRICE = """
per_block = 2 * layers * kv_heads * head_dim * block_size * dtype.itemsize
if budget_bytes < per_block:
    raise ValueError(f"a budget of {budget_bytes} bytes holds no KV block of {per_block} bytes")
"""

_CAP = """
cap = max_num_seqs * -(-max_model_len // block_size)
return PoolSize(layers, kv_heads, head_dim, per_block, min(budget_bytes // per_block, cap))
"""

MUTANTS = {
    "ch01.ex6": {
        "reads the top-level config (a multimodal wrapper has no text fields)": _join(
            """
            text = config

            def read(*names):
                values = [getattr(text, name, None) for name in names]
                return next((int(v) for v in values if v is not None), None)

            layers, heads = read("num_hidden_layers", "n_layer"), read("num_attention_heads", "n_head")
            """,
            _SHAPE,
            _PRICE,
            _CAP,
        ),
        "counts every attention head as a KV head (GQA ignored)": _join(
            _READ,
            """
            kv_heads = heads
            head_dim = read("head_dim") or read("hidden_size", "n_embd") // heads
            """,
            _PRICE,
            _CAP,
        ),
        "always hidden_size // heads (an explicit head_dim ignored)": _join(
            _READ,
            """
            kv_heads = read("num_key_value_heads") or heads
            head_dim = read("hidden_size", "n_embd") // heads
            """,
            _PRICE,
            _CAP,
        ),
        "divides the width by the KV heads": _join(
            _READ,
            """
            kv_heads = read("num_key_value_heads") or heads
            head_dim = read("head_dim") or read("hidden_size", "n_embd") // kv_heads
            """,
            _PRICE,
            _CAP,
        ),
        "reads only the Llama names (GPT-2's n_layer / n_head / n_embd missed)": _join(
            """
            text = config.get_text_config()
            layers, heads = int(text.num_hidden_layers), int(text.num_attention_heads)
            kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
            head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
            """,
            _PRICE,
            _CAP,
        ),
        "a missing num_key_value_heads defaults, a None one does not": _join(
            """
            text = config.get_text_config()
            layers = getattr(text, "num_hidden_layers", None) or text.n_layer
            heads = getattr(text, "num_attention_heads", None) or text.n_head
            kv_heads = getattr(text, "num_key_value_heads", heads)
            head_dim = getattr(text, "head_dim", None) or (
                getattr(text, "hidden_size", None) or text.n_embd
            ) // heads
            """,
            _PRICE,
            _CAP,
        ),
        "prices K only (one tensor per layer)": _join(
            _READ,
            _SHAPE,
            """
            per_block = layers * kv_heads * head_dim * block_size * dtype.itemsize
            if budget_bytes < per_block:
                raise ValueError(f"a budget of {budget_bytes} bytes holds no KV block of {per_block} bytes")
            """,
            _CAP,
        ),
        "caps at max_num_seqs x max_model_len tokens (last blocks not whole)": _join(
            _READ,
            _SHAPE,
            _PRICE,
            """
            cap = max_num_seqs * max_model_len // block_size
            return PoolSize(layers, kv_heads, head_dim, per_block, min(budget_bytes // per_block, cap))
            """,
        ),
        "no cap": _join(
            _READ,
            _SHAPE,
            _PRICE,
            """
            return PoolSize(layers, kv_heads, head_dim, per_block, budget_bytes // per_block)
            """,
        ),
        "returns 0 blocks instead of raising": _join(
            _READ,
            _SHAPE,
            """
            per_block = 2 * layers * kv_heads * head_dim * block_size * dtype.itemsize
            """,
            _CAP,
        ),
        "the error without the numbers": _join(
            _READ,
            _SHAPE,
            """
            per_block = 2 * layers * kv_heads * head_dim * block_size * dtype.itemsize
            if budget_bytes < per_block:
                raise ValueError("the KV budget holds no block: raise kv_cache_memory_bytes")
            """,
            _CAP,
        ),
    },
}
