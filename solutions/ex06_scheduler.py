"""Exercise 06: the engine's scheduling policy (chapter 06), a hybrid of vLLM v1 and v0.

``Scheduler`` is the engine part ``scheduler`` (``paged.engine.parts``): a subclass of the reference
``paged.core.scheduler.Scheduler`` that keeps its plumbing (queues, requests in and out, the helpers
below) and replaces the policy, one method per build step. ``schedule()`` (inherited) calls them with
one token budget per step (``config.max_num_batched_tokens``):

    budget = self._schedule_running(out, budget)          # v1: decodes and next prompt chunks, preemption
    if not out.preempted:                                  # v1: nobody admitted in a step that preempted
        budget = self._schedule_swapped(out, budget)      # v0: swapped sequences come back
        if not self.swapped:                               # v0: swapped sequences go before new prompts
            self._schedule_waiting(out, budget)            # new prompts, FCFS, under v0's watermark

The step is vLLM v1's (one budget, running first, chunked prefill, preemption of the newest). The swapped
queue, preemption by swap, the watermark and the fork of ``n`` samples with copy-on-write are vLLM v0's,
which v1 dropped: v1 preempts by recompute only and runs ``n > 1`` as ``n`` independent requests.

1. ``_chunk`` (ch06.ex1): how many of a sequence's ``remaining`` uncomputed tokens run in this step:
   at most ``config.long_prefill_token_threshold`` when that is set (> 0), and within ``budget``: a
   prompt longer than the budget is cut (chunked prefill) when ``config.enable_chunked_prefill``, else
   it waits (0).
2. ``_schedule_running`` (ch06.ex2): every running sequence (``self.running``, oldest first) gets its
   next chunk (1 token for a decode) or leaves ``running``; returns the budget left. Memory that
   ``allocate_slots`` cannot give comes from preemptions, and only then; a victim is never older than a
   sequence that keeps running (this policy, pinned by a few checks: the most recently admitted first,
   the sequence itself when nobody younger is left). A sequence alone in the pool that cannot grow never
   will: ``self._exhaust(seq, out)`` ends it. A sequence whose chunk is 0 keeps its blocks and stays.
3. ``_preempt`` (ch06.ex3): by swap when ``config.preemption_mode == "swap"`` and the CPU pool has room
   (``block_manager.swap_out`` returns the pairs, not ``None``), else by recompute; the swap with its
   bookkeeping (below).
3b. ``_recompute`` (ch06.ex9): preemption by recompute: the victim's blocks back, its KV forgotten, and
   where it waits (or, grown past an empty pool, how it ends). ``_preempt`` and ``_schedule_swapped``
   call it.
4. ``_schedule_swapped`` (ch06.ex4): swapped sequences come back oldest first (``self.swapped`` is
   sorted by arrival), while a seat is free, the budget allows and ``swap_in(seq, n)`` returns pairs.
5. ``_schedule_waiting`` (ch06.ex5): waiting sequences first come, first served; each must fit the
   seats (``max_num_seqs``), the budget and the watermark (``allocate_slots(seq, n, computed)`` returns
   blocks, not ``None``); the first that does not fit stops admission. Tokens found in the prefix cache
   (``get_computed_blocks``, looked up once per admission) cost no budget.
5b. ``_never_reason`` (ch06.ex8): whether a new request can ever run. ``add_request`` (reference plumbing)
   asks once, at arrival; a request that never can (over ``max_model_len``, ``n`` over ``max_num_seqs``, a
   prompt that does not fit beside the watermark in an empty pool) never reaches ``waiting`` and is listed,
   with the reason, in the next step's ``out.ignored``.

Helpers you can use (reference plumbing): ``self._mark_scheduled(seq, n, out)`` lists ``seq``'s next
``n`` tokens in ``out``, marks them computed and returns ``n``; ``self._exhaust(seq, out)``;
``self._recompute(seq, out)`` (step 3b, ch06.ex9; each step is checked with the reference's other
methods, so an unwritten step never fails another one's checks); ``self._seats(seq)`` /
``self._num_seats()`` (seats, counting a request's forks to come); ``self._rank`` (arrival order key).
Block manager calls (each gives what it can now or returns ``None``, changing nothing):
``allocate_slots(seq, n)`` (a ``NewBlocks``; its ``copies`` are copy-on-write pairs),
``get_computed_blocks(seq)`` and ``allocate_slots(seq, n, computed)`` for an admission,
``swap_out(seq)`` and ``swap_in(seq, n)`` (block pairs to copy), ``free(seq)``.

Sources: vLLM v1 ``vllm/v1/core/sched/scheduler.py`` (0.8.5 to 0.34.0; ``schedule``: running first, one
budget, ``long_prefill_token_threshold``, preempt the last running request by recompute when
``allocate_slots`` returns ``None``) and ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``,
``allocate_slots``); vLLM v0
``vllm/core/scheduler.py`` (0.10.2, the last release with v0's code: ``_schedule_chunked_prefill``,
``_schedule_default``, ``_preempt_by_recompute``, ``_preempt_by_swap``, ``_schedule_swapped``) and
``vllm/core/block_manager.py`` (``SelfAttnBlockSpaceManager.can_allocate``, the watermark); PagedAttention
paper §4.5. Check each step in the chapter with ``check("ch06.exK")``, or all with
``python -m paged grade ch06``.
"""

