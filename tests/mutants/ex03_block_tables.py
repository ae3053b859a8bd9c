"""Planted wrong answers for ``solutions/ex03_block_tables.py`` (``python -m paged course mutants``)."""

MUTANTS = {
    "ch03.ex1": {
        "block index from (p + 1) // bs (off by one at every block boundary)": """
            slots = []
            for table, start, n in zip(block_tables, start_positions, num_tokens):
                for p in range(start, start + n):
                    slots.append(table[min((p + 1) // block_size, len(table) - 1)] * block_size + p % block_size)
            return slots
        """,
        "logical block instead of the physical one (the table is never read)": """
            slots = []
            for table, start, n in zip(block_tables, start_positions, num_tokens):
                for p in range(start, start + n):
                    slots.append(p)
            return slots
        """,
        "positions counted from 0 instead of the start (chunks and decodes wrong)": """
            slots = []
            for table, start, n in zip(block_tables, start_positions, num_tokens):
                for p in range(n):
                    slots.append(table[p // block_size] * block_size + p % block_size)
            return slots
        """,
        "offset and block swapped (table[p % bs] * bs + p // bs)": """
            slots = []
            for table, start, n in zip(block_tables, start_positions, num_tokens):
                for p in range(start, start + n):
                    slots.append(table[p % block_size % len(table)] * block_size + p // block_size)
            return slots
        """,
        "returns a tensor, not the engine's list of ints": """
            import torch
            return torch.tensor([table[p // block_size] * block_size + p % block_size
                                 for table, start, n in zip(block_tables, start_positions, num_tokens)
                                 for p in range(start, start + n)], dtype=torch.int64)
        """,
    },
    "ch03.ex2": {
        "padding slot -1 written to the last row": """
            flat_k = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            flat_k[slot_mapping] = key.to(key_cache.dtype)
            flat_v[slot_mapping] = value.to(value_cache.dtype)
        """,
        "writes into a copy of the pool (reshape().clone())": """
            keep = slot_mapping >= 0
            slots = slot_mapping[keep]
            flat_k = key_cache.reshape(num_blocks * block_size, num_kv_heads, head_dim).clone()
            flat_v = value_cache.reshape(num_blocks * block_size, num_kv_heads, head_dim).clone()
            flat_k.index_copy_(0, slots, key[keep].to(key_cache.dtype))
            flat_v.index_copy_(0, slots, value[keep].to(value_cache.dtype))
        """,
        "block and offset swapped (slot % num_blocks, slot // num_blocks)": """
            keep = slot_mapping >= 0
            slots = slot_mapping[keep]
            key_cache[slots % num_blocks, slots // num_blocks % block_size] = key[keep].to(key_cache.dtype)
            value_cache[slots % num_blocks, slots // num_blocks % block_size] = value[keep].to(value_cache.dtype)
        """,
        "keys into both caches": """
            keep = slot_mapping >= 0
            slots = slot_mapping[keep]
            key_cache.view(-1, num_kv_heads, head_dim)[slots] = key[keep].to(key_cache.dtype)
            value_cache.view(-1, num_kv_heads, head_dim)[slots] = key[keep].to(value_cache.dtype)
        """,
    },
    "ch03.ex3": {
        "raw table indexing (-1 wraps around, stale ids beyond the pool)": """
            width = block_tables.shape[1]
            key = key_cache[block_tables.long()].flatten(1, 2)
            value = value_cache[block_tables.long()].flatten(1, 2)
            valid = torch.arange(width * block_size) < context_lens.long()[:, None]
            return key, value, valid
        """,
        "replaces only the -1 padding (stale ids still index the pool)": """
            width = block_tables.shape[1]
            table = block_tables.long().clamp(min=0)
            key = key_cache[table].flatten(1, 2)
            value = value_cache[table].flatten(1, 2)
            valid = torch.arange(width * block_size) < context_lens.long()[:, None]
            return key, value, valid
        """,
        "counts used blocks with floor division (the partial last block is dropped)": """
            width = block_tables.shape[1]
            lens = context_lens.long()
            used = torch.arange(width) < (lens // block_size)[:, None]
            table = torch.where(used, block_tables.long(), 0)
            key = key_cache[table].flatten(1, 2)
            value = value_cache[table].flatten(1, 2)
            valid = torch.arange(width * block_size) < lens[:, None]
            return key, value, valid
        """,
        "valid is p <= context_len (one position too many)": """
            width = block_tables.shape[1]
            lens = context_lens.long()
            used = torch.arange(width) < ((lens + block_size - 1) // block_size)[:, None]
            table = torch.where(used, block_tables.long(), 0)
            key = key_cache[table].flatten(1, 2)
            value = value_cache[table].flatten(1, 2)
            valid = torch.arange(width * block_size) <= lens[:, None]
            return key, value, valid
        """,
        "positions flattened offset-major ([S, bs, W] instead of [S, W, bs])": """
            width = block_tables.shape[1]
            lens = context_lens.long()
            used = torch.arange(width) < ((lens + block_size - 1) // block_size)[:, None]
            table = torch.where(used, block_tables.long(), 0)
            key = key_cache[table].transpose(1, 2).flatten(1, 2)
            value = value_cache[table].transpose(1, 2).flatten(1, 2)
            valid = torch.arange(width * block_size) < lens[:, None]
            return key, value, valid
        """,
    },
    "ch03.ex4": {
        "ignores its scale (head_dim ** -0.5)": """
            group = num_heads // num_kv_heads
            q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
            keep = valid[:, :, None, None]
            k = torch.where(keep, key.float(), 0.0)
            v = torch.where(keep, value.float(), 0.0)
            scores = torch.einsum("skgd,slkd->skgl", q, k) * head_dim ** -0.5
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
            out = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), v)
            return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
        """,
        "masks the scores only (0 x NaN leaks from the values)": """
            group = num_heads // num_kv_heads
            q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
            k = torch.where(valid[:, :, None, None], key.float(), 0.0)
            scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
            out = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), value.float())
            return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
        """,
        "zeroes the padding but never masks its scores": """
            group = num_heads // num_kv_heads
            q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
            keep = valid[:, :, None, None]
            k = torch.where(keep, key.float(), 0.0)
            v = torch.where(keep, value.float(), 0.0)
            scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
            out = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), v)
            return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
        """,
        "GQA heads interleaved (head h reads KV head h % num_kv_heads)": """
            group = num_heads // num_kv_heads
            q = query.float().view(num_seqs, group, num_kv_heads, head_dim).transpose(1, 2)
            keep = valid[:, :, None, None]
            k = torch.where(keep, key.float(), 0.0)
            v = torch.where(keep, value.float(), 0.0)
            scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
            out = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), v)
            return out.transpose(1, 2).reshape(num_seqs, num_heads, head_dim).to(query.dtype)
        """,
        "softmax in the input dtype (fp16 scores overflow)": """
            group = num_heads // num_kv_heads
            q = query.view(num_seqs, num_kv_heads, group, head_dim)
            keep = valid[:, :, None, None]
            k = torch.where(keep, key, 0.0)
            v = torch.where(keep, value, 0.0)
            scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
            out = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), v)
            return out.reshape(num_seqs, num_heads, head_dim)
        """,
        "returns float32 for every input dtype": """
            group = num_heads // num_kv_heads
            q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
            keep = valid[:, :, None, None]
            k = torch.where(keep, key.float(), 0.0)
            v = torch.where(keep, value.float(), 0.0)
            scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
            scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
            out = torch.einsum("skgl,slkd->skgd", torch.softmax(scores, dim=-1), v)
            return out.reshape(num_seqs, num_heads, head_dim)
        """,
    },
}
