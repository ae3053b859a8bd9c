"""Planted wrong answers for ``solutions/ex06_scheduler.py`` (``python -m paged course mutants ch06``)."""

from paged_course.grading.mutants import variant


def _never(old: str, new: str) -> str:
    return variant("ex06_scheduler.py", "ch06.ex8", old, new)


def _recompute(old: str, new: str) -> str:
    return variant("ex06_scheduler.py", "ch06.ex9", old, new)


MUTANTS = {
    "ch06.ex1": {
        "no budget cap (a chunk over the budget)": """
            return min(remaining, threshold) if threshold else remaining
        """,
        "threshold ignored": """
            if remaining <= budget:
                return remaining
            return budget if chunked else 0
        """,
        "cuts prompts even with chunked prefill off": """
            n = min(remaining, threshold) if threshold else remaining
            return min(n, budget)
        """,
        "never cuts (a long prompt waits for a whole-prompt budget)": """
            n = min(remaining, threshold) if threshold else remaining
            return n if n <= budget else 0
        """,
        "threshold applied only when chunking is off": """
            n = min(remaining, threshold) if threshold and not chunked else remaining
            if n <= budget:
                return n
            return budget if chunked else 0
        """,
        "the threshold caps only prompts over the budget": """
            if remaining <= budget:
                return remaining
            n = min(remaining, threshold) if threshold else remaining
            if n <= budget:
                return n
            return budget if chunked else 0
        """,
    },
    "ch06.ex2": {
        "oldest instead of newest victim": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while (new_blocks := bm.allocate_slots(seq, n)) is None:
                    if queue:
                        self._preempt(queue.popleft(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
        "decodes starved by a long prefill (newest first)": """
            queue.reverse()
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.appendleft(seq)
                    continue
                while (new_blocks := bm.allocate_slots(seq, n)) is None:
                    if queue:
                        self._preempt(queue.popleft(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.appendleft(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
        "never subtracts from the budget": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while (new_blocks := bm.allocate_slots(seq, n)) is None:
                    if queue:
                        self._preempt(queue.pop(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.append(seq)
                    self._mark_scheduled(seq, n, out)
        """,
        "victim taken among those already grown this step (the newest of all running)": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while (new_blocks := bm.allocate_slots(seq, n)) is None:
                    if queue:
                        self._preempt(queue.pop(), out)
                    elif self.running:
                        self._preempt(self.running.pop(), out)
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
        "the sequence that cannot grow yields first, though younger ones hold memory": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                new_blocks = bm.allocate_slots(seq, n)
                if new_blocks is not None:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
                elif queue or self.running:
                    self._preempt(seq, out)
                else:
                    self._exhaust(seq, out)
        """,
        "exhausts a sequence that older ones crowd out": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while (new_blocks := bm.allocate_slots(seq, n)) is None:
                    if queue:
                        self._preempt(queue.pop(), out)
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
        "drops the copy-on-write pairs": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while (new_blocks := bm.allocate_slots(seq, n)) is None:
                    if queue:
                        self._preempt(queue.pop(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
        "the walk stops at the first sequence without budget (those after it leave running)": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    break
                while True:
                    new_blocks = bm.allocate_slots(seq, n)
                    if new_blocks is not None:
                        out.blocks_to_copy += new_blocks.copies
                        self.running.append(seq)
                        budget -= self._mark_scheduled(seq, n, out)
                        break
                    if queue:
                        self._preempt(queue.pop(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
        """,
        "a sequence preempts itself before any younger one when it is the first of the step": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while True:
                    new_blocks = bm.allocate_slots(seq, n)
                    if new_blocks is not None:
                        out.blocks_to_copy += new_blocks.copies
                        self.running.append(seq)
                        budget -= self._mark_scheduled(seq, n, out)
                        break
                    if queue and self.running:
                        self._preempt(queue.pop(), out)
                    elif queue:
                        self._preempt(seq, out)
                        break
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
        """,
    },
    "ch06.ex3": {
        "swap without bookkeeping (blocks never copied out)": """
            pairs = None
            if self.config.preemption_mode == "swap":
                pairs = self.block_manager.swap_out(seq)
            if pairs is not None:
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self._recompute(seq, out)
                self.num_recomputes += 1
        """,
        "swapped queue in eviction order": """
            pairs = None
            if self.config.preemption_mode == "swap":
                pairs = self.block_manager.swap_out(seq)
            if pairs is not None:
                out.blocks_to_swap_out += pairs
                seq.status = SWAPPED
                self.num_swap_outs += 1
                self.swapped.append(seq)
            else:
                self._recompute(seq, out)
                self.num_recomputes += 1
        """,
        "a swapped sequence left in the running state": """
            pairs = None
            if self.config.preemption_mode == "swap":
                pairs = self.block_manager.swap_out(seq)
            if pairs is not None:
                out.blocks_to_swap_out += pairs
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self._recompute(seq, out)
                self.num_recomputes += 1
        """,
        "swap mode never falls back to recompute (a full CPU pool drops the victim)": """
            if self.config.preemption_mode == "swap":
                pairs = self.block_manager.swap_out(seq)
                if pairs is not None:
                    out.blocks_to_swap_out += pairs
                    seq.status = SWAPPED
                    self.num_swap_outs += 1
                    insort(self.swapped, seq, key=self._rank)
            else:
                self._recompute(seq, out)
                self.num_recomputes += 1
        """,
        "recompute keeps the blocks": """
            pairs = None
            if self.config.preemption_mode == "swap":
                pairs = self.block_manager.swap_out(seq)
            if pairs is not None:
                out.blocks_to_swap_out += pairs
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                seq.reset_for_recompute()
                self.waiting.appendleft(seq)
                self.num_recomputes += 1
        """,
        "recompute counted as a swap": """
            pairs = None
            if self.config.preemption_mode == "swap":
                pairs = self.block_manager.swap_out(seq)
            if pairs is not None:
                out.blocks_to_swap_out += pairs
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self._recompute(seq, out)
                self.num_swap_outs += 1
        """,
    },
    "ch06.ex4": {
        "newest swapped sequence first": """
            while self.swapped and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[-1]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    break
                if (pairs := bm.swap_in(seq, n)) is None:
                    if self.running:
                        break
                    self.swapped.pop()
                    self._recompute(seq, out)
                    continue
                self.swapped.pop()
                out.blocks_to_swap_in += pairs
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "waits forever when nothing runs": """
            while self.swapped and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[0]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0 or (pairs := bm.swap_in(seq, n)) is None:
                    break
                self.swapped.pop(0)
                out.blocks_to_swap_in += pairs
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "recomputes although others run": """
            while self.swapped and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[0]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    break
                if (pairs := bm.swap_in(seq, n)) is None:
                    self.swapped.pop(0)
                    self._recompute(seq, out)
                    continue
                self.swapped.pop(0)
                out.blocks_to_swap_in += pairs
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "swap in without copying the blocks back": """
            while self.swapped and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[0]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    break
                if (pairs := bm.swap_in(seq, n)) is None:
                    if self.running:
                        break
                    self.swapped.pop(0)
                    self._recompute(seq, out)
                    continue
                self.swapped.pop(0)
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "no budget cap on swapped-in chunks": """
            while self.swapped and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[0]
                n = len(seq) - seq.num_computed_tokens
                if (pairs := bm.swap_in(seq, n)) is None:
                    if self.running:
                        break
                    self.swapped.pop(0)
                    self._recompute(seq, out)
                    continue
                self.swapped.pop(0)
                out.blocks_to_swap_in += pairs
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "a swapped sequence comes back without a free seat": """
            while self.swapped:
                seq = self.swapped[0]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    break
                if (pairs := bm.swap_in(seq, n)) is None:
                    if self.running:
                        break
                    self.swapped.pop(0)
                    self._recompute(seq, out)
                    continue
                self.swapped.pop(0)
                out.blocks_to_swap_in += pairs
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "a swapped sequence that does not fit is skipped (a younger one overtakes it)": """
            index = 0
            while index < len(self.swapped) and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[index]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    break
                if (pairs := bm.swap_in(seq, n)) is None:
                    if self.running:
                        index += 1
                        continue
                    self.swapped.pop(index)
                    self._recompute(seq, out)
                    continue
                self.swapped.pop(index)
                out.blocks_to_swap_in += pairs
                out.blocks_to_copy += bm.allocate_slots(seq, n).copies
                seq.status = RUNNING
                self.num_swap_ins += 1
                self.running.append(seq)
                out.swapped_in.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
    },
    "ch06.ex5": {
        "watermark ignored": """
            while self.waiting:
                seq = self.waiting[0]
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                computed = bm.get_computed_blocks(seq)
                n = self._chunk(len(seq) - len(computed) * bm.block_size, budget)
                watermark, bm.watermark_blocks = bm.watermark_blocks, 0
                new_blocks = bm.allocate_slots(seq, n, computed) if n else None
                bm.watermark_blocks = watermark
                if new_blocks is None:
                    break
                self.waiting.popleft()
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "later requests overtake one that does not fit": """
            skipped = []
            while self.waiting:
                seq = self.waiting.popleft()
                computed = bm.get_computed_blocks(seq)
                n = self._chunk(len(seq) - len(computed) * bm.block_size, budget)
                if (seats + self._seats(seq) > self.config.max_num_seqs or n == 0
                        or bm.allocate_slots(seq, n, computed) is None):
                    skipped.append(seq)
                    continue
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
            self.waiting.extend(skipped)
        """,
        "the prefix looked up twice per admission": """
            while self.waiting:
                seq = self.waiting[0]
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                computed = bm.get_computed_blocks(seq)
                n = self._chunk(len(seq) - len(computed) * bm.block_size, budget)
                if n == 0 or bm.allocate_slots(seq, n) is None:
                    break
                self.waiting.popleft()
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "no budget cap at admission": """
            while self.waiting:
                seq = self.waiting[0]
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                computed = bm.get_computed_blocks(seq)
                n = len(seq) - len(computed) * bm.block_size
                if bm.allocate_slots(seq, n, computed) is None:
                    break
                self.waiting.popleft()
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "seats ignored (n samples count once)": """
            while self.waiting:
                seq = self.waiting[0]
                if seats + 1 > self.config.max_num_seqs:
                    break
                computed = bm.get_computed_blocks(seq)
                n = self._chunk(len(seq) - len(computed) * bm.block_size, budget)
                if n == 0 or bm.allocate_slots(seq, n, computed) is None:
                    break
                self.waiting.popleft()
                seq.status = RUNNING
                seats += 1
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "cached tokens charged to the budget": """
            while self.waiting:
                seq = self.waiting[0]
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                computed = bm.get_computed_blocks(seq)
                n = self._chunk(len(seq), budget) - len(computed) * bm.block_size
                if n <= 0 or bm.allocate_slots(seq, n, computed) is None:
                    break
                self.waiting.popleft()
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
    },
    "ch06.ex8": {
        "a prompt of exactly max_model_len tokens ignored": _never(
            "if tokens > cfg.max_model_len:", "if tokens >= cfg.max_model_len:"
        ),
        "the free blocks of this moment instead of an empty pool (later taken for never)": _never(
            "if needed > bm.num_gpu_blocks - bm.watermark_blocks:",
            "if needed > bm.get_num_free_gpu_blocks() - bm.watermark_blocks:",
        ),
        "the watermark forgotten (a prompt admission can never take is kept waiting)": _never(
            "if needed > bm.num_gpu_blocks - bm.watermark_blocks:",
            "if needed > bm.num_gpu_blocks:",
        ),
        "the sequences the request has now, not the n samples it will fork": _never(
            "tokens, seats = len(seq), self._seats(seq)",
            "tokens, seats = len(seq), len(seq.group.seqs)",
        ),
        "only the first chunk must fit the pool": _never(
            "needed = -(-tokens // bm.block_size)",
            "needed = -(-min(tokens, cfg.max_num_batched_tokens) // bm.block_size)",
        ),
        "blocks rounded down (a partial last block forgotten)": _never(
            "needed = -(-tokens // bm.block_size)", "needed = tokens // bm.block_size"
        ),
    },
    "ch06.ex9": {
        "the victim waits at the back (new prompts overtake it)": _recompute(
            "self.waiting.appendleft(seq)", "self.waiting.append(seq)"
        ),
        "its computed tokens kept (the next admission skips them)": _recompute(
            "seq.reset_for_recompute()", "seq.status = SequenceStatus.WAITING"
        ),
        "never exhausted (a victim that can never return waits forever)": _recompute(
            "if not self.block_manager.can_ever_fit(len(seq)):", "if False:"
        ),
        "the prompt, not the whole sequence, must fit again": _recompute(
            "if not self.block_manager.can_ever_fit(len(seq)):",
            "if not self.block_manager.can_ever_fit(seq.num_prompt_tokens):",
        ),
        "its blocks kept (the pool leaks them)": _recompute("self.block_manager.free(seq)\n", ""),
    },
}
