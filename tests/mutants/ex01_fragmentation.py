"""Planted wrong answers for ``solutions/ex01_fragmentation.py`` (``python -m paged course mutants``)."""

MUTANTS = {
    "ch01.ex1": {
        "every empty held slot counted as reserved": """
            return tokens, held - tokens, np.zeros_like(held)
        """,
        "every empty held slot counted as internal waste (the seed's definition)": """
            return tokens, np.zeros_like(held), held - tokens
        """,
        "no cap at the held slots: reserved up to the final length": """
            return tokens, final - tokens, held - final
        """,
        "reserved and internal swapped": """
            filled = np.minimum(held, final)
            return tokens, held - filled, filled - tokens
        """,
        "reserved off by one (the next token's slot counted as real)": """
            filled = np.minimum(held, final)
            real = np.minimum(tokens + 1, filled)
            return real, filled - real, held - filled
        """,
    },
    "ch01.ex2": {
        "watermark ignored": """
            need = self.blocks_for(num_tokens)
            if need > self.num_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need >= 0:
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
        "NEVER judged on the free blocks instead of the whole pool": """
            need = self.blocks_for(num_tokens)
            if need > self.num_free_blocks - self.watermark_blocks:
                return AllocStatus.NEVER
            return AllocStatus.OK
        """,
        "the watermark must be exceeded, not met": """
            need = self.blocks_for(num_tokens)
            if need > self.num_blocks - self.watermark_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need > self.watermark_blocks:
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
        "blocks counted by floor division": """
            need = num_tokens // self.block_size
            if need > self.num_blocks - self.watermark_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need >= self.watermark_blocks:
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
        "NEVER ignores the watermark": """
            need = self.blocks_for(num_tokens)
            if need > self.num_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need >= self.watermark_blocks:
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
    },
    "ch01.ex3": {
        "oldest request preempted instead of the newest": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks == 0:
                victim = next(iter(self.held))
                self.free(victim)
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
        "a block at every call, full or not": """
            victims = []
            while self.num_free_blocks == 0:
                victim = next(reversed(self.held))
                self.free(victim)
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
        "a preempted grower still takes a block": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks == 0:
                victim = next(reversed(self.held))
                self.free(victim)
                victims.append(victim)
            self.held[req] = self.held.get(req, 0) + 1
            self.num_free_blocks -= 1
            return victims
        """,
        "the victim's blocks are never returned to the pool": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            if self.num_free_blocks == 0:
                victim = next(reversed(self.held))
                del self.held[victim]
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks = max(self.num_free_blocks - 1, 0)
            return victims
        """,
        "the new block is taken one token late": """
            if self.blocks_for(num_tokens - 1) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks == 0:
                victim = next(reversed(self.held))
                self.free(victim)
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
    },
}

# Wrong answers that pass the hand-made cases: inputs changed, one position, slower than the spec promises.
MUTANTS["ch01.ex1"].update(
    {
        "reuses the caller's held array for the internal slots (in place)": """
            filled = np.minimum(held, final)
            internal = held
            internal -= filled
            return tokens, filled - tokens, internal
        """,
        "a loop over the requests that stops one short": """
            reserved, internal = np.zeros_like(tokens), np.zeros_like(tokens)
            for i in range(len(tokens) - 1):
                filled = min(held[i], final[i])
                reserved[i], internal[i] = filled - tokens[i], held[i] - filled
            return tokens, reserved, internal
        """,
        "returns Python lists instead of arrays": """
            filled = [min(h, f) for h, f in zip(held.tolist(), final.tolist())]
            return (
                tokens.tolist(),
                [f - t for f, t in zip(filled, tokens.tolist())],
                [h - f for h, f in zip(held.tolist(), filled)],
            )
        """,
    }
)
MUTANTS["ch01.ex2"].update(
    {
        "reserves the blocks it admits (can_allocate changes the free count)": """
            need = self.blocks_for(num_tokens)
            if need > self.num_blocks - self.watermark_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need >= self.watermark_blocks:
                self.num_free_blocks -= need  # as if admission happened here
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
        "blocks counted as tokens // block_size + 1 (one too many at an exact multiple)": """
            need = num_tokens // self.block_size + 1
            if need > self.num_blocks - self.watermark_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need >= self.watermark_blocks:
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
        "NEVER already at the exact fit (>=)": """
            need = self.blocks_for(num_tokens)
            if need >= self.num_blocks - self.watermark_blocks:
                return AllocStatus.NEVER
            if self.num_free_blocks - need >= self.watermark_blocks:
                return AllocStatus.OK
            return AllocStatus.LATER
        """,
    }
)
MUTANTS["ch01.ex3"].update(
    {
        "finds the newest by listing held (O(running) per preemption)": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks == 0:
                victim = list(self.held)[-1]
                self.free(victim)
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
        "the newest taken to be the highest request id": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks == 0:
                victim = max(self.held)
                self.free(victim)
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
        "growth keeps the watermark free too (preempts early)": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks <= self.watermark_blocks and self.held:
                victim = next(reversed(self.held))
                self.free(victim)
                victims.append(victim)
                if victim == req:
                    return victims
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
    }
)
MUTANTS["ch01.ex3"].update(
    {
        "forgets that the grower may be the newest (KeyError once it preempts itself)": """
            if self.blocks_for(num_tokens) <= self.held[req]:
                return []
            victims = []
            while self.num_free_blocks == 0:
                victim = next(reversed(self.held))
                self.free(victim)
                victims.append(victim)
            self.held[req] += 1
            self.num_free_blocks -= 1
            return victims
        """,
    }
)
