# Generated from solutions/ex06_scheduler.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

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
        raise NotImplementedError(
            "ch06.ex1: tokens that run now, within the threshold and the budget; 0: it waits"
        )

    def _schedule_running(self, out: SchedulerOutputs, budget: int) -> int:
        """Grow every running sequence (oldest first) by its next chunk; preempt the newest when short.
        Returns the budget left."""
        queue, self.running, bm = self.running, deque(), self.block_manager
        raise NotImplementedError(
            "ch06.ex2: each running sequence grows or leaves; victims the newest; budget left"
        )
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutputs) -> None:
        """Take a running sequence's memory: swap it out (if asked and the CPU pool has room), else recompute."""
        self.num_preemptions += 1
        out.preempted.append(seq)
        raise NotImplementedError(
            "ch06.ex3: its GPU memory back: swapped when asked and the CPU has room, else recomputed"
        )

    def _schedule_swapped(self, out: SchedulerOutputs, budget: int) -> int:
        """Bring swapped sequences back, oldest first, while seats, budget and memory allow. Returns the budget left."""
        bm = self.block_manager
        raise NotImplementedError(
            "ch06.ex4: swapped sequences back oldest first while seats, budget, memory allow"
        )
        return budget

    def _schedule_waiting(self, out: SchedulerOutputs, budget: int) -> None:
        """Admit waiting sequences first come, first served, while seats, budget and the watermark allow."""
        bm, seats = self.block_manager, self._num_seats()
        raise NotImplementedError(
            "ch06.ex5: waiting sequences admitted first come, first served, while they fit"
        )

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
        raise NotImplementedError(
            "ch06.ex8: a limit no amount of waiting lifts: its length, its seats, an empty pool"
        )

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
        raise NotImplementedError(
            "ch06.ex9: blocks back, KV forgotten; front of waiting, or exhausted if it never fits again"
        )


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
