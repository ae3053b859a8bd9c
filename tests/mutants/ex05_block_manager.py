"""Planted wrong answers for ``solutions/ex05_block_manager.py`` (``python -m paged course mutants ch05``)."""

_ADMIT_HEAD = """
    if seq.seq_id in self.swap.tables:
        raise ValueError(f"sequence {seq.seq_id} is swapped out: swap_in brings it back")
    gpu, bs = self.gpu_allocator, self.block_size
    hits = self.get_computed_blocks(seq) if computed is None else list(computed)
    cached = len(hits) * bs
    num_tokens = len(seq) if num_new_tokens is None else cached + num_new_tokens
    num_new = blocks_needed(num_tokens, bs) - len(hits)
"""

_ADMIT_CLAIM = """
    for b in hits:
        if gpu.ref_count(b):
            gpu.incref(b)
        else:
            gpu.take(b)
"""

_ADMIT_TAIL = """
    new = gpu.allocate_many(num_new)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    table = BlockTable(bs, hits + new, num_tokens)
    self.block_tables[seq.seq_id] = table
    seq.num_cached_tokens = seq.num_computed_tokens = cached
    if self.prefix_cache is not None:
        self.prefix_cache.record_query(len(seq), cached)
        self.prefix_cache.insert(seq, table.block_ids, len(hits), num_tokens // bs)
    return NewBlocks(list(table.block_ids))
"""

_WATERMARK = """
    idle_hits = sum(gpu.ref_count(b) == 0 for b in hits)
    if gpu.num_free_blocks - num_new - idle_hits < self.watermark_blocks:
        return None
"""

_GROW_HEAD = """
    gpu, have, bs = self.gpu_allocator, table.num_tokens, self.block_size
    upto = len(seq) if num_new_tokens is None else have + num_new_tokens
    if not have <= upto <= len(seq):
        raise ValueError(f"sequence {seq.seq_id}: slots for {upto} tokens asked")
"""

_GROW_TAIL = """
    new = gpu.allocate_many(needed)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    copies = self.copy_on_write(table, gpu, lambda: new.pop(0)) if cow else []
    table.block_ids += new
    table.num_tokens = upto
    if self.prefix_cache is not None:
        self.prefix_cache.insert(seq, table.block_ids, have // bs, upto // bs)
    return NewBlocks(new, copies)
"""

