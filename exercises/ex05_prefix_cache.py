# Generated from solutions/ex05_prefix_cache.py by `python -m paged course sync`. Edit only the marked regions;
# grade with `python -m paged grade`.

"""Exercise 05: block keys, an exact prefix-cache lookup, and the copy-on-write decision (chapter 05).

1. ``block_keys``: the chained key of every *full* block of a token list,
   ``key_i = hash_fn(key_{i-1}, tuple(block_i tokens), extra)`` with ``key_{-1} = ROOT_KEY``.
   A partial last block gets no key (it is never cached).
2. ``lookup``: the longest cached prefix. ``cache`` maps a key to the ``Entry`` objects stored under it
   (several when keys collide). Block ``i`` hits when one entry under its key holds exactly its tokens
   and was computed right after the block that hit at ``i - 1`` (``parent_block``; None for block 0).
   The first miss ends the prefix, and the prompt's last token is always computed: use at most
   ``(len(token_ids) - 1) // block_size`` blocks.
3. ``slot_action``: a sequence holding ``num_tokens`` tokens in its blocks is about to write one more.
   Where does it go? ``"new block"`` when its blocks are all full (or it has none), ``"copy"`` when
   the last block is partially filled *and shared* (reference count > 1: copy-on-write), else
   ``"in place"``.

Sources: vLLM v1 ``vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``), ``block_pool.py``
(``get_cached_block``); v0 ``vllm/core/block/common.py`` (``CopyOnWriteTracker.cow_block_if_not_appendable``:
copy-on-write of a shared partial block). Check with
``python -m paged grade ch05``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ROOT_KEY = 0


@dataclass(frozen=True)
class Entry:
    """One cached full block: its physical id, the block before it in the sequence that computed it
    (None for a first block), and its token ids."""

    block_id: int
    parent_block: int | None
    token_ids: tuple


def block_keys(token_ids: list[int], block_size: int, hash_fn: Callable, extra=None) -> list[int]:
    """Chained keys of the full blocks of ``token_ids``."""
    raise NotImplementedError("ch05.ex1: walk the full blocks; each key hashes (previous key, tuple of tokens, extra)")


def lookup(cache: dict[int, list[Entry]], token_ids: list[int], block_size: int, hash_fn: Callable) -> list[int]:
    """Physical block ids of the longest verified cached prefix (never the whole prompt)."""
    raise NotImplementedError("ch05.ex2: chain keys; an entry hits only if tokens AND parent match; stop at a miss")


def slot_action(num_tokens: int, block_size: int, last_block_ref_count: int) -> str:
    """``"new block"``, ``"copy"`` or ``"in place"`` for the token written at position ``num_tokens``."""
    raise NotImplementedError("ch05.ex3: full (or no) last block: new block; partial and shared: copy; else in place")
