"""Planted wrong answers for ``solutions/ex02_allocator.py`` (``python -m paged course mutants``)."""

MUTANTS = {
    "ch02.ex1": {
        "hands out the back of the free list": """
            if not self.free_list:
                raise NoFreeBlocksError(1, 0)
            block_id = self.free_list.pop()
            self.ref_counts[block_id] = 1
            return block_id
        """,
        "forgets the reference count": """
            if not self.free_list:
                raise NoFreeBlocksError(1, 0)
            return self.free_list.popleft()
        """,
        "raises the wrong counts": """
            if not self.free_list:
                raise NoFreeBlocksError(0, 0)
            block_id = self.free_list.popleft()
            self.ref_counts[block_id] = 1
            return block_id
        """,
    },
}
