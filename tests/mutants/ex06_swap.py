"""Planted wrong answers for ``solutions/ex06_swap.py`` (``python -m paged course mutants ch06``)."""

from textwrap import dedent


def _join(*parts: str) -> str:
    """One region body from pieces written at different indents."""
    return "".join(dedent(part) for part in parts)


_OUT_LOOP = """
    pairs, cpu_ids = [], []
    for gpu_block in table:
        cpu_block = maps.out.get(gpu_block)
        if cpu_block is None:
            cpu_block = cpu.allocate()
            maps.remember(gpu_block, cpu_block, out=True)
            pairs.append((gpu_block, cpu_block))
        else:
            cpu.incref(cpu_block)
        cpu_ids.append(cpu_block)
    self.tables[seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
    return pairs
"""

_IN_LOOP = """
    cpu_table = self.tables.pop(seq_id)
    pairs, gpu_ids = [], []
    for cpu_block in cpu_table:
        gpu_block = maps.in_.get(cpu_block)
        if gpu_block is None:
            gpu_block = allocate_gpu()
            maps.remember(cpu_block, gpu_block, out=False)
            pairs.append((cpu_block, gpu_block))
        else:
            gpu_allocator.incref(gpu_block)
        gpu_ids.append(gpu_block)
"""

_IN_RETURN = """
    return pairs, BlockTable(self.block_size, gpu_ids, cpu_table.num_tokens)
"""

