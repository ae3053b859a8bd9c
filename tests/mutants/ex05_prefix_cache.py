"""Planted wrong answers for ``solutions/ex05_prefix_cache.py`` (``python -m paged course mutants ch05``)."""

MUTANTS = {
    "ch05.ex1": {
        "no parent chaining (every block hashed after the root)": """
            for start in range(len(keys) * bs, len(tokens) - bs + 1, bs):
                keys.append(self.hash_fn(ROOT_KEY, tuple(tokens[start:start + bs])))
        """,
        "re-hashes every block on every call": """
            keys.clear()
            parent = ROOT_KEY
            for start in range(0, len(tokens) - bs + 1, bs):
                parent = self.hash_fn(parent, tuple(tokens[start:start + bs]))
                keys.append(parent)
        """,
        "gives the partial last block a key": """
            parent = keys[-1] if keys else ROOT_KEY
            for start in range(len(keys) * bs, len(tokens), bs):
                parent = self.hash_fn(parent, tuple(tokens[start:start + bs]))
                keys.append(parent)
        """,
        "restarts the chain at the root when extending": """
            parent = ROOT_KEY
            for start in range(len(keys) * bs, len(tokens) - bs + 1, bs):
                parent = self.hash_fn(parent, tuple(tokens[start:start + bs]))
                keys.append(parent)
        """,
        "misses the last full block (off by one)": """
            parent = keys[-1] if keys else ROOT_KEY
            for start in range(len(keys) * bs, len(tokens) - bs, bs):
                parent = self.hash_fn(parent, tuple(tokens[start:start + bs]))
                keys.append(parent)
        """,
        "extends by one block per call (a sequence that grew by several keeps some keyless)": """
            parent = keys[-1] if keys else ROOT_KEY
            start = len(keys) * bs
            if start + bs <= len(tokens):
                keys.append(self.hash_fn(parent, tuple(tokens[start:start + bs])))
        """,
    },
    "ch05.ex2": {
        "trusts the hash without comparing tokens": """
            parent_uid = 0
            for i, key in enumerate(keys[:max(max_blocks, 0)]):
                entry = next((e for e in self._by_key.get(key, ()) if e.parent_uid == parent_uid), None)
                if entry is None:
                    break
                hits.append(entry.block_id)
                parent_uid = entry.uid
        """,
        "no parent check (tokens only)": """
            for i, key in enumerate(keys[:max(max_blocks, 0)]):
                block = tuple(tokens[i * bs:(i + 1) * bs])
                entry = next((e for e in self._by_key.get(key, ()) if e.token_ids == block), None)
                if entry is None:
                    break
                hits.append(entry.block_id)
        """,
        "hits the whole prompt (ignores max_blocks)": """
            parent_uid = 0
            for i, key in enumerate(keys):
                block = tuple(tokens[i * bs:(i + 1) * bs])
                entry = next((e for e in self._by_key.get(key, ())
                              if e.token_ids == block and e.parent_uid == parent_uid), None)
                if entry is None:
                    break
                hits.append(entry.block_id)
                parent_uid = entry.uid
        """,
        "skips a miss instead of ending the prefix": """
            parent_uid = 0
            for i, key in enumerate(keys[:max(max_blocks, 0)]):
                block = tuple(tokens[i * bs:(i + 1) * bs])
                entry = next((e for e in self._by_key.get(key, ())
                              if e.token_ids == block and e.parent_uid == parent_uid), None)
                if entry is None:
                    continue
                hits.append(entry.block_id)
                parent_uid = entry.uid
        """,
        "checks only the first entry under a key": """
            parent_uid = 0
            for i, key in enumerate(keys[:max(max_blocks, 0)]):
                block = tuple(tokens[i * bs:(i + 1) * bs])
                bucket = self._by_key.get(key, [])
                if not bucket or bucket[0].token_ids != block or bucket[0].parent_uid != parent_uid:
                    break
                hits.append(bucket[0].block_id)
                parent_uid = bucket[0].uid
        """,
        "verifies the tokens of block 0 only (a collision deeper in the prefix hits)": """
            parent_uid = 0
            for i, key in enumerate(keys[:max(max_blocks, 0)]):
                block = tuple(tokens[i * bs:(i + 1) * bs])
                entry = next((e for e in self._by_key.get(key, ())
                              if (i > 0 or e.token_ids == block) and e.parent_uid == parent_uid), None)
                if entry is None:
                    break
                hits.append(entry.block_id)
                parent_uid = entry.uid
        """,
        "scans every cached entry for each block (O(entries) per block, not a key look-up)": """
            parent_uid = 0
            for i, key in enumerate(keys[:max(max_blocks, 0)]):
                block = tuple(tokens[i * bs:(i + 1) * bs])
                entry = next((e for e in list(self._by_block.values())
                              if e.key == key and e.token_ids == block and e.parent_uid == parent_uid), None)
                if entry is None:
                    break
                hits.append(entry.block_id)
                parent_uid = entry.uid
        """,
    },
    "ch05.ex3": {
        "no parent chaining (every entry a root)": """
            for i in range(first, stop):
                if block_ids[i] in self._by_block:
                    continue
                entry = Entry(block_ids[i], keys[i], self._next_uid, 0, tuple(tokens[i * bs:(i + 1) * bs]))
                self._next_uid += 1
                self._by_block[entry.block_id] = entry
                self._by_key.setdefault(entry.key, []).append(entry)
                added += 1
        """,
        "registers blocks whose parent is not cached": """
            parent = self._by_block.get(block_ids[first - 1]) if first else None
            for i in range(first, stop):
                entry = self._by_block.get(block_ids[i])
                if entry is None:
                    entry = Entry(block_ids[i], keys[i], self._next_uid, parent.uid if parent else 0,
                                  tuple(tokens[i * bs:(i + 1) * bs]))
                    self._next_uid += 1
                    self._by_block[entry.block_id] = entry
                    self._by_key.setdefault(entry.key, []).append(entry)
                    added += 1
                parent = entry
        """,
        "registers cached blocks again": """
            parent = self._by_block.get(block_ids[first - 1]) if first else None
            for i in range(first, stop):
                if i and parent is None:
                    break
                entry = Entry(block_ids[i], keys[i], self._next_uid, parent.uid if i else 0,
                              tuple(tokens[i * bs:(i + 1) * bs]))
                self._next_uid += 1
                self._by_block[entry.block_id] = entry
                self._by_key.setdefault(entry.key, []).append(entry)
                added += 1
                parent = entry
        """,
        "one uid for every entry": """
            parent = self._by_block.get(block_ids[first - 1]) if first else None
            for i in range(first, stop):
                entry = self._by_block.get(block_ids[i])
                if entry is None:
                    if i and parent is None:
                        break
                    entry = Entry(block_ids[i], keys[i], 1, 1 if i else 0, tuple(tokens[i * bs:(i + 1) * bs]))
                    self._by_block[entry.block_id] = entry
                    self._by_key.setdefault(entry.key, []).append(entry)
                    added += 1
                parent = entry
        """,
        "never looks up the parent of block `first`": """
            parent = None
            for i in range(first, stop):
                entry = self._by_block.get(block_ids[i])
                if entry is None:
                    if i and parent is None:
                        break
                    entry = Entry(block_ids[i], keys[i], self._next_uid, parent.uid if i else 0,
                                  tuple(tokens[i * bs:(i + 1) * bs]))
                    self._next_uid += 1
                    self._by_block[entry.block_id] = entry
                    self._by_key.setdefault(entry.key, []).append(entry)
                    added += 1
                parent = entry
        """,
        "never moves the parent on (every new entry chained to the entry before block first)": """
            parent = self._by_block.get(block_ids[first - 1]) if first else None
            for i in range(first, stop):
                entry = self._by_block.get(block_ids[i])
                if entry is None:
                    if i and parent is None:
                        break
                    entry = Entry(block_ids[i], keys[i], self._next_uid, parent.uid if i else 0,
                                  tuple(tokens[i * bs:(i + 1) * bs]))
                    self._next_uid += 1
                    self._by_block[entry.block_id] = entry
                    self._by_key.setdefault(entry.key, []).append(entry)
                    added += 1
                if parent is None:
                    parent = entry
        """,
    },
    "ch05.ex4": {
        "forgets the block map only (a stale entry stays findable)": """
            return self._by_block.pop(block_id, None) is not None
        """,
        "drops every block under the key": """
            entry = self._by_block.pop(block_id, None)
            if entry is None:
                return False
            for other in self._by_key.pop(entry.key):
                self._by_block.pop(other.block_id, None)
            return True
        """,
        "leaves an empty list under the key": """
            entry = self._by_block.pop(block_id, None)
            if entry is None:
                return False
            self._by_key[entry.key].remove(entry)
            return True
        """,
        "says True for any block": """
            entry = self._by_block.pop(block_id, None)
            if entry is not None:
                bucket = self._by_key[entry.key]
                bucket.remove(entry)
                if not bucket:
                    del self._by_key[entry.key]
            return True
        """,
        "finds the entry by scanning every key's list (O(entries) per eviction)": """
            for key, bucket in list(self._by_key.items()):
                for entry in bucket:
                    if entry.block_id == block_id:
                        bucket.remove(entry)
                        if not bucket:
                            del self._by_key[key]
                        del self._by_block[block_id]
                        return True
            return False
        """,
    },
    "ch05.ex5": {
        "head-first eviction (frees a table from its first block)": """
            queue, counts = list(free_queue), list(ref_counts)
            for table in finishing:
                for b in table:
                    counts[b] -= 1
                    if counts[b] == 0:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
        "ignores the reference counts (a shared block joins at the first free)": """
            queue = list(free_queue)
            for table in finishing:
                for b in reversed(table):
                    if b not in queue:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
        "the last to finish is evicted first": """
            queue, counts = list(free_queue), list(ref_counts)
            for table in reversed(finishing):
                for b in reversed(table):
                    counts[b] -= 1
                    if counts[b] == 0:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
        "forgets the blocks that were already free": """
            queue, counts = [], list(ref_counts)
            for table in finishing:
                for b in reversed(table):
                    counts[b] -= 1
                    if counts[b] == 0:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
        "changes the caller's counts": """
            queue = list(free_queue)
            for table in finishing:
                for b in reversed(table):
                    ref_counts[b] -= 1
                    if ref_counts[b] == 0:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
        "appends to the caller's free queue (in place)": """
            queue, counts = free_queue, list(ref_counts)
            for table in finishing:
                for b in reversed(table):
                    counts[b] -= 1
                    if counts[b] == 0:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
        "frees the first finishing table tail first, the later ones head first": """
            queue, counts = list(free_queue), list(ref_counts)
            for k, table in enumerate(finishing):
                for b in (reversed(table) if k == 0 else table):
                    counts[b] -= 1
                    if counts[b] == 0:
                        queue.append(b)
            return [b for b in queue if b in cached]
        """,
    },
    "ch05.ex6": {
        "copy-on-write skipped": """
            return []
        """,
        "copies a full shared block too": """
            if not table.block_ids:
                return []
            shared = table.block_ids[-1]
            if allocator.ref_count(shared) <= 1:
                return []
            table.block_ids[-1] = allocate()
            allocator.free_many([shared])
            return [(shared, table.block_ids[-1])]
        """,
        "copies a block nobody else holds": """
            if not table.block_ids or table.num_tokens % table.block_size == 0:
                return []
            shared = table.block_ids[-1]
            table.block_ids[-1] = allocate()
            allocator.free_many([shared])
            return [(shared, table.block_ids[-1])]
        """,
        "keeps its reference to the shared block (a leak)": """
            if not table.block_ids or table.num_tokens % table.block_size == 0:
                return []
            shared = table.block_ids[-1]
            if allocator.ref_count(shared) <= 1:
                return []
            table.block_ids[-1] = allocate()
            return [(shared, table.block_ids[-1])]
        """,
        "returns the pair reversed (private, shared)": """
            if not table.block_ids or table.num_tokens % table.block_size == 0:
                return []
            shared = table.block_ids[-1]
            if allocator.ref_count(shared) <= 1:
                return []
            table.block_ids[-1] = allocate()
            allocator.free_many([shared])
            return [(table.block_ids[-1], shared)]
        """,
        "copies but leaves the table on the shared block": """
            if not table.block_ids or table.num_tokens % table.block_size == 0:
                return []
            shared = table.block_ids[-1]
            if allocator.ref_count(shared) <= 1:
                return []
            private = allocate()
            return [(shared, private)]
        """,
        "asks whether the first block is shared instead of the last": """
            if not table.block_ids or table.num_tokens % table.block_size == 0:
                return []
            shared = table.block_ids[-1]
            if allocator.ref_count(table.block_ids[0]) <= 1:
                return []
            table.block_ids[-1] = allocate()
            allocator.free_many([shared])
            return [(shared, table.block_ids[-1])]
        """,
    },
}
