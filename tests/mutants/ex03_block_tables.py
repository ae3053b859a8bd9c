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

_ATTENTION = """
group = num_heads // num_kv_heads
q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
keep = valid[:, :, None, None]
k = torch.where(keep, key.float(), 0.0)
v = torch.where(keep, value.float(), 0.0)
scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
probs = torch.softmax(scores, dim=-1)
out = torch.einsum("skgl,slkd->skgd", probs, v)
return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
"""


def _attention(old: str, new: str) -> str:
    assert old in _ATTENTION, old
    return _ATTENTION.replace(old, new)


# Wrong answers that pass the hand-made cases: inputs changed, right at one position of the batch only.
MUTANTS["ch03.ex1"].update(
    {
        "advances the caller's start_positions while it walks them": """
            slots = []
            for s, table in enumerate(block_tables):
                for _ in range(num_tokens[s]):
                    p = start_positions[s]
                    slots.append(table[p // block_size] * block_size + p % block_size)
                    start_positions[s] += 1
            return slots
        """,
        "a chunk that crosses a block edge stays in its first block": """
            slots = []
            for table, start, n in zip(block_tables, start_positions, num_tokens):
                block = table[start // block_size]
                for p in range(start, start + n):
                    slots.append(block * block_size + p % block_size)
            return slots
        """,
        "a sequence with no tokens ends the batch": """
            slots = []
            for table, start, n in zip(block_tables, start_positions, num_tokens):
                if n == 0:
                    break
                for p in range(start, start + n):
                    slots.append(table[p // block_size] * block_size + p % block_size)
            return slots
        """,
    }
)
MUTANTS["ch03.ex2"].update(
    {
        "padding assumed at the end of the batch (as vLLM pads)": """
            n = int((slot_mapping >= 0).sum())
            flat_k = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            flat_k[slot_mapping[:n]] = key[:n].to(key_cache.dtype)
            flat_v[slot_mapping[:n]] = value[:n].to(value_cache.dtype)
        """,
        "a loop over the tokens that stops at the first -1": """
            flat_k = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            for i, slot in enumerate(slot_mapping.tolist()):
                if slot < 0:
                    break
                flat_k[slot] = key[i]
                flat_v[slot] = value[i]
        """,
        "parks the padding on slot 0 of the caller's slot mapping": """
            pad = slot_mapping < 0
            slot_mapping[pad] = 0
            flat_k = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
            before_k, before_v = flat_k[0].clone(), flat_v[0].clone()
            flat_k[slot_mapping] = key.to(key_cache.dtype)
            flat_v[slot_mapping] = value.to(value_cache.dtype)
            if pad.any() and not (slot_mapping[~pad] == 0).any():
                flat_k[0], flat_v[0] = before_k, before_v
        """,
    }
)
MUTANTS["ch03.ex3"].update(
    {
        "swaps the unused entries for block 0 in the caller's table": """
            width = block_tables.shape[1]
            lens = context_lens.long()
            used = torch.arange(width) < ((lens + block_size - 1) // block_size)[:, None]
            block_tables[~used] = 0
            table = block_tables.long()
            key = key_cache[table].flatten(1, 2)
            value = value_cache[table].flatten(1, 2)
            valid = torch.arange(width * block_size) < lens[:, None]
            return key, value, valid
        """,
        "one block count for the whole batch (the first sequence's)": """
            width = block_tables.shape[1]
            lens = context_lens.long()
            used_blocks = -(-int(lens[0]) // block_size)
            table = block_tables.long().clone()
            table[:, used_blocks:] = 0
            key = key_cache[table].flatten(1, 2)
            value = value_cache[table].flatten(1, 2)
            valid = torch.arange(width * block_size) < lens[:, None]
            return key, value, valid
        """,
        "one block count for the whole batch (the longest sequence's)": """
            width = block_tables.shape[1]
            lens = context_lens.long()
            used_blocks = -(-int(lens.max()) // block_size)
            table = block_tables.long().clone()
            table[:, used_blocks:] = 0  # a shorter row's stale ids inside that width still index the pool
            key = key_cache[table].flatten(1, 2)
            value = value_cache[table].flatten(1, 2)
            valid = torch.arange(width * block_size) < lens[:, None]
            return key, value, valid
        """,
    }
)
MUTANTS["ch03.ex4"].update(
    {
        "scales the caller's query in place (float32: .float() is no copy)": _attention(
            "q = query.float().view(num_seqs, num_kv_heads, group, head_dim)",
            "q = query.float().mul_(scale).view(num_seqs, num_kv_heads, group, head_dim)",
        ).replace(
            'torch.einsum("skgd,slkd->skgl", q, k) * scale', 'torch.einsum("skgd,slkd->skgl", q, k)'
        ),
        "a hand-written softmax without the row max (exp overflows)": _attention(
            "probs = torch.softmax(scores, dim=-1)",
            "probs = torch.exp(scores)\nprobs = probs / probs.sum(dim=-1, keepdim=True)",
        ),
        "one mask for the whole batch (the first sequence's)": _attention(
            'scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))',
            'scores = scores.masked_fill(~valid[:1, None, None, :], float("-inf"))',
        ),
    }
)
