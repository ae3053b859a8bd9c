"""Prefix caching: find the KV blocks another request already computed for the same leading tokens.

Contract (vLLM v1 ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py``, 0.10.2; nano-vllm
``block_manager.py``):

- Only **full** blocks are cached: a full block's K/V never change again.
- A block's **key chains its parent's key**: ``key(i) = hash_fn(key(i - 1), tokens of block i)``,
  ``key(-1) = ROOT_KEY``, so equal tokens after different prefixes get different keys (attention makes
  a token's K/V depend on every token before it). A sequence keeps its keys (``seq.block_hashes``) and
  extends them as blocks fill, so each block is hashed once.
- A hit is **verified**, never trusted to the hash: the cached entry's token ids must equal the block's,
  and its parent entry must be the entry of the previous hit (each registration gets a fresh ``uid``, so
  an entry computed after a since-evicted parent can never match again). A collision is a miss. (nano-vllm
  checks the tokens too; vLLM v1's ``BlockPool.get_cached_block``, 0.10.2, trusts the hash.)
- **Eviction order** lives in the allocator's free queue (``allocator.py``): a cached block whose last
  holder frees it joins the back of the queue *still cached*; a hit takes it out again; only when the
  queue hands it out for new data does the block manager call ``evict``. The manager frees a sequence's
  blocks tail first, so a shared prefix's head stays cached longest (least recently freed goes first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# the "parent key" of a sequence's first block (vLLM v1: ``NONE_HASH``, random unless PYTHONHASHSEED is
# set, ``vllm/v1/core/kv_cache_utils.py``, 0.10.2)
ROOT_KEY = 0

HashFn = Callable[[int, tuple], int]


def default_hash(parent_key: int, token_ids: tuple) -> int:
    """Python's tuple hash of ``(parent_key, token_ids)`` (deterministic for ints; as vLLM v0's
    ``PrefixCachingBlock.hash_block_tokens``, ``vllm/core/block/prefix_caching_block.py``, 0.10.2)."""
    return hash((parent_key, token_ids))


def hash_blocks(
    token_ids: list[int], block_size: int, keys: list[int], hash_fn: HashFn = default_hash
) -> list[int]:
    """Extend ``keys`` (the chained keys of the first ``len(keys)`` full blocks) to every full block of
    ``token_ids``; a partial last block gets no key. Returns ``keys``."""
    parent = keys[-1] if keys else ROOT_KEY
    for start in range(len(keys) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_fn(parent, tuple(token_ids[start : start + block_size]))
        keys.append(parent)
    return keys


@dataclass(slots=True, eq=False)
class _Entry:
    """One cached block: enough to verify a hit exactly (see the module docstring)."""

    block_id: int
    key: int
    uid: int
    parent_uid: int
    token_ids: tuple


class PrefixCache:
    """Map from chained block keys to the full blocks that hold them, with exact hit verification.

    Args:
        block_size: tokens per block (> 0).
        hash_fn: ``hash_fn(parent_key, token_ids: tuple) -> int`` (default ``default_hash``; tests plug
            in deliberately weak ones to prove that collisions are misses).

    Several blocks may hold one key (two requests computing the same prefix at once, or a collision);
    ``lookup`` picks the one whose tokens and parent match. ``hit_rate`` = hit tokens / queried tokens.
    """

    def __init__(self, block_size: int, hash_fn: HashFn | None = None):
        self.block_size = block_size
        self.hash_fn = hash_fn or default_hash
        self._by_key: dict[int, list[_Entry]] = {}
        self._by_block: dict[int, _Entry] = {}
        self._next_uid = 1
        self.queried_tokens = self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._by_block)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._by_block

    def update_hashes(self, seq) -> list[int]:
        """Bring ``seq.block_hashes`` up to the sequence's full blocks (hashing only the new ones)."""
        return hash_blocks(seq.token_ids, self.block_size, seq.block_hashes, self.hash_fn)

    def lookup(self, seq, max_blocks: int) -> list[int]:
        """Block ids of the longest verified cached prefix of ``seq``, at most ``max_blocks`` full blocks.
        Pure: changes nothing (the block manager takes the blocks, then ``record_query``)."""
        bs, tokens, hits, parent_uid = self.block_size, seq.token_ids, [], 0
        for i, key in enumerate(self.update_hashes(seq)[: max(max_blocks, 0)]):
            block, entry = tuple(tokens[i * bs : (i + 1) * bs]), None
            for candidate in self._by_key.get(key, ()):  # several only on a hash collision
                if candidate.parent_uid == parent_uid and candidate.token_ids == block:
                    entry = candidate
                    break
            # no entry, or only collisions / other parents: a miss ends the prefix
            if entry is None:
                break
            hits.append(entry.block_id)
            parent_uid = entry.uid
        return hits

    def insert(self, seq, block_ids: list[int], first: int, stop: int) -> int:
        """Cache logical blocks ``first .. stop - 1`` of ``seq`` (``block_ids`` is its block table), whose
        K/V the current step writes. Blocks already cached are kept; the chain stops at the first block
        whose parent is not cached. Returns the number of new entries.

        Raises:
            ValueError: fewer than ``stop`` full blocks.
        """
        keys, bs = self.update_hashes(seq), self.block_size
        if len(keys) < stop:
            raise ValueError(f"insert: blocks up to {stop} requested, only {len(keys)} are full")
        parent = self._by_block.get(block_ids[first - 1]) if first else None
        added = 0
        for i in range(first, stop):
            entry = self._by_block.get(block_ids[i])
            if entry is None:
                if i and parent is None:  # a chain is only as long as its cached head
                    break
                entry = _Entry(
                    block_ids[i],
                    keys[i],
                    self._next_uid,
                    parent.uid if i else 0,
                    tuple(seq.token_ids[i * bs : (i + 1) * bs]),
                )
                self._next_uid += 1
                self._by_block[entry.block_id] = entry
                self._by_key.setdefault(entry.key, []).append(entry)
                added += 1
            parent = entry
        return added

    def evict(self, block_id: int) -> bool:
        """Forget a block that is being reused for other data. Returns whether it was cached."""
        entry = self._by_block.pop(block_id, None)
        if entry is None:
            return False
        bucket = self._by_key[entry.key]
        bucket.remove(entry)
        if not bucket:
            del self._by_key[entry.key]
        return True

    def record_query(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.queried_tokens += num_queried_tokens
        self.hit_tokens += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens (0.0 before any query)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def clear(self) -> None:
        """Forget every entry (the caller checks that no block is in use); keeps the hit counters."""
        self._by_key.clear()
        self._by_block.clear()
