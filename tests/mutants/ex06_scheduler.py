"""Planted wrong answers for ``solutions/ex06_scheduler.py`` (``python -m paged course mutants ch06``)."""

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
    },
    "ch06.ex2": {
        "oldest instead of newest victim": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while not bm.can_append_slots(seq, n):
                    if queue:
                        self._preempt(queue.popleft(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += bm.append_slots(seq, n)
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
                while not bm.can_append_slots(seq, n):
                    if queue:
                        self._preempt(queue.popleft(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += bm.append_slots(seq, n)
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
                while not bm.can_append_slots(seq, n):
                    if queue:
                        self._preempt(queue.pop(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += bm.append_slots(seq, n)
                    self.running.append(seq)
                    self._mark_scheduled(seq, n, out)
        """,
        "preempts itself even when alone (a preempt/re-prefill loop)": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while not bm.can_append_slots(seq, n):
                    if queue:
                        self._preempt(queue.pop(), out)
                    else:
                        self._preempt(seq, out)
                        break
                else:
                    out.blocks_to_copy += bm.append_slots(seq, n)
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
        "exhausts a sequence that older ones crowd out": """
            while queue:
                seq = queue.popleft()
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    self.running.append(seq)
                    continue
                while not bm.can_append_slots(seq, n):
                    if queue:
                        self._preempt(queue.pop(), out)
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    out.blocks_to_copy += bm.append_slots(seq, n)
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
                while not bm.can_append_slots(seq, n):
                    if queue:
                        self._preempt(queue.pop(), out)
                    elif self.running:
                        self._preempt(seq, out)
                        break
                    else:
                        self._exhaust(seq, out)
                        break
                else:
                    bm.append_slots(seq, n)
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
        """,
    },
    "ch06.ex3": {
        "a preempted sequence not reset for recompute": """
            if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
                out.blocks_to_swap_out += self.block_manager.swap_out(seq)
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self.block_manager.free(seq)
                self.waiting.appendleft(seq)
                self.num_recomputes += 1
        """,
        "swap without bookkeeping (blocks never copied out)": """
            if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
                self.block_manager.swap_out(seq)
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self.block_manager.free(seq)
                seq.reset_for_recompute()
                self.waiting.appendleft(seq)
                self.num_recomputes += 1
        """,
        "swapped queue in eviction order": """
            if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
                out.blocks_to_swap_out += self.block_manager.swap_out(seq)
                seq.status = SWAPPED
                self.num_swap_outs += 1
                self.swapped.append(seq)
            else:
                self.block_manager.free(seq)
                seq.reset_for_recompute()
                self.waiting.appendleft(seq)
                self.num_recomputes += 1
        """,
        "recomputed victims go to the back of waiting": """
            if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
                out.blocks_to_swap_out += self.block_manager.swap_out(seq)
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self.block_manager.free(seq)
                seq.reset_for_recompute()
                self.waiting.append(seq)
                self.num_recomputes += 1
        """,
        "swaps without asking whether the CPU pool has room": """
            if self.config.preemption_mode == "swap":
                out.blocks_to_swap_out += self.block_manager.swap_out(seq)
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                self.block_manager.free(seq)
                seq.reset_for_recompute()
                self.waiting.appendleft(seq)
                self.num_recomputes += 1
        """,
        "recompute keeps the blocks": """
            if self.config.preemption_mode == "swap" and self.block_manager.can_swap_out(seq):
                out.blocks_to_swap_out += self.block_manager.swap_out(seq)
                seq.status = SWAPPED
                self.num_swap_outs += 1
                insort(self.swapped, seq, key=self._rank)
            else:
                seq.reset_for_recompute()
                self.waiting.appendleft(seq)
                self.num_recomputes += 1
        """,
    },
    "ch06.ex4": {
        "newest swapped sequence first": """
            while self.swapped and self._num_seats() < self.config.max_num_seqs:
                seq = self.swapped[-1]
                n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
                if n == 0:
                    break
                if not bm.can_swap_in(seq, n):
                    if self.running:
                        break
                    self.swapped.pop()
                    self._recompute(seq)
                    continue
                self.swapped.pop()
                out.blocks_to_swap_in += bm.swap_in(seq)
                out.blocks_to_copy += bm.append_slots(seq, n)
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
                if n == 0 or not bm.can_swap_in(seq, n):
                    break
                self.swapped.pop(0)
                out.blocks_to_swap_in += bm.swap_in(seq)
                out.blocks_to_copy += bm.append_slots(seq, n)
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
                if not bm.can_swap_in(seq, n):
                    self.swapped.pop(0)
                    self._recompute(seq)
                    continue
                self.swapped.pop(0)
                out.blocks_to_swap_in += bm.swap_in(seq)
                out.blocks_to_copy += bm.append_slots(seq, n)
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
                if not bm.can_swap_in(seq, n):
                    if self.running:
                        break
                    self.swapped.pop(0)
                    self._recompute(seq)
                    continue
                self.swapped.pop(0)
                bm.swap_in(seq)
                out.blocks_to_copy += bm.append_slots(seq, n)
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
                if not bm.can_swap_in(seq, n):
                    if self.running:
                        break
                    self.swapped.pop(0)
                    self._recompute(seq)
                    continue
                self.swapped.pop(0)
                out.blocks_to_swap_in += bm.swap_in(seq)
                out.blocks_to_copy += bm.append_slots(seq, n)
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
                reason = self._never_reason(seq)
                if reason is not None:
                    self.waiting.popleft()
                    self._finish(seq, reason, out)
                    continue
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                n = self._chunk(len(seq) - bm.num_cached_tokens(seq), budget)
                hits, new, free_hits = bm._admission_needs(seq, n)
                if n == 0 or new + free_hits > bm.get_num_free_gpu_blocks():
                    break
                self.waiting.popleft()
                bm.allocate(seq, n)
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "later requests overtake one that does not fit": """
            skipped = []
            while self.waiting:
                seq = self.waiting.popleft()
                reason = self._never_reason(seq)
                if reason is not None:
                    self._finish(seq, reason, out)
                    continue
                n = self._chunk(len(seq) - bm.num_cached_tokens(seq), budget)
                if (seats + self._seats(seq) > self.config.max_num_seqs or n == 0
                        or bm.can_allocate(seq, n) is not AllocStatus.OK):
                    skipped.append(seq)
                    continue
                bm.allocate(seq, n)
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
            self.waiting.extend(skipped)
        """,
        "a prompt that can never run blocks the queue": """
            while self.waiting:
                seq = self.waiting[0]
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                n = self._chunk(len(seq) - bm.num_cached_tokens(seq), budget)
                if n == 0 or bm.can_allocate(seq, n) is not AllocStatus.OK:
                    reason = self._never_reason(seq)
                    if reason is not None and not self.running:
                        self.waiting.popleft()
                        self._finish(seq, reason, out)
                        continue
                    break
                self.waiting.popleft()
                bm.allocate(seq, n)
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "no budget cap at admission": """
            while self.waiting:
                seq = self.waiting[0]
                reason = self._never_reason(seq)
                if reason is not None:
                    self.waiting.popleft()
                    self._finish(seq, reason, out)
                    continue
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                n = len(seq) - bm.num_cached_tokens(seq)
                if bm.can_allocate(seq, n) is not AllocStatus.OK:
                    break
                self.waiting.popleft()
                bm.allocate(seq, n)
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "seats ignored (n samples count once)": """
            while self.waiting:
                seq = self.waiting[0]
                reason = self._never_reason(seq)
                if reason is not None:
                    self.waiting.popleft()
                    self._finish(seq, reason, out)
                    continue
                if seats + 1 > self.config.max_num_seqs:
                    break
                n = self._chunk(len(seq) - bm.num_cached_tokens(seq), budget)
                if n == 0 or bm.can_allocate(seq, n) is not AllocStatus.OK:
                    break
                self.waiting.popleft()
                bm.allocate(seq, n)
                seq.status = RUNNING
                seats += 1
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
        "cached tokens charged to the budget": """
            while self.waiting:
                seq = self.waiting[0]
                reason = self._never_reason(seq)
                if reason is not None:
                    self.waiting.popleft()
                    self._finish(seq, reason, out)
                    continue
                if seats + self._seats(seq) > self.config.max_num_seqs:
                    break
                cached = bm.num_cached_tokens(seq)
                n = self._chunk(len(seq), budget) - cached
                if n <= 0 or bm.can_allocate(seq, n) is not AllocStatus.OK:
                    break
                self.waiting.popleft()
                bm.allocate(seq, n)
                seq.status = RUNNING
                seats += self._seats(seq)
                self.running.append(seq)
                budget -= self._mark_scheduled(seq, n, out)
        """,
    },
}
