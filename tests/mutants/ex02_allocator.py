"""Planted wrong answers for ``solutions/ex02_allocator.py`` (``python -m paged course mutants``)."""

_QUEUE = """
def __init__(self, num_blocks: int):
    self._end = num_blocks
    self._next = [i + 1 for i in range(num_blocks)] + [0]
    self._prev = [i - 1 for i in range(num_blocks + 1)]
    self._prev[0] = num_blocks
    self._size = num_blocks

def _unlink(self, block_id: int) -> None:
    before, after = self._prev[block_id], self._next[block_id]
    self._next[before], self._prev[after] = after, before
    self._size -= 1

def popleft(self) -> int:
    if not self._size:
        raise IndexError("popleft from an empty free queue")
    front = self._next[self._end]
    self._unlink(front)
    return front

def append(self, block_id: int) -> None:
    back = self._prev[self._end]
    self._next[back], self._prev[block_id] = block_id, back
    self._next[block_id], self._prev[self._end] = self._end, block_id
    self._size += 1

def remove(self, block_id: int) -> None:
    self._unlink(block_id)

def __len__(self) -> int:
    return self._size

def __iter__(self):
    block_id = self._next[self._end]
    while block_id != self._end:
        yield block_id
        block_id = self._next[block_id]
"""


def _queue(old: str, new: str) -> str:
    assert old in _QUEUE, old
    return _QUEUE.replace(old, new)


MUTANTS = {
    "ch02.ex1": {
        "popleft hands out the back of the queue": _queue(
            "front = self._next[self._end]", "front = self._prev[self._end]"
        ),
        "append puts the block at the front": _queue(
            """    back = self._prev[self._end]
    self._next[back], self._prev[block_id] = block_id, back
    self._next[block_id], self._prev[self._end] = self._end, block_id""",
            """    front = self._next[self._end]
    self._prev[front], self._next[block_id] = block_id, front
    self._prev[block_id], self._next[self._end] = self._end, block_id""",
        ),
        "unlinking forgets the backward link": _queue(
            "self._next[before], self._prev[after] = after, before", "self._next[before] = after"
        ),
        "remove forgets to count": _queue(
            """def remove(self, block_id: int) -> None:
    self._unlink(block_id)""",
            """def remove(self, block_id: int) -> None:
    self._unlink(block_id)
    self._size += 1""",
        ),
        "a plain list that removes by position instead of by id": """
            def __init__(self, num_blocks: int):
                self._ids = list(range(num_blocks))

            def popleft(self) -> int:
                return self._ids.pop(0)

            def append(self, block_id: int) -> None:
                self._ids.append(block_id)

            def remove(self, block_id: int) -> None:
                del self._ids[block_id if block_id < len(self._ids) else -1]

            def __len__(self) -> int:
                return len(self._ids)

            def __iter__(self):
                return iter(self._ids)
        """,
    },
    "ch02.ex2": {
        "not all or nothing: takes what it can, then raises": """
            taken = []
            while len(taken) < n:
                if not len(self._free):
                    raise NoFreeBlocksError(n, len(taken))
                block_id = self._free.popleft()
                self._ref_counts[block_id] = 1
                taken.append(block_id)
            return taken
        """,
        "the new blocks keep count 0": """
            if n > len(self._free):
                raise NoFreeBlocksError(n, len(self._free))
            return [self._free.popleft() for _ in range(n)]
        """,
        "refuses when exactly n are free": """
            if n >= len(self._free) and n:
                raise NoFreeBlocksError(n, len(self._free))
            taken = [self._free.popleft() for _ in range(n)]
            for block_id in taken:
                self._ref_counts[block_id] = 1
            return taken
        """,
        "the error's counts swapped": """
            if n > len(self._free):
                raise NoFreeBlocksError(len(self._free), n)
            taken = [self._free.popleft() for _ in range(n)]
            for block_id in taken:
                self._ref_counts[block_id] = 1
            return taken
        """,
        "hands out the lowest free ids instead of the queue front": """
            if n > len(self._free):
                raise NoFreeBlocksError(n, len(self._free))
            taken = sorted(self._free)[:n]
            for block_id in taken:
                self._free.remove(block_id)
                self._ref_counts[block_id] = 1
            return taken
        """,
    },
    "ch02.ex3": {
        "negative ids pass (Python indexing wraps them)": """
            if type(block_id) is not int or block_id >= self.num_blocks:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            count = self._ref_counts[block_id]
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
        "floats pass as ids": """
            if not 0 <= block_id < self.num_blocks if isinstance(block_id, (int, float)) else True:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            count = self._ref_counts[int(block_id)]
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
        "a free block passes the in-use check": """
            if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            return self._ref_counts[block_id]
        """,
        "the message does not say which id or range": """
            if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
                raise ValueError(f"{op}: invalid block id")
            count = self._ref_counts[block_id]
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
        "range off by one at the top": """
            if type(block_id) is not int or not 0 <= block_id <= self.num_blocks:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            count = self._ref_counts[block_id] if block_id < self.num_blocks else 1
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
    },
    "ch02.ex4": {
        "frees while checking: not all or nothing": """
            for block_id in block_ids:
                self._check(block_id, "free")
                self._ref_counts[block_id] -= 1
                if not self._ref_counts[block_id]:
                    self._free.append(block_id)
        """,
        "an id listed twice is checked once": """
            for block_id in block_ids:
                self._check(block_id, "free")
            for block_id in block_ids:
                self._ref_counts[block_id] = max(self._ref_counts[block_id] - 1, 0)
                if not self._ref_counts[block_id] and block_id not in self._free:
                    self._free.append(block_id)
        """,
        "a shared block returns to the queue with holders left": """
            listed: dict[int, int] = {}
            for block_id in block_ids:
                count = self._check(block_id, "free")
                listed[block_id] = listed.get(block_id, 0) + 1
                if listed[block_id] > count:
                    raise ValueError(f"free: block {block_id} is listed too often")
            for block_id in block_ids:
                self._ref_counts[block_id] -= 1
                if self._ref_counts[block_id] <= 1 and block_id not in self._free:
                    self._free.append(block_id)
        """,
        "releases in reverse order": """
            listed: dict[int, int] = {}
            for block_id in block_ids:
                count = self._check(block_id, "free")
                listed[block_id] = listed.get(block_id, 0) + 1
                if listed[block_id] > count:
                    raise ValueError(f"free: block {block_id} is listed too often")
            for block_id in reversed(block_ids):
                self._ref_counts[block_id] -= 1
                if not self._ref_counts[block_id]:
                    self._free.append(block_id)
        """,
        "counts drop, blocks never return to the queue": """
            listed: dict[int, int] = {}
            for block_id in block_ids:
                count = self._check(block_id, "free")
                listed[block_id] = listed.get(block_id, 0) + 1
                if listed[block_id] > count:
                    raise ValueError(f"free: block {block_id} is listed too often")
            for block_id in block_ids:
                self._ref_counts[block_id] -= 1
        """,
    },
    "ch02.ex5": {
        "a block in use is taken too (an incref)": """
            count = self._check(block_id, "take", in_use=False)
            if count:
                self._ref_counts[block_id] += 1
                return
            self._free.remove(block_id)
            self._ref_counts[block_id] = 1
        """,
        "the taken block stays in the free queue": """
            count = self._check(block_id, "take", in_use=False)
            if count:
                raise ValueError(f"take: block {block_id} is in use (ref count {count})")
            self._ref_counts[block_id] = 1
        """,
        "takes the front of the queue, not the given block": """
            count = self._check(block_id, "take", in_use=False)
            if count:
                raise ValueError(f"take: block {block_id} is in use (ref count {count})")
            front = self._free.popleft()
            self._ref_counts[front] = 1
        """,
        "the taken block keeps count 0": """
            count = self._check(block_id, "take", in_use=False)
            if count:
                raise ValueError(f"take: block {block_id} is in use (ref count {count})")
            self._free.remove(block_id)
        """,
    },
}