MUTANTS = {
    "ch06.ex6": {
        "counts every block of the table against the free CPU blocks": _join(
            """
            if len(table) > cpu.num_free_blocks:
                return None
        """,
            _OUT_LOOP,
        ),
        "refuses when the free CPU blocks exactly suffice": _join(
            """
            if sum(b not in maps.out for b in table) >= cpu.num_free_blocks:
                return None
        """,
            _OUT_LOOP,
        ),
        "never checks the CPU pool (the allocator raises instead of None)": _OUT_LOOP,
        "copies every block again (no reuse of a sibling's copy)": """
            if len(table) > cpu.num_free_blocks:
                return None
            pairs = [(b, cpu.allocate()) for b in table]
            for g, c in pairs:
                maps.remember(g, c, out=True)
            self.tables[seq_id] = BlockTable(self.block_size, [c for _, c in pairs], table.num_tokens)
            return pairs
        """,
        "reuses a copy without a reference for the new holder": """
            if sum(b not in maps.out for b in table) > cpu.num_free_blocks:
                return None
            pairs, cpu_ids = [], []
            for gpu_block in table:
                cpu_block = maps.out.get(gpu_block)
                if cpu_block is None:
                    cpu_block = cpu.allocate()
                    maps.remember(gpu_block, cpu_block, out=True)
                    pairs.append((gpu_block, cpu_block))
                cpu_ids.append(cpu_block)
            self.tables[seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
            return pairs
        """,
        "lists the reused blocks among the copies to make": """
            if sum(b not in maps.out for b in table) > cpu.num_free_blocks:
                return None
            pairs, cpu_ids = [], []
            for gpu_block in table:
                cpu_block = maps.out.get(gpu_block)
                if cpu_block is None:
                    cpu_block = cpu.allocate()
                    maps.remember(gpu_block, cpu_block, out=True)
                else:
                    cpu.incref(cpu_block)
                pairs.append((gpu_block, cpu_block))
                cpu_ids.append(cpu_block)
            self.tables[seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
            return pairs
        """,
        "records the copy in maps.out only (its inverse not kept)": """
            if sum(b not in maps.out for b in table) > cpu.num_free_blocks:
                return None
            pairs, cpu_ids = [], []
            for gpu_block in table:
                cpu_block = maps.out.get(gpu_block)
                if cpu_block is None:
                    cpu_block = cpu.allocate()
                    maps.out[gpu_block] = cpu_block
                    pairs.append((gpu_block, cpu_block))
                else:
                    cpu.incref(cpu_block)
                cpu_ids.append(cpu_block)
            self.tables[seq_id] = BlockTable(self.block_size, cpu_ids, table.num_tokens)
            return pairs
        """,
        "the CPU table says its blocks are full": """
            if sum(b not in maps.out for b in table) > cpu.num_free_blocks:
                return None
            pairs, cpu_ids = [], []
            for gpu_block in table:
                cpu_block = maps.out.get(gpu_block)
                if cpu_block is None:
                    cpu_block = cpu.allocate()
                    maps.remember(gpu_block, cpu_block, out=True)
                    pairs.append((gpu_block, cpu_block))
                else:
                    cpu.incref(cpu_block)
                cpu_ids.append(cpu_block)
            self.tables[seq_id] = BlockTable(self.block_size, cpu_ids)
            return pairs
        """,
    },
    "ch06.ex7": {
        "frees the CPU blocks head first": _join(
            _IN_LOOP,
            """
            cpu.free_many(cpu_table.block_ids)
            for cpu_block in cpu_table:
                if cpu.ref_count(cpu_block) == 0:
                    maps.forget_cpu(cpu_block)
        """,
            _IN_RETURN,
        ),
        "forgets nothing (a freed CPU block keeps its copy back)": _join(
            _IN_LOOP,
            """
            cpu.free_many(reversed(cpu_table.block_ids))
        """,
            _IN_RETURN,
        ),
        "forgets every CPU block of the table, freed or still shared": _join(
            _IN_LOOP,
            """
            cpu.free_many(reversed(cpu_table.block_ids))
            for cpu_block in cpu_table:
                maps.forget_cpu(cpu_block)
        """,
            _IN_RETURN,
        ),
        "gives the CPU blocks back before bringing the table in": _join(
            """
            cpu_table = self.tables.pop(seq_id)
            cpu.free_many(reversed(cpu_table.block_ids))
            for cpu_block in cpu_table:
                if cpu.ref_count(cpu_block) == 0:
                    maps.forget_cpu(cpu_block)
            pairs, gpu_ids = [], []
            for cpu_block in cpu_table:
                gpu_block = maps.in_.get(cpu_block)
                if gpu_block is None:
                    gpu_block = allocate_gpu()
                    maps.remember(cpu_block, gpu_block, out=False)
                    pairs.append((cpu_block, gpu_block))
                else:
                    gpu_allocator.incref(gpu_block)
                gpu_ids.append(gpu_block)
        """,
            _IN_RETURN,
        ),
        "counts the reused GPU block on the CPU allocator": _join(
            """
            cpu_table = self.tables.pop(seq_id)
            pairs, gpu_ids = [], []
            for cpu_block in cpu_table:
                gpu_block = maps.in_.get(cpu_block)
                if gpu_block is None:
                    gpu_block = allocate_gpu()
                    maps.remember(cpu_block, gpu_block, out=False)
                    pairs.append((cpu_block, gpu_block))
                else:
                    cpu.incref(cpu_block)
                gpu_ids.append(gpu_block)
            cpu.free_many(reversed(cpu_table.block_ids))
            for cpu_block in cpu_table:
                if cpu.ref_count(cpu_block) == 0:
                    maps.forget_cpu(cpu_block)
        """,
            _IN_RETURN,
        ),
        "copies every block back (no reuse of a sibling's copy)": _join(
            """
            cpu_table = self.tables.pop(seq_id)
            pairs = [(c, allocate_gpu()) for c in cpu_table]
            for c, g in pairs:
                maps.remember(c, g, out=False)
            gpu_ids = [g for _, g in pairs]
            cpu.free_many(reversed(cpu_table.block_ids))
            for cpu_block in cpu_table:
                if cpu.ref_count(cpu_block) == 0:
                    maps.forget_cpu(cpu_block)
        """,
            _IN_RETURN,
        ),
        "keeps the CPU table after the swap-in": _join(
            """
            cpu_table = self.tables[seq_id]
            pairs, gpu_ids = [], []
            for cpu_block in cpu_table:
                gpu_block = maps.in_.get(cpu_block)
                if gpu_block is None:
                    gpu_block = allocate_gpu()
                    maps.remember(cpu_block, gpu_block, out=False)
                    pairs.append((cpu_block, gpu_block))
                else:
                    gpu_allocator.incref(gpu_block)
                gpu_ids.append(gpu_block)
            cpu.free_many(reversed(cpu_table.block_ids))
            for cpu_block in cpu_table:
                if cpu.ref_count(cpu_block) == 0:
                    maps.forget_cpu(cpu_block)
        """,
            _IN_RETURN,
        ),
    },
}