from __future__ import annotations

from bisect import insort
from collections import deque

from paged.core.scheduler import Scheduler as ReferenceScheduler
from paged.core.scheduler_outputs import SchedulerOutputs
from paged.core.sequence import Sequence, SequenceStatus

RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED


class Scheduler(ReferenceScheduler):
    """Your scheduling policy on the reference plumbing (module docstring). Same constructor:
    ``Scheduler(scheduler_config, cache_config, block_manager=None)``."""

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens of a sequence with ``remaining`` uncomputed tokens that run now (0: not this step)."""
        threshold, chunked = (
            self.config.long_prefill_token_threshold,
            self.config.enable_chunked_prefill,
        )
        # BEGIN SOLUTION ch06.ex1 -- tokens that run now, within the threshold and the budget; 0: it waits
        # HINT: Three limits meet here: what is left, the long-prefill threshold (0 means none) and the
        # HINT+ budget. Which of them may cut a prompt short, and which one makes it wait instead?
        # HINT: Cap what is left by the threshold when it is set. If that fits the budget, run it; if not,
        # HINT+ run the budget's worth with chunked prefill on, and nothing (0) with it off.
        n = min(remaining, threshold) if threshold else remaining
        if n <= budget:
            return n
        return budget if chunked else 0
        # END SOLUTION

    def _schedule_running(self, out: SchedulerOutputs, budget: int) -> int:
        """Grow every running sequence (oldest first) by its next chunk; preempt the newest when short.
        Returns the budget left."""
        queue, self.running, bm = self.running, deque(), self.block_manager
        # BEGIN SOLUTION ch06.ex2 -- each running sequence grows or leaves; victims the newest; budget left
        # HINT: A sequence that cannot get its blocks needs someone else's: whose, so that the oldest work is
        # HINT+ kept? And what if nobody is left to give them up, or it is the only sequence in the pool?
        # HINT: Take the sequences oldest first from a local queue. While allocate_slots returns None, preempt
        # HINT+ the queue's newest; with the queue empty, preempt the sequence itself when something older is
        # HINT+ running, else _exhaust it. A chunk of 0 keeps the sequence running without a step.
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
                if queue:
                    self._preempt(queue.pop(), out)
                elif self.running:
                    self._preempt(seq, out)
                    break
                else:
                    self._exhaust(seq, out)
                    break
        # END SOLUTION
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutputs) -> None:
        """Take a running sequence's memory: swap it out (if asked and the CPU pool has room), else recompute."""
        self.num_preemptions += 1
        out.preempted.append(seq)
        # BEGIN SOLUTION ch06.ex3 -- its GPU memory back: swapped when asked and the CPU has room, else recomputed
        # HINT: What does the step's output need to tell the engine about a swap, and where must a swapped
        # HINT+ sequence wait so that the oldest comes back first? When is swap impossible?
        # HINT: In swap mode try block_manager.swap_out; with pairs, list them in out.blocks_to_swap_out, mark
        # HINT+ the sequence SWAPPED, count it and insert it into self.swapped by self._rank. With None (or in
        # HINT+ recompute mode), call self._recompute and count a recompute.
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
            self.num_recomputes += 1
        # END SOLUTION

    def _schedule_swapped(self, out: SchedulerOutputs, budget: int) -> int:
        """Bring swapped sequences back, oldest first, while seats, budget and memory allow. Returns the budget left."""
        bm = self.block_manager
        # BEGIN SOLUTION ch06.ex4 -- swapped sequences back oldest first while seats, budget, memory allow
        # HINT: Which swapped sequence has waited longest, and what must be true (seats, budget, GPU blocks)
        # HINT+ before it comes back? What if it does not fit while nothing else is running to free memory?
        # HINT: Loop on self.swapped[0] while a seat is free; stop at a chunk of 0. When swap_in returns None,
        # HINT+ wait if something runs, else recompute it and go on. Otherwise list the pairs, allocate its
        # HINT+ chunk's slots (their copies too), mark it RUNNING, count it, and schedule its chunk.
        while self.swapped and self._num_seats() < self.config.max_num_seqs:
            seq = self.swapped[0]
            n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
            if n == 0:
                break
            pairs = bm.swap_in(seq, n)
            if pairs is None:
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
        # END SOLUTION
        return budget

    def _schedule_waiting(self, out: SchedulerOutputs, budget: int) -> None:
        """Admit waiting sequences first come, first served, while seats, budget and the watermark allow."""
        bm, seats = self.block_manager, self._num_seats()
        # BEGIN SOLUTION ch06.ex5 -- waiting sequences admitted first come, first served, while they fit
        # HINT: FCFS: may a later request overtake one that does not fit? Which tokens of a prompt cost no
        # HINT+ budget, and which block manager call applies the watermark?
        # HINT: For the queue's front: seats first (a group takes _seats of them), then one
        # HINT+ get_computed_blocks, the chunk of what the cache does not hold, and allocate_slots with those
        # HINT+ blocks; the first that fails stops admission. An admitted one becomes RUNNING and is scheduled.
        while self.waiting:
            seq = self.waiting[0]
            if seats + self._seats(seq) > self.config.max_num_seqs:
                break
            computed = bm.get_computed_blocks(seq)
            n = self._chunk(len(seq) - len(computed) * bm.block_size, budget)
            if n == 0 or bm.allocate_slots(seq, n, computed) is None:
                break
            self.waiting.popleft()
            seq.status = RUNNING
            seats += self._seats(seq)
            self.running.append(seq)
            budget -= self._mark_scheduled(seq, n, out)
        # END SOLUTION

    def _never_reason(self, seq: Sequence) -> str | None:
        """Why a new sequence can never run, or ``None`` when it may run some day. ``add_request`` asks once,
        when the request arrives: a reason ends it ``FINISHED_IGNORED`` with ``"ignored: " + reason`` (listed
        in the next step's ``out.ignored``); ``None`` sends it to the back of ``waiting``.

        Never is a statement about every future state, not about this one: a sequence that does not fit
        the free blocks *now* waits (the running ones will finish); only a limit that no amount of waiting
        lifts makes it "never". The rules, checked in this order, the first that applies gives the reason:

        1. its prompt, ``len(seq)`` tokens, is longer than ``config.max_model_len`` (a prompt of exactly
           ``max_model_len`` tokens runs and stops at its first output token);
        2. the seats it will take, ``self._seats(seq)`` (``n`` for a request that forks ``n`` samples),
           exceed ``config.max_num_seqs``;
        3. its whole prompt (not just the first chunk: every prompt token stays in the pool until the
           request ends) needs more blocks of ``block_manager.block_size`` tokens than an *empty* pool of
           ``block_manager.num_gpu_blocks`` blocks offers while admission keeps
           ``block_manager.watermark_blocks`` of them free.

        The reason is one line that names the number that breaks the limit and the limit (for rule 3: the
        blocks needed, the pool's blocks and the watermark's blocks), e.g. ``"prompt of 40 tokens is longer
        than max_model_len=32"``. Nothing changes: no queue, no block, no sequence field (asking allocates
        nothing).

        Source: vLLM v0's ``Scheduler._schedule_prefills`` (``vllm/core/scheduler.py``, 0.10.2) ends a prompt
        over its prompt limit, or one for which ``can_allocate`` answers ``AllocStatus.NEVER`` (whole pool
        minus needed blocks below the watermark, ``vllm/core/block_manager.py``), as ``FINISHED_IGNORED``, at
        the moment it reaches the front of ``waiting``; this engine decides once, at arrival.
        """
        cfg, bm = self.config, self.block_manager
        # BEGIN SOLUTION ch06.ex8 -- a limit no amount of waiting lifts: its length, its seats, an empty pool
        # HINT: The pool rule is not about get_num_free_gpu_blocks(): what is free today says "later". Measure
        # HINT+ the prompt against the whole pool, block_manager.num_gpu_blocks, less the watermark_blocks that
        # HINT+ an admission must leave free even when nothing else runs.
        # HINT: Three checks in the docstring's order, each returning its reason at once. Mind the edges: a
        # HINT+ prompt of exactly max_model_len runs; seats count the forks to come (a helper knows them); a
        # HINT+ partly filled last block still takes a whole block (round up). A pool reason names all three of
        # HINT+ its numbers.
        tokens, seats = len(seq), self._seats(seq)
        if tokens > cfg.max_model_len:
            return f"prompt of {tokens} tokens is longer than max_model_len={cfg.max_model_len}"
        if seats > cfg.max_num_seqs:
            return f"n={seats} sequences exceed max_num_seqs={cfg.max_num_seqs}"
        needed = -(-tokens // bm.block_size)
        if needed > bm.num_gpu_blocks - bm.watermark_blocks:
            return (
                f"prompt of {tokens} tokens needs {needed} blocks of {bm.block_size} tokens; the KV cache "
                f"has {bm.num_gpu_blocks} blocks and admission keeps {bm.watermark_blocks} free (watermark)"
            )
        return None
        # END SOLUTION

    def _recompute(self, seq: Sequence, out: SchedulerOutputs) -> None:
        """Preemption by recompute (also the fallback of swap, and of a swapped sequence that cannot return).

        ``seq`` has left its queue (the caller took it out of ``running`` or ``swapped``). Its blocks go back
        to the pool, GPU or CPU (``block_manager.free``), and its KV is forgotten: later a prefill computes
        all its tokens again, prompt and output so far. Then one of two ends:

        - it can be admitted again some day (its ``len(seq)`` tokens fit an empty pool beside the watermark:
          ``block_manager.can_ever_fit``): it is reset (``seq.reset_for_recompute()``: nothing computed,
          ``WAITING``) and waits so that ``waiting`` stays in arrival order: it arrived before every
          sequence still waiting that was never admitted, and victims reach this method newest first, so
          each one belongs ahead of the one before;
        - it never can (it grew past that while running): it ends ``FINISHED_KV_EXHAUSTED`` with
          ``self.finish(seq, status, "KV cache exhausted: " + reason, out.exhausted)``, where ``reason``
          is ``self._no_room_reason(seq, "sequence")``; it is never queued.

        Counting preemptions is the caller's (``_preempt``), not this method's.

        Source: vLLM v0 ``Scheduler._preempt_by_recompute`` (``vllm/core/scheduler.py``, 0.10.2: free the
        blocks and reset; the scheduler then puts the preempted groups at the front of ``waiting`` with
        ``extendleft``); vLLM v1 ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``, 0.10.2:
        ``kv_cache_manager.free``, ``num_computed_tokens = 0``, ``self.waiting.prepend_request``).
        """
        # BEGIN SOLUTION ch06.ex9 -- blocks back, KV forgotten; front of waiting, or exhausted if it never fits again
        # HINT: It waits at the front of waiting (appendleft), not the back: it was admitted before every prompt
        # HINT+ still waiting, and victims come newest first, so each one put at the front lands ahead of the
        # HINT+ younger victim before it, and arrival order holds without any sorting.
        # HINT: Order matters: blocks back first, then ask the block manager whether its length, prompt and
        # HINT+ output so far, could ever fit an empty pool. If not, end it with self.finish (the exhausted status,
        # HINT+ into out.exhausted) and stop; if so, Sequence has a method that forgets what was computed and
        # HINT+ sets it waiting.
        self.block_manager.free(seq)
        if not self.block_manager.can_ever_fit(len(seq)):
            reason = self._no_room_reason(seq, "sequence")
            self.finish(
                seq,
                SequenceStatus.FINISHED_KV_EXHAUSTED,
                "KV cache exhausted: " + reason,
                out.exhausted,
            )
            return
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        # END SOLUTION


# The graded regions the engine part is made of (paged_course/capstone.py reads this).
PART_REGIONS = {
    "Scheduler": (
        "ch06.ex1",
        "ch06.ex2",
        "ch06.ex3",
        "ch06.ex4",
        "ch06.ex5",
        "ch06.ex8",
        "ch06.ex9",
    )
}
