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
