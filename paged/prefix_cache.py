"""Prefix caching: find the KV blocks another request already computed for the same leading tokens.

Only *full* blocks are cached: a full block's K/V never change again, so any sequence whose tokens
match it up to and including that block can use it as is. A block's key chains its parent's key:

    key(block i) = hash_fn(key(block i - 1), token ids of block i, extra key)     (key(-1) = ROOT_KEY)

so equal tokens after different prefixes get different keys (attention makes a token's K/V depend on
every token before it). ``extra`` distinguishes otherwise equal tokens (e.g. a LoRA adapter id).

A hash can collide, and this module never trusts it alone: every cached block stores its token ids,
its extra key and the identity (``uid``) of the parent entry it was computed after, and a hit must
match all three (a collision is a miss). Each registration gets a fresh ``uid``, so entries computed
after a parent that has since been evicted and reused can never match again.

Eviction order lives in the allocator's free queue (``allocator.py``): a cached block whose holders
all freed it goes to the back of the queue *still cached*; a hit takes it out again (``take``), and
only when the queue hands it out for new data does the block manager call ``evict`` to drop its key.
Never-used blocks start at the front, freed blocks queue by free time (least recently freed reused
first), and ``BlockSpaceManager.free`` frees a sequence's blocks tail first, so a shared prefix's
head stays cached longest.

Sources: vLLM v1 ``vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``, ``FreeKVCacheBlockQueue``),
``vllm/v1/core/block_pool.py`` (``get_cached_block``, ``cache_full_blocks``, eviction in
``_maybe_evict_cached_block``); v0 ``vllm/core/block/prefix_caching_block.py``; nano-vllm's
``block_manager.py`` (token ids compared on a hit).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

ROOT_KEY = 0  # the "parent key" of a sequence's first block (vLLM v1 uses a random NONE_HASH)

HashFn = Callable[[int, tuple, Any], int]


def default_hash(parent_key: int, token_ids: tuple, extra: Any = None) -> int:
    """Python's tuple hash of ``(parent_key, token_ids, extra)`` (deterministic for ints; vLLM v0 style)."""
    return hash((parent_key, token_ids, extra))


class BlockHasher:
    """Computes chained block keys with an injectable ``hash_fn(parent_key, token_ids, extra) -> int``.

    Tests plug in a deliberately weak function to prove that collisions are caught by the token check.
    """

    def __init__(self, hash_fn: HashFn | None = None):
        self.hash_fn = hash_fn or default_hash

    def __call__(self, parent_key: int, token_ids: Sequence[int], extra: Any = None) -> int:
        return self.hash_fn(parent_key, tuple(token_ids), extra)

    def keys(self, token_ids: Sequence[int], block_size: int, extra: Any = None) -> list[int]:
        """Chained keys of every *full* block of ``token_ids`` (a partial last block gets none)."""
        keys, parent = [], ROOT_KEY
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = self(parent, token_ids[start:start + block_size], extra)
            keys.append(parent)
        return keys


class CachedBlock:
    """What the cache knows about one full physical block: enough to verify a hit exactly.

    ``uid`` is unique per registration; ``parent_uid`` is the uid of the entry of the block before it
    (0 for a sequence's first block).
    """

    __slots__ = ("block_id", "key", "uid", "parent_uid", "token_ids", "extra")

    def __init__(self, block_id: int, key: int, uid: int, parent_uid: int, token_ids: tuple, extra: Any = None):
        self.block_id, self.key, self.uid, self.parent_uid = block_id, key, uid, parent_uid
        self.token_ids, self.extra = token_ids, extra

    def __repr__(self) -> str:
        return (f"CachedBlock(block={self.block_id}, uid={self.uid}, parent_uid={self.parent_uid}, "
                f"tokens={self.token_ids})")


