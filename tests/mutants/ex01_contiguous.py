"""Planted wrong answers for ``solutions/ex01_contiguous.py`` (``python -m paged course mutants``)."""

from paged_course.grading.mutants import variant


def _compact(old: str, new: str) -> str:
    return variant("ex01_contiguous.py", "ch01.ex7", old, new)


MUTANTS = {
    "ch01.ex4": {
        "best fit: the smallest hole that holds the run": """
            fits = [i for i, (start, end) in enumerate(self.holes) if end - start >= size]
            if not fits:
                return None
            i = min(fits, key=lambda k: self.holes[k][1] - self.holes[k][0])
            start, end = self.holes[i]
            if end - start == size:
                del self.holes[i]
            else:
                self.holes[i][0] = start + size
            self.runs[start] = size
            return start
        """,
        "an exact fit is refused (> instead of >=)": """
            for i, (start, end) in enumerate(self.holes):
                if end - start > size:
                    self.holes[i][0] = start + size
                    self.runs[start] = size
                    return start
            return None
        """,
        "an exact fit leaves an empty hole behind": """
            for i, (start, end) in enumerate(self.holes):
                if end - start >= size:
                    self.holes[i][0] = start + size
                    self.runs[start] = size
                    return start
            return None
        """,
        "the run taken from the end of its hole": """
            for i, (start, end) in enumerate(self.holes):
                if end - start >= size:
                    if end - start == size:
                        del self.holes[i]
                    else:
                        self.holes[i][1] = end - size
                    self.runs[end - size] = size
                    return end - size
            return None
        """,
        "checks the total free space first (a second pass over the holes)": """
            if self.free_slots < size:
                return None
            for i, (start, end) in enumerate(self.holes):
                if end - start >= size:
                    if end - start == size:
                        del self.holes[i]
                    else:
                        self.holes[i][0] = start + size
                    self.runs[start] = size
                    return start
            return None
        """,
    },
    "ch01.ex5": {
        "no merging: the run becomes a hole of its own": """
            end = start + self.runs.pop(start)
            i = bisect.bisect(self.holes, [start])
            self.holes.insert(i, [start, end])
        """,
        "merged with the hole before only": """
            end = start + self.runs.pop(start)
            i = bisect.bisect(self.holes, [start])
            if i > 0 and self.holes[i - 1][1] == start:
                self.holes[i - 1][1] = end
            else:
                self.holes.insert(i, [start, end])
        """,
        "merged with the hole after only": """
            end = start + self.runs.pop(start)
            i = bisect.bisect(self.holes, [start])
            if i < len(self.holes) and self.holes[i][0] == end:
                self.holes[i][0] = start
            else:
                self.holes.insert(i, [start, end])
        """,
        "the place found by a walk over the holes": """
            end = start + self.runs.pop(start)
            i = 0
            while i < len(self.holes) and self.holes[i][0] < start:
                i += 1
            joins_before = i > 0 and self.holes[i - 1][1] == start
            joins_after = i < len(self.holes) and self.holes[i][0] == end
            if joins_before and joins_after:
                self.holes[i - 1][1] = self.holes[i][1]
                del self.holes[i]
            elif joins_before:
                self.holes[i - 1][1] = end
            elif joins_after:
                self.holes[i][0] = start
            else:
                self.holes.insert(i, [start, end])
        """,
        "re-sorts and merges the whole list (a rebuild per free)": """
            end = start + self.runs.pop(start)
            merged = []
            for lo, hi in sorted([*self.holes, [start, end]]):
                if merged and merged[-1][1] == lo:
                    merged[-1][1] = hi
                else:
                    merged.append([lo, hi])
            self.holes = merged
        """,
    },
    "ch01.ex7": {
        "copies listed from the top down (a copy overwrites a run not copied yet)": _compact(
            "return moves", "return moves[::-1]"
        ),
        "every run listed, in place or not": _compact(
            "if start != top:\n        moves.append((start, top, size))",
            "moves.append((start, top, size))",
        ),
        "an empty hole left when the runs fill the pool": _compact(
            "self.holes = [[top, self.num_slots]] if top < self.num_slots else []",
            "self.holes = [[top, self.num_slots]]",
        ),
        "runs kept under their old starts": _compact("self.runs = runs", "pass"),
        "the runs taken in the dict's order, not by address": _compact(
            "for start in sorted(self.runs):", "for start in list(self.runs):"
        ),
        "a walk over every slot of the pool to find the runs": _compact(
            "for start in sorted(self.runs):",
            "for start in [s for s in range(self.num_slots) if s in self.runs]:",
        ),
    },
}