# Wrong answers that pass the hand-made cases: slower than the spec promises, right at one position only.
MUTANTS["ch02.ex1"].update(
    {
        "a plain list: right order, but pop(0) and remove walk the list (O(n))": """
            def __init__(self, num_blocks: int):
                self._ids = list(range(num_blocks))

            def popleft(self) -> int:
                if not self._ids:
                    raise IndexError("popleft from an empty free queue")
                return self._ids.pop(0)

            def append(self, block_id: int) -> None:
                self._ids.append(block_id)

            def remove(self, block_id: int) -> None:
                self._ids.remove(block_id)

            def __len__(self) -> int:
                return len(self._ids)

            def __iter__(self):
                return iter(list(self._ids))
        """,
        "a deque: constant popleft, but remove searches (O(n))": """
            def __init__(self, num_blocks: int):
                from collections import deque

                self._ids = deque(range(num_blocks))

            def popleft(self) -> int:
                return self._ids.popleft()

            def append(self, block_id: int) -> None:
                self._ids.append(block_id)

            def remove(self, block_id: int) -> None:
                self._ids.remove(block_id)

            def __len__(self) -> int:
                return len(self._ids)

            def __iter__(self):
                return iter(list(self._ids))
        """,
        "an OrderedDict whose len counts by iterating (O(n))": """
            def __init__(self, num_blocks: int):
                from collections import OrderedDict

                self._ids = OrderedDict.fromkeys(range(num_blocks))

            def popleft(self) -> int:
                if not self._ids:
                    raise IndexError("popleft from an empty free queue")
                return self._ids.popitem(last=False)[0]

            def append(self, block_id: int) -> None:
                self._ids[block_id] = None

            def remove(self, block_id: int) -> None:
                del self._ids[block_id]

            def __len__(self) -> int:
                return sum(1 for _ in self._ids)

            def __iter__(self):
                return iter(list(self._ids))
        """,
    }
)
MUTANTS["ch02.ex2"].update(
    {
        "counts the free blocks by listing the queue (O(pool) per call)": """
            if n > len(self.free_queue()):
                raise NoFreeBlocksError(n, len(self._free))
            taken = [self._free.popleft() for _ in range(n)]
            for block_id in taken:
                self._ref_counts[block_id] = 1
            return taken
        """,
        "only the first block of the batch gets its count": """
            if n > len(self._free):
                raise NoFreeBlocksError(n, len(self._free))
            taken = [self._free.popleft() for _ in range(n)]
            if taken:
                self._ref_counts[taken[0]] = 1
            return taken
        """,
        "hands the front n out last first": """
            if n > len(self._free):
                raise NoFreeBlocksError(n, len(self._free))
            taken = []
            for _ in range(n):
                block_id = self._free.popleft()
                self._ref_counts[block_id] = 1
                taken.insert(0, block_id)
            return taken
        """,
    }
)
MUTANTS["ch02.ex3"].update(
    {
        "isinstance lets a bool through (True is block 1)": """
            if not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            count = self._ref_counts[block_id]
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
        "the message does not start with the operation": """
            if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
                raise ValueError(f"block id {block_id!r} is not in 0..{self.num_blocks - 1} ({op})")
            count = self._ref_counts[block_id]
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
        "reads the count before the range check (IndexError past the end)": """
            if type(block_id) is not int:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            count = self._ref_counts[block_id]
            if block_id < 0:
                raise ValueError(f"{op}: block id {block_id!r} is not in 0..{self.num_blocks - 1}")
            if in_use and not count:
                raise ValueError(f"{op}: block {block_id} is already free (ref count 0)")
            return count
        """,
    }
)
MUTANTS["ch02.ex4"].update(
    {
        "catches a double free by searching the free queue (O(pool) per id)": """
            listed: dict[int, int] = {}
            for block_id in block_ids:
                count = self._check(block_id, "free")
                listed[block_id] = listed.get(block_id, 0) + 1
                if listed[block_id] > count or block_id in self.free_queue():
                    raise ValueError(f"free: block {block_id} is listed too often")
            for block_id in block_ids:
                self._ref_counts[block_id] -= 1
                if not self._ref_counts[block_id]:
                    self._free.append(block_id)
        """,
        "an id listed twice is caught only when the two are next to each other": """
            for i, block_id in enumerate(block_ids):
                count = self._check(block_id, "free")
                if i and block_ids[i - 1] == block_id and count < 2:
                    raise ValueError(f"free: block {block_id} is listed twice but has {count} holder")
            for block_id in block_ids:
                self._ref_counts[block_id] -= 1
                if not self._ref_counts[block_id]:
                    self._free.append(block_id)
        """,
        "the last listed block is never released": """
            listed: dict[int, int] = {}
            for block_id in block_ids:
                count = self._check(block_id, "free")
                listed[block_id] = listed.get(block_id, 0) + 1
                if listed[block_id] > count:
                    raise ValueError(f"free: block {block_id} is listed too often")
            for i in range(len(block_ids) - 1):
                self._ref_counts[block_ids[i]] -= 1
                if not self._ref_counts[block_ids[i]]:
                    self._free.append(block_ids[i])
        """,
    }
)
MUTANTS["ch02.ex5"].update(
    {
        "checks the block is queued by listing the queue (O(pool))": """
            count = self._check(block_id, "take", in_use=False)
            if count or block_id not in self.free_queue():
                raise ValueError(f"take: block {block_id} is in use (ref count {count})")
            self._free.remove(block_id)
            self._ref_counts[block_id] = 1
        """,
        "rotates the queue until the block reaches the front": """
            count = self._check(block_id, "take", in_use=False)
            if count:
                raise ValueError(f"take: block {block_id} is in use (ref count {count})")
            while True:
                front = self._free.popleft()
                if front == block_id:
                    break
                self._free.append(front)
            self._ref_counts[block_id] = 1
        """,
        "the in-use message gives no count": """
            count = self._check(block_id, "take", in_use=False)
            if count:
                raise ValueError(f"take: block {block_id} is in use")
            self._free.remove(block_id)
            self._ref_counts[block_id] = 1
        """,
    }
)