MUTANTS = {
    "ch05.ex7": {
        "lets every full block hit (the whole prompt may come from cache)": """
            if self.prefix_cache is None:
                return []
            return self.prefix_cache.lookup(seq, len(seq) // self.block_size)
        """,
        "leaves one block too many to compute": """
            if self.prefix_cache is None:
                return []
            return self.prefix_cache.lookup(seq, len(seq) // self.block_size - 1)
        """,
        "records the query at the lookup (not pure)": """
            if self.prefix_cache is None:
                return []
            hits = self.prefix_cache.lookup(seq, (len(seq) - 1) // self.block_size)
            self.prefix_cache.record_query(len(seq), len(hits) * self.block_size)
            return hits
        """,
        "forgets that prefix caching may be off": """
            return self.prefix_cache.lookup(seq, (len(seq) - 1) // self.block_size)
        """,
        "looks up twice to trim the last block": """
            if self.prefix_cache is None:
                return []
            hits = self.prefix_cache.lookup(seq, len(seq) // self.block_size)
            if len(hits) * self.block_size >= len(seq):
                hits = self.prefix_cache.lookup(seq, len(hits) - 1)
            return hits
        """,
        "caps the hits by the prompt alone (a grown sequence admitted again recomputes its generated blocks)": """
            if self.prefix_cache is None:
                return []
            return self.prefix_cache.lookup(seq, (seq.num_prompt_tokens - 1) // self.block_size)
        """,
    },
    "ch05.ex8": {
        "watermark ignores free cached hits": _ADMIT_HEAD
        + """
    if gpu.num_free_blocks - num_new < self.watermark_blocks:
        return None
"""
        + _ADMIT_CLAIM
        + _ADMIT_TAIL,
        "watermark compared strictly (refuses at exactly the watermark)": _ADMIT_HEAD
        + """
    idle_hits = sum(gpu.ref_count(b) == 0 for b in hits)
    if gpu.num_free_blocks - num_new - idle_hits <= self.watermark_blocks:
        return None
"""
        + _ADMIT_CLAIM
        + _ADMIT_TAIL,
        "allocates the fresh blocks before claiming the hits": _ADMIT_HEAD
        + _WATERMARK
        + """
    new = gpu.allocate_many(num_new)
    for b in hits:
        if gpu.ref_count(b):
            gpu.incref(b)
        else:
            gpu.take(b)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    table = BlockTable(bs, hits + new, num_tokens)
    self.block_tables[seq.seq_id] = table
    seq.num_cached_tokens = seq.num_computed_tokens = cached
    if self.prefix_cache is not None:
        self.prefix_cache.record_query(len(seq), cached)
        self.prefix_cache.insert(seq, table.block_ids, len(hits), num_tokens // bs)
    return NewBlocks(list(table.block_ids))
""",
        "never evicts the fresh blocks from the prefix cache": _ADMIT_HEAD
        + _WATERMARK
        + _ADMIT_CLAIM
        + """
    new = gpu.allocate_many(num_new)
    table = BlockTable(bs, hits + new, num_tokens)
    self.block_tables[seq.seq_id] = table
    seq.num_cached_tokens = seq.num_computed_tokens = cached
    if self.prefix_cache is not None:
        self.prefix_cache.record_query(len(seq), cached)
        self.prefix_cache.insert(seq, table.block_ids, len(hits), num_tokens // bs)
    return NewBlocks(list(table.block_ids))
""",
        "builds the table on the caller's computed list (modifies it)": """
    if seq.seq_id in self.swap.tables:
        raise ValueError(f"sequence {seq.seq_id} is swapped out")
    gpu, bs = self.gpu_allocator, self.block_size
    hits = self.get_computed_blocks(seq) if computed is None else computed
    cached = len(hits) * bs
    num_tokens = len(seq) if num_new_tokens is None else cached + num_new_tokens
    num_new = blocks_needed(num_tokens, bs) - len(hits)
    idle_hits = sum(gpu.ref_count(b) == 0 for b in hits)
    if gpu.num_free_blocks - num_new - idle_hits < self.watermark_blocks:
        return None
    for b in hits:
        if gpu.ref_count(b):
            gpu.incref(b)
        else:
            gpu.take(b)
    first = len(hits)
    hits += gpu.allocate_many(num_new)
    if self.prefix_cache is not None:
        for b in hits[first:]:
            self.prefix_cache.evict(b)
    table = BlockTable(bs, hits, num_tokens)
    self.block_tables[seq.seq_id] = table
    seq.num_cached_tokens = seq.num_computed_tokens = cached
    if self.prefix_cache is not None:
        self.prefix_cache.record_query(len(seq), cached)
        self.prefix_cache.insert(seq, table.block_ids, first, num_tokens // bs)
    return NewBlocks(list(table.block_ids))
""",
        "looks the prefix up again although computed blocks are given": """
    if seq.seq_id in self.swap.tables:
        raise ValueError(f"sequence {seq.seq_id} is swapped out")
    gpu, bs = self.gpu_allocator, self.block_size
    hits = self.get_computed_blocks(seq)
    cached = len(hits) * bs
    num_tokens = len(seq) if num_new_tokens is None else cached + num_new_tokens
    num_new = blocks_needed(num_tokens, bs) - len(hits)
"""
        + _WATERMARK
        + _ADMIT_CLAIM
        + _ADMIT_TAIL,
        "counts free hits by scanning the free queue": _ADMIT_HEAD
        + """
    queue = gpu.free_queue()
    idle_hits = sum(b in queue for b in hits)
    if gpu.num_free_blocks - num_new - idle_hits < self.watermark_blocks:
        return None
"""
        + _ADMIT_CLAIM
        + _ADMIT_TAIL,
        "leaves num_computed_tokens at 0 (recomputes the shared prefix)": _ADMIT_HEAD
        + _WATERMARK
        + _ADMIT_CLAIM
        + """
    new = gpu.allocate_many(num_new)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    table = BlockTable(bs, hits + new, num_tokens)
    self.block_tables[seq.seq_id] = table
    seq.num_cached_tokens = cached
    if self.prefix_cache is not None:
        self.prefix_cache.record_query(len(seq), cached)
        self.prefix_cache.insert(seq, table.block_ids, len(hits), num_tokens // bs)
    return NewBlocks(list(table.block_ids))
""",
    },
    "ch05.ex9": {
        "applies the watermark to growth": _GROW_HEAD
        + """
    cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
    needed = blocks_needed(upto, bs) - len(table) + cow
    if needed > gpu.num_free_blocks - self.watermark_blocks:
        return None
"""
        + _GROW_TAIL,
        "forgets the copy-on-write block in the count": _GROW_HEAD
        + """
    cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
    needed = blocks_needed(upto, bs) - len(table)
    if needed > gpu.num_free_blocks:
        return None
    new = gpu.allocate_many(needed)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    copies = self.copy_on_write(table, gpu, lambda: self.gpu_allocator.allocate_many(1)[0]) if cow else []
    table.block_ids += new
    table.num_tokens = upto
    if self.prefix_cache is not None:
        self.prefix_cache.insert(seq, table.block_ids, have // bs, upto // bs)
    return NewBlocks(new, copies)
""",
        "copies a shared last block even when it is full": _GROW_HEAD
        + """
    cow = upto > have and gpu.ref_count(table.block_ids[-1]) > 1
    needed = blocks_needed(upto, bs) - len(table) + cow
    if needed > gpu.num_free_blocks:
        return None
    new = gpu.allocate_many(needed)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    copies = []
    if cow:
        shared = table.block_ids[-1]
        table.block_ids[-1] = new.pop(0)
        gpu.free_many([shared])
        copies = [(shared, table.block_ids[-1])]
    table.block_ids += new
    table.num_tokens = upto
    if self.prefix_cache is not None:
        self.prefix_cache.insert(seq, table.block_ids, have // bs, upto // bs)
    return NewBlocks(new, copies)
""",
        "never caches the blocks growth fills": _GROW_HEAD
        + """
    cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
    needed = blocks_needed(upto, bs) - len(table) + cow
    if needed > gpu.num_free_blocks:
        return None
    new = gpu.allocate_many(needed)
    if self.prefix_cache is not None:
        for b in new:
            self.prefix_cache.evict(b)
    copies = self.copy_on_write(table, gpu, lambda: new.pop(0)) if cow else []
    table.block_ids += new
    table.num_tokens = upto
    return NewBlocks(new, copies)
""",
        "never evicts the fresh blocks from the prefix cache": _GROW_HEAD
        + """
    cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
    needed = blocks_needed(upto, bs) - len(table) + cow
    if needed > gpu.num_free_blocks:
        return None
    new = gpu.allocate_many(needed)
    copies = self.copy_on_write(table, gpu, lambda: new.pop(0)) if cow else []
    table.block_ids += new
    table.num_tokens = upto
    if self.prefix_cache is not None:
        self.prefix_cache.insert(seq, table.block_ids, have // bs, upto // bs)
    return NewBlocks(new, copies)
""",
        "counts the free blocks by listing the free queue": _GROW_HEAD
        + """
    cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
    needed = blocks_needed(upto, bs) - len(table) + cow
    if needed > len(gpu.free_queue()):
        return None
"""
        + _GROW_TAIL,
        "does not check the request against the sequence": """
    gpu, have, bs = self.gpu_allocator, table.num_tokens, self.block_size
    upto = len(seq) if num_new_tokens is None else have + num_new_tokens
    cow = upto > have and have % bs != 0 and gpu.ref_count(table.block_ids[-1]) > 1
    needed = max(blocks_needed(upto, bs) - len(table), 0) + cow
    if needed > gpu.num_free_blocks:
        return None
"""
        + _GROW_TAIL,
    },
    "ch05.ex10": {
        "frees the head first": """
            table = self.block_tables.pop(seq.seq_id, None)
            if table is not None:
                self.gpu_allocator.free_many(table.block_ids)
                self.forget_swap_copies(table)
            self.swap.free(seq.seq_id)
        """,
        "evicts the freed blocks from the prefix cache": """
            table = self.block_tables.pop(seq.seq_id, None)
            if table is not None:
                self.gpu_allocator.free_many(reversed(table.block_ids))
                self.forget_swap_copies(table)
                if self.prefix_cache is not None:
                    for b in table.block_ids:
                        if self.gpu_allocator.ref_count(b) == 0:
                            self.prefix_cache.evict(b)
            self.swap.free(seq.seq_id)
        """,
        "keeps the table (a second free frees again)": """
            table = self.block_tables.get(seq.seq_id)
            if table is not None:
                self.gpu_allocator.free_many(reversed(table.block_ids))
                self.forget_swap_copies(table)
            self.swap.free(seq.seq_id)
        """,
        "raises for a sequence without blocks": """
            table = self.block_tables.pop(seq.seq_id)
            self.gpu_allocator.free_many(reversed(table.block_ids))
            self.forget_swap_copies(table)
            self.swap.free(seq.seq_id)
        """,
        "forgets the CPU blocks of a swapped-out sequence": """
            table = self.block_tables.pop(seq.seq_id, None)
            if table is not None:
                self.gpu_allocator.free_many(reversed(table.block_ids))
                self.forget_swap_copies(table)
        """,
        "frees shared blocks for every holder": """
            table = self.block_tables.pop(seq.seq_id, None)
            if table is not None:
                for b in reversed(table.block_ids):
                    while self.gpu_allocator.ref_count(b):
                        self.gpu_allocator.free_many([b])
                self.forget_swap_copies(table)
            self.swap.free(seq.seq_id)
        """,
    },
}