class PrefixCache:
    """Map from chained block keys to the full blocks that hold them, with exact hit verification.

    Args:
        block_size: tokens per block (> 0).
        hasher: a ``BlockHasher`` (default: ``default_hash``).

    Several blocks may hold the same key (two requests computing the same prefix at once, or a hash
    collision); ``lookup`` picks one whose stored tokens, extra key and parent match.
    ``hit_rate`` = hit tokens / queried tokens over every ``record_query``.
    """

    def __init__(self, block_size: int, hasher: BlockHasher | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        self.block_size = block_size
        self.hasher = hasher or BlockHasher()
        self._by_key: dict[int, dict[int, CachedBlock]] = {}
        self._by_block: dict[int, CachedBlock] = {}
        self._next_uid = 1
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._by_block)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._by_block

    def entry(self, block_id: int) -> CachedBlock | None:
        return self._by_block.get(block_id)

    def lookup(self, token_ids: Sequence[int], max_blocks: int, extra: Any = None) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids``, at most ``max_blocks`` full blocks.

        Pure: changes nothing (the caller takes the blocks, then ``record_query``).
        """
        bs, hits, hash_fn, by_key = self.block_size, [], self.hasher.hash_fn, self._by_key
        tokens = tuple(token_ids)
        parent_key, parent_uid = ROOT_KEY, 0
        for i in range(min(max_blocks, len(tokens) // bs)):
            block = tokens[i * bs:(i + 1) * bs]
            key = hash_fn(parent_key, block, extra)
            candidates = by_key.get(key)
            if candidates is None:
                break
            match = None
            for entry in candidates.values():
                if entry.parent_uid == parent_uid and entry.token_ids == block and entry.extra == extra:
                    match = entry
                    break
            if match is None:  # no entry, or only collisions / other parents: a miss ends the prefix
                break
            hits.append(match.block_id)
            parent_key, parent_uid = key, match.uid
        return hits

    def record_query(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.queried_tokens += num_queried_tokens
        self.hit_tokens += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens (0.0 before any query)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def register(self, block_id: int, parent_block_id: int | None, token_ids: Sequence[int],
                 extra: Any = None) -> CachedBlock | None:
        """Cache a block that has just become full (its K/V are written in the current step).

        ``parent_block_id`` is the sequence's previous block (None for its first). Returns the new
        entry, or None when the block cannot be cached: already cached, not full, or its parent is not
        cached (a chain is only as long as its cached head).
        """
        token_ids = tuple(token_ids)
        if block_id in self._by_block or len(token_ids) != self.block_size:
            return None
        if parent_block_id is None:
            parent_key, parent_uid = ROOT_KEY, 0
        else:
            parent = self._by_block.get(parent_block_id)
            if parent is None:
                return None
            parent_key, parent_uid = parent.key, parent.uid
        key = self.hasher.hash_fn(parent_key, token_ids, extra)
        entry = CachedBlock(block_id, key, self._next_uid, parent_uid, token_ids, extra)
        self._next_uid += 1
        self._by_key.setdefault(key, {})[block_id] = entry
        self._by_block[block_id] = entry
        return entry

    def register_blocks(self, block_ids: list[int], token_ids: Sequence[int], first: int, stop: int,
                        extra: Any = None) -> int:
        """Register logical blocks ``first .. stop - 1`` of one sequence (``block_ids`` is its block table,
        ``token_ids`` its tokens). Blocks already cached are kept; the chain stops at the first block
        that cannot be cached. Returns the number of new entries."""
        bs, added = self.block_size, 0
        for i in range(first, stop):
            block_id = block_ids[i]
            if block_id in self._by_block:
                continue
            parent = block_ids[i - 1] if i else None
            if self.register(block_id, parent, token_ids[i * bs:(i + 1) * bs], extra) is None:
                break
            added += 1
        return added

    def evict(self, block_id: int) -> bool:
        """Forget a block that is being reused for other data. Returns whether it was cached."""
        entry = self._by_block.pop(block_id, None)
        if entry is None:
            return False
        same_key = self._by_key[entry.key]
        del same_key[block_id]
        if not same_key:
            del self._by_key[entry.key]
        return True

    def clear(self) -> None:
        """Forget every entry (the caller checks that no block is in use); keeps the hit counters."""
        self._by_key.clear()
        self._by_block.clear()

    def evictable(self, free_queue: list[int]) -> list[int]:
        """The cached blocks among ``free_queue``, in the order they would be evicted (first = next)."""
        return [b for b in free_queue if b in self._by_block]
