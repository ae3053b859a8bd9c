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

Each block is hashed once: a sequence carries its ``BlockKeys`` (the keys and token tuples of its full
blocks, extended when a block fills, as vLLM v1's ``Request.block_hashes``), so a lookup is dict
lookups and token comparisons, and registering a block reuses its key.

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
        block_keys = BlockKeys(self.hash_fn, token_ids, extra)
        block_keys.update(block_size)
        return block_keys.keys


class BlockKeys:
    """The chained keys of the full blocks of one token list, each computed once (when the block fills).

    Args:
        hash_fn: ``hash_fn(parent_key, token_ids: tuple, extra) -> int`` (a ``BlockHasher``'s).
        token_ids: the sequence's token list, read (never copied) at every ``update``; it only grows.
        extra: the extra key of every block.

    ``keys[i]`` is the key of full block ``i``; ``blocks[i]`` its token ids as a tuple (what a hit
    compares and what the cache stores). Source: vLLM v1 ``vllm/v1/request.py`` (``block_hashes``,
    appended to by ``get_request_block_hasher`` in ``vllm/v1/core/kv_cache_utils.py`` as tokens arrive).
    """

    __slots__ = ("hash_fn", "token_ids", "extra", "keys", "blocks")

    def __init__(self, hash_fn: HashFn, token_ids: list[int], extra: Any = None):
        self.hash_fn, self.token_ids, self.extra = hash_fn, token_ids, extra
        self.keys: list[int] = []
        self.blocks: list[tuple] = []

    def update(self, block_size: int) -> int:
        """Hash the blocks of ``token_ids`` that became full since the last call (same ``block_size`` at
        every call). Returns the number of full blocks hashed so far."""
        tokens, keys, blocks, hash_fn, extra = self.token_ids, self.keys, self.blocks, self.hash_fn, self.extra
        parent = keys[-1] if keys else ROOT_KEY
        for start in range(len(keys) * block_size, len(tokens) - block_size + 1, block_size):
            block = tuple(tokens[start:start + block_size])
            parent = hash_fn(parent, block, extra)
            keys.append(parent)
            blocks.append(block)
        return len(keys)

    def copy_for(self, token_ids: list[int]) -> BlockKeys:
        """The same keys for another token list that starts with the same tokens (a forked sequence)."""
        other = BlockKeys(self.hash_fn, token_ids, self.extra)
        other.keys, other.blocks = list(self.keys), list(self.blocks)
        return other


class CachedBlock:
    """What the cache knows about one full physical block: enough to verify a hit exactly.

    ``uid`` is unique per registration; ``parent_uid`` is the uid of the entry of the block before it
    (0 for a sequence's first block). ``next_same_key``: the next entry registered under the same key
    (a hash bucket's chain; almost always None).
    """

    __slots__ = ("block_id", "key", "uid", "parent_uid", "token_ids", "extra", "next_same_key")

    def __init__(self, block_id: int, key: int, uid: int, parent_uid: int, token_ids: tuple, extra: Any = None):
        self.block_id, self.key, self.uid, self.parent_uid = block_id, key, uid, parent_uid
        self.token_ids, self.extra = token_ids, extra
        self.next_same_key: CachedBlock | None = None

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
        self._by_key: dict[int, CachedBlock] = {}  # key -> first entry with it (others chained, oldest first)
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

    def block_keys(self, token_ids: list[int], extra: Any = None) -> BlockKeys:
        """A ``BlockKeys`` for ``token_ids`` with this cache's hash function, its full blocks hashed."""
        keys = BlockKeys(self.hasher.hash_fn, token_ids, extra)
        keys.update(self.block_size)
        return keys

    def lookup(self, token_ids: Sequence[int], max_blocks: int, extra: Any = None,
               block_keys: BlockKeys | None = None) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids``, at most ``max_blocks`` full blocks.

        ``block_keys``: the keys of ``token_ids`` already computed (hashed once per block, see
        ``BlockKeys``; brought up to date here); without it every full block is hashed now.
        Pure: changes nothing in the cache (the caller takes the blocks, then ``record_query``).
        """
        if block_keys is None:
            block_keys = self.block_keys(list(token_ids), extra)
        elif block_keys.extra != extra:
            raise ValueError(f"lookup: block_keys were hashed with extra={block_keys.extra!r}, not {extra!r}")
        else:
            block_keys.update(self.block_size)
        hits, get, parent_uid = [], self._by_key.get, 0
        for key, block in zip(block_keys.keys[:max(max_blocks, 0)], block_keys.blocks):
            entry = get(key)
            while entry is not None:  # the entries with this key: the one after our parent, same tokens
                if entry.parent_uid == parent_uid and entry.token_ids == block and entry.extra == extra:
                    break
                entry = entry.next_same_key
            else:  # no entry, or only collisions / other parents: a miss ends the prefix
                break
            hits.append(entry.block_id)
            parent_uid = entry.uid
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
        self._add(entry)
        return entry

    def _add(self, entry: CachedBlock) -> None:
        """Index a new entry by block and by key (at the end of its key's chain)."""
        self._by_block[entry.block_id] = entry
        last = self._by_key.get(entry.key)
        if last is None:
            self._by_key[entry.key] = entry
            return
        while last.next_same_key is not None:
            last = last.next_same_key
        last.next_same_key = entry

    def register_blocks(self, block_ids: list[int], token_ids: Sequence[int], first: int, stop: int,
                        extra: Any = None, block_keys: BlockKeys | None = None) -> int:
        """Register logical blocks ``first .. stop - 1`` of one sequence (``block_ids`` is its block table,
        ``token_ids`` its tokens). Blocks already cached are kept; the chain stops at the first block
        that cannot be cached. Returns the number of new entries.

        ``block_keys``: the sequence's ``BlockKeys`` (its keys are reused, nothing is hashed again);
        without it every full block of ``token_ids`` is hashed now.

        Raises:
            ValueError: ``block_keys`` hashed with another ``extra``; fewer than ``stop`` full blocks.
        """
        bs = self.block_size
        if block_keys is None:
            block_keys = self.block_keys(list(token_ids), extra)
        elif block_keys.extra != extra:
            raise ValueError(f"register_blocks: block_keys were hashed with extra={block_keys.extra!r}, not {extra!r}")
        if block_keys.update(bs) < stop:
            raise ValueError(f"register_blocks: blocks up to {stop} requested, only {len(block_keys.keys)} are full")
        by_block, by_key, keys, blocks = self._by_block, self._by_key, block_keys.keys, block_keys.blocks
        parent = by_block.get(block_ids[first - 1]) if first else None
        uid = self._next_uid
        for i in range(first, stop):
            block_id = block_ids[i]
            entry = by_block.get(block_id)
            if entry is None:
                if i and parent is None:  # the parent is not cached: a chain is only as long as its head
                    break
                key = keys[i]
                entry = CachedBlock(block_id, key, uid, parent.uid if i else 0, blocks[i], extra)
                uid += 1
                if key in by_key:
                    self._add(entry)
                else:  # the usual case, inline: a new key
                    by_key[key] = by_block[block_id] = entry
            parent = entry
        added, self._next_uid = uid - self._next_uid, uid
        return added

    def evict(self, block_id: int) -> bool:
        """Forget a block that is being reused for other data. Returns whether it was cached."""
        entry = self._by_block.pop(block_id, None)
        if entry is None:
            return False
        first = self._by_key[entry.key]
        if first is entry:  # unlink it from its key's chain
            if entry.next_same_key is None:
                del self._by_key[entry.key]
            else:
                self._by_key[entry.key] = entry.next_same_key
        else:
            while first.next_same_key is not entry:
                first = first.next_same_key
            first.next_same_key = entry.next_same_key
        return True

    def evict_blocks(self, block_ids: list[int]) -> None:
        """``evict`` each of ``block_ids`` that is cached (blocks the free queue just handed out)."""
        by_block = self._by_block
        for block_id in block_ids:
            if block_id in by_block:
                self.evict(block_id)

    def clear(self) -> None:
        """Forget every entry (the caller checks that no block is in use); keeps the hit counters."""
        self._by_key.clear()
        self._by_block.clear()

    def evictable(self, free_queue: list[int]) -> list[int]:
        """The cached blocks among ``free_queue``, in the order they would be evicted (first = next)."""
        return [b for b in free_queue if b in self._by_block]
