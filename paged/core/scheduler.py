"""The scheduler: which requests run in the next step, and who gives up memory when it runs out.

Requests live in three queues, oldest first: ``waiting`` (not yet admitted, or preempted by
recompute), ``running`` (their KV blocks are in the GPU pool) and ``swapped`` (blocks moved to the CPU
pool). One ``schedule()`` call builds one step, running requests first (the order of vLLM v0 with
chunked prefill and of vLLM v1; vLLM v0's default puts new prefills first, see *Batching*):

1. **running** (oldest first): every sequence gets a slot for its next token (``append_slots``).
   When the pool is full, the most recently admitted running request is preempted, all or nothing,
   until the older one can grow (PagedAttention paper §4.5: FCFS, preempt the latest first,
   gang-scheduled sequence groups). Preemption by *recompute* frees the victim's blocks and puts it at
   the front of ``waiting``: everything it holds (prompt + generated tokens) is prefilled again later.
   Preemption by *swap* moves its blocks to the CPU pool (``swapped``); when the CPU pool is full the
   victim is recomputed instead. A request that cannot grow although it is alone in the pool can
   never finish: it ends with ``FINISHED_KV_EXHAUSTED`` rather than preempting itself forever (a state
   of this course: vLLM refuses at start-up a KV cache that cannot hold one ``max_model_len`` request).
2. **swapped** (only if nobody was preempted in this step): swapped requests come back, oldest first.
3. **waiting** (only if nobody was preempted and nothing is swapped out, so swapped requests go
   before new prefills): FCFS admission while ``max_num_seqs``, ``max_num_batched_tokens`` and the
   block manager's watermark (``can_allocate``) allow; the first request that does not fit stops
   admission (no overtaking). A request that can never run (prompt over ``max_model_len``, or too big
   for the whole pool) is moved to ``ignored`` with its reason and does not block the queue.

Batching: continuous, and **mixed** -- a step holds the decodes of the running requests and the
prefills of newly admitted ones together (as vLLM v1 and vLLM v0's chunked-prefill scheduler do, minus
the chunking). vLLM v0's default (``_schedule_default``) instead admits prefills first and runs no
decodes in a step that admitted a prompt, which stalls every running decode for that step. Mixed
steps keep decodes flowing, cost one forward pass instead of two, and because running requests
reserve their next slot before admission, a new prompt can never take the slot a running request needs.

Who updates ``Sequence.num_computed_tokens``: **the scheduler**, when it schedules the tokens (as
vLLM v1's ``_update_after_schedule`` does). Each scheduled sequence's entry records where its new
tokens start; the engine must not change ``num_computed_tokens``.

Source: vLLM v0 ``vllm/core/scheduler.py`` (``_schedule_running`` / ``_schedule_swapped`` /
``_schedule_prefills`` in the order of ``_schedule_chunked_prefill``, ``_preempt``), vLLM v1
``vllm/v1/core/sched/scheduler.py``.
"""

from __future__ import annotations

from bisect import bisect
from collections import deque

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_manager import AllocStatus, BlockSpaceManager
from paged.core.block_table import blocks_needed
from paged.core.scheduler_outputs import ScheduledGroup, ScheduledSeq, SchedulerOutputs
from paged.core.sequence import Sequence, SequenceGroup, SequenceStatus

__all__ = ["CacheConfig", "ScheduledGroup", "ScheduledSeq", "Scheduler", "SchedulerConfig", "SchedulerOutputs"]

RUNNING, SWAPPED, WAITING = SequenceStatus.RUNNING, SequenceStatus.SWAPPED, SequenceStatus.WAITING
_UNFINISHED = (RUNNING, WAITING, SWAPPED)  # ``status in _UNFINISHED``: ``not seq.is_finished``, by identity


class Scheduler:
    """Continuous batching over a paged KV cache with preemption by recompute or swap (module docstring).

    Args:
        scheduler_config: step limits and the preemption mode.
        cache_config: pool sizes, block size, watermark, prefix caching; the scheduler builds the
            ``BlockSpaceManager`` (``self.block_manager``), its only view of memory.

    Raises:
        ValueError: ``cache_config.num_gpu_blocks`` unset, or swap mode without CPU blocks.
    """

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig):
        if cache_config.num_gpu_blocks is None:
            raise ValueError("cache_config.num_gpu_blocks must be set (the engine sizes the pool first)")
        if scheduler_config.preemption_mode == "swap" and cache_config.num_cpu_blocks <= 0:
            raise ValueError("preemption_mode='swap' needs cache_config.num_cpu_blocks > 0, "
                             f"got {cache_config.num_cpu_blocks}; use 'recompute' or give CPU blocks")
        self.config = scheduler_config
        self.cache_config = cache_config
        self.block_manager = BlockSpaceManager(
            cache_config.block_size, cache_config.num_gpu_blocks, cache_config.num_cpu_blocks,
            watermark=cache_config.watermark, enable_prefix_caching=cache_config.enable_prefix_caching)
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()  # in admission order: the last one is the next victim
        self.swapped: deque[SequenceGroup] = deque()
        self._requests: dict[str, SequenceGroup] = {}  # every unfinished request, by id
        self._order: dict[str, int] = {}  # arrival rank (FCFS key)
        self._next_rank = 0
        self.num_preemptions = self.num_recomputes = self.num_swap_outs = self.num_swap_ins = 0

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, seq_group: SequenceGroup) -> None:
        """Queue a request at the back of ``waiting``. Its sequences must be ``WAITING`` with this cache's block size.

        Raises:
            ValueError: a request with this id is unfinished here already, a sequence is not waiting,
                or its ``block_size`` differs from ``cache_config.block_size``.
        """
        rid = seq_group.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already queued or running")
        for seq in seq_group.seqs:
            if seq.status is not WAITING:
                raise ValueError(f"request {rid!r}: sequence {seq.seq_id} is {seq.status.value}, not waiting")
            if seq.block_size != self.cache_config.block_size:
                raise ValueError(f"request {rid!r}: sequence block_size {seq.block_size} != cache block_size "
                                 f"{self.cache_config.block_size}")
        for seq in seq_group.seqs:  # prefix caching: hash the prompt's full blocks once, now (as vLLM v1)
            self.block_manager.block_keys(seq)
        self._requests[rid] = seq_group
        self._order[rid] = self._next_rank
        self._next_rank += 1
        self.waiting.append(seq_group)

    def abort_request(self, request_id: str) -> bool:
        """Finish a request wherever it is (waiting, running, swapped) as ``FINISHED_ABORTED`` and free its blocks.

        Returns False (and changes nothing) when no unfinished request has this id.
        """
        group = self._requests.get(request_id)
        if group is None:
            return False
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        for seq in group.seqs:
            if not seq.is_finished:
                seq.status = SequenceStatus.FINISHED_ABORTED
        self._release(group)
        return True

    def fork_seq(self, parent: Sequence, child: Sequence) -> None:
        """Share ``parent``'s blocks with ``child`` (parallel sampling). The caller adds ``child`` to the group."""
        self.block_manager.fork(parent, child)
        child.status = parent.status

    def free_finished(self) -> list[SequenceGroup]:
        """Free the blocks of finished sequences of running requests; drop finished requests. Returns those.

        ``schedule()`` calls it first; the engine may call it right after a step to free memory sooner.
        """
        done = []
        for group in self.running:
            finished = 0
            for seq in group.seqs:
                if seq.status not in _UNFINISHED:
                    finished += 1
                    self.block_manager.free(seq)  # a no-op once its blocks are freed
            if finished == len(group.seqs):
                done.append(group)
        if done:
            self.running = deque(g for g in self.running if not g.is_finished)
            for group in done:
                self._forget(group)
        return done

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    def get_block_table(self, seq: Sequence) -> list[int]:
        return self.block_manager.get_block_table(seq)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutputs:
        """Build the next step (module docstring: running, then swapped, then waiting). See ``SchedulerOutputs``.

        Raises:
            RuntimeError: a running sequence got no new token since its last step (engine bug); nothing changes.
        """
        for group in self.running:  # check the engine's side of the contract before changing anything
            for seq in group.seqs:
                if seq.status is RUNNING and len(seq) <= seq.num_computed_tokens:
                    raise RuntimeError(f"sequence {seq.seq_id} of request {group.request_id!r} has no new token: "
                                       "append the sampled token (or finish the sequence) before schedule()")
        self.free_finished()
        out = SchedulerOutputs(block_manager=self.block_manager)
        budget = {"tokens": 0, "seqs": 0}
        recomputed: list[SequenceGroup] = []
        self._schedule_running(out, budget, recomputed)
        if recomputed:  # front of waiting, oldest first
            self.waiting.extendleft(sorted(recomputed, key=self._rank, reverse=True))
        if not out.preempted:
            self._schedule_swapped(out, budget)
            if not self.swapped:
                self._schedule_waiting(out, budget)
        out.num_batched_tokens = budget["tokens"]
        return out

    def _schedule_running(self, out: SchedulerOutputs, budget: dict, recomputed: list) -> None:
        queue, self.running = self.running, deque()
        bm = self.block_manager
        while queue:
            group = queue.popleft()
            seqs = group.get_seqs(RUNNING)
            while not self._can_grow(seqs):
                if queue:  # evict the most recently admitted request, all or nothing
                    self._preempt(queue.pop(), out, recomputed)
                    continue
                if self.running:  # older requests already hold memory this step: yield to them
                    self._preempt(group, out, recomputed)
                else:  # alone in the pool and still no room: it can never grow
                    self._exhaust(group, seqs, out)
                break
            else:
                for seq in seqs:
                    out.blocks_to_copy.extend(bm.append_slots(seq))
                self.running.append(group)
                out.decodes.append(self._mark_scheduled(group, seqs, budget, is_prefill=False))

    def _schedule_swapped(self, out: SchedulerOutputs, budget: dict) -> None:
        bm = self.block_manager
        while self.swapped:
            group = self.swapped[0]
            seqs = group.get_seqs(SWAPPED)
            if budget["seqs"] + self._num_seqs(group) > self.config.max_num_seqs:
                break
            if not self._can_swap_in(seqs):
                if self.running:
                    break  # later: running requests will free memory
                self.swapped.popleft()  # nothing runs, yet it does not fit back: recompute it instead
                self._free_for_recompute(seqs)
                self.waiting.appendleft(group)
                continue
            self.swapped.popleft()
            for seq in seqs:
                out.blocks_to_swap_in.extend(bm.swap_in(seq))
                seq.status = RUNNING
            for seq in seqs:
                out.blocks_to_copy.extend(bm.append_slots(seq))
            self.num_swap_ins += 1
            self.running.append(group)
            out.swapped_in.append(group)
            out.decodes.append(self._mark_scheduled(group, seqs, budget, is_prefill=False))

    def _schedule_waiting(self, out: SchedulerOutputs, budget: dict) -> None:
        cfg = self.config
        while self.waiting:
            group = self.waiting[0]
            seqs = group.get_seqs(WAITING)
            if not seqs:  # nothing left to run (every sequence finished): drop it
                self.waiting.popleft()
                self._release(group)
                continue
            reason = self._never_reason(group, seqs)
            if reason is not None:
                self.waiting.popleft()
                self._finish(group, reason, out)
                continue
            if budget["seqs"] + self._num_seqs(group) > cfg.max_num_seqs:
                break
            # A lone request may exceed the token budget (only possible with n > 1 after recompute).
            alone = not (out.prefills or out.decodes)
            cost = sum(self._prefill_cost(s) for s in seqs)
            if not alone and budget["tokens"] + cost > cfg.max_num_batched_tokens:
                break
            if not self._allocate(seqs, alone):
                if not alone:
                    break  # FCFS: wait for memory, nobody overtakes
                bs, total = self.cache_config.block_size, self.cache_config.num_gpu_blocks
                need = sum(blocks_needed(len(x), bs) for x in seqs)
                self.waiting.popleft()  # even an empty pool cannot hold all its sequences at once
                self._finish(group, f"its {len(seqs)} sequences need {need} blocks of {bs} tokens together; "
                             f"the KV cache has {total} blocks", out)
                continue
            self.waiting.popleft()
            for seq in seqs:
                seq.status = RUNNING
            self.running.append(group)
            out.prefills.append(self._mark_scheduled(group, seqs, budget, is_prefill=True))

    # ------------------------------------------------------------------ helpers
    def _mark_scheduled(self, group: SequenceGroup, seqs: list[Sequence], budget: dict,
                        is_prefill: bool) -> ScheduledGroup:
        """Record each sequence's new tokens and mark them computed (see the module docstring)."""
        entries = []
        for seq in seqs:
            n = len(seq) - seq.num_computed_tokens
            entries.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            seq.num_computed_tokens = len(seq)
            budget["tokens"] += n
        budget["seqs"] += self._num_seqs(group)  # n before the fork: room for the samples to come
        return ScheduledGroup(group, entries, is_prefill)

    def _prefill_cost(self, seq: Sequence) -> int:
        """Tokens this sequence's prefill computes: a prefix-cache hit is free, the last token never is."""
        return len(seq) - seq.num_computed_tokens - self.block_manager.num_cached_prompt_tokens(seq)

    def _allocate(self, seqs: list[Sequence], alone: bool) -> bool:
        """Give every sequence of a waiting request its blocks, all or nothing. False: not enough memory now."""
        bm, bs = self.block_manager, self.cache_config.block_size
        if len(seqs) > 1 and not alone:  # forked request after recompute: room for all, ignoring sharing
            if sum(blocks_needed(len(s), bs) for s in seqs) > bm.get_num_free_gpu_blocks() - bm.watermark_blocks:
                return False
        done = []
        for seq in seqs:
            if bm.can_allocate(seq) is not AllocStatus.OK:
                for s in done:  # undo; forget blocks cached on the promise of this step's compute
                    table = bm.get_block_table(s)
                    bm.free(s)
                    s.num_computed_tokens = s.num_cached_tokens = 0
                    for b in table:
                        if bm.prefix_cache is not None and bm.gpu_allocator.ref_count(b) == 0:
                            bm.prefix_cache.evict(b)
                return False
            bm.allocate(seq)
            done.append(seq)
        return True

    def _can_grow(self, seqs: list[Sequence]) -> bool:
        """Whether every running sequence of a request can get a slot for its next token.

        One sequence: the block manager's ``can_append_slots``. Forked sequences: count new blocks and
        copy-on-write copies together (each sibling writing into a shared partial block copies it, the
        last holder writes in place), so a request is never half-grown.
        """
        bm, bs = self.block_manager, self.cache_config.block_size
        if len(seqs) == 1:
            return bm.can_append_slots(seqs[0])
        holders: dict[int, int] = {}
        need = 0
        for seq in seqs:
            table = bm.get_block_table(seq)
            need += blocks_needed(len(seq), bs) - len(table)
            if seq.num_computed_tokens % bs:  # the new token goes into a partial last block
                last = table[-1]
                count = holders.get(last, bm.gpu_allocator.ref_count(last))
                if count > 1:
                    need += 1
                    holders[last] = count - 1
        return need <= bm.get_num_free_gpu_blocks()

    def _never_reason(self, group: SequenceGroup, seqs: list[Sequence]) -> str | None:
        """Why the head of ``waiting`` can never run, or None. Checks length, ``n`` and the whole pool."""
        cfg, seq = self.config, seqs[0]
        if len(seq) > cfg.max_model_len:
            return (f"prompt of {len(seq)} tokens is longer than max_model_len={cfg.max_model_len}")
        if self._num_seqs(group) > cfg.max_num_seqs:
            return f"n={self._num_seqs(group)} sequences exceed max_num_seqs={cfg.max_num_seqs}"
        if self.block_manager.can_allocate(seq) is AllocStatus.NEVER:
            bs, total = self.cache_config.block_size, self.cache_config.num_gpu_blocks
            keep = self.block_manager.watermark_blocks
            return (f"prompt of {len(seq)} tokens needs {blocks_needed(len(seq), bs)} blocks of {bs} tokens; "
                    f"the KV cache has {total} blocks and admission keeps {keep} free (watermark)")
        return None

    def _finish(self, group: SequenceGroup, reason: str, out: SchedulerOutputs) -> None:
        """A waiting request that can never run: ignored if it never ran, exhausted if it was preempted."""
        ran = any(len(s) > s.num_prompt_tokens for s in group.seqs)
        status = SequenceStatus.FINISHED_KV_EXHAUSTED if ran else SequenceStatus.FINISHED_IGNORED
        message = ("KV cache exhausted: " if ran else "ignored: ") + reason
        self._end(group, status, message, out.exhausted if ran else out.ignored)

    def _exhaust(self, group: SequenceGroup, seqs: list[Sequence], out: SchedulerOutputs) -> None:
        bs, total = self.cache_config.block_size, self.cache_config.num_gpu_blocks
        longest = max(len(s) for s in seqs)
        msg = (f"KV cache exhausted: request {group.request_id!r} needs {blocks_needed(longest, bs)} blocks of {bs} "
               f"tokens for its {longest} tokens, but it alone already holds the whole cache of {total} blocks")
        self._end(group, SequenceStatus.FINISHED_KV_EXHAUSTED, msg, out.exhausted)

    def _end(self, group: SequenceGroup, status: SequenceStatus, message: str, bucket: list) -> None:
        """Finish every unfinished sequence of ``group`` with ``status`` and ``message``, free its blocks,
        forget it, and list it in ``bucket`` (``out.ignored`` or ``out.exhausted``)."""
        for seq in group.seqs:
            if not seq.is_finished:
                seq.status = status
                seq.finish_message = message
        self._release(group)
        bucket.append(group)

    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs, recomputed: list) -> None:
        """Evict a whole running request: swap it out if asked and the CPU pool has room, else recompute."""
        seqs, bm = group.get_seqs(RUNNING), self.block_manager
        self.num_preemptions += 1
        out.preempted.append(group)
        if self.config.preemption_mode == "swap" and self._can_swap_out(seqs):
            for seq in seqs:
                out.blocks_to_swap_out.extend(bm.swap_out(seq))
                seq.status = SWAPPED
            self.num_swap_outs += 1
            self.swapped.insert(bisect(self.swapped, self._rank(group), key=self._rank), group)  # oldest first
            return
        self._free_for_recompute(seqs)
        self.num_recomputes += 1
        recomputed.append(group)

    def _can_swap_out(self, seqs: list[Sequence]) -> bool:
        bm = self.block_manager
        if not all(bm.can_swap_out(s) for s in seqs):
            return False
        return len(seqs) == 1 or sum(len(bm.get_block_table(s)) for s in seqs) <= bm.get_num_free_cpu_blocks()

    def _can_swap_in(self, seqs: list[Sequence]) -> bool:
        """Watermark rule of the block manager, and room for each sequence's next token too
        (counted without sharing, plus one copy-on-write block per forked sequence)."""
        bm, bs = self.block_manager, self.cache_config.block_size
        if not all(bm.can_swap_in(s) is AllocStatus.OK for s in seqs):
            return False
        need = sum(blocks_needed(len(s), bs) + (len(seqs) > 1) for s in seqs)
        return need <= bm.get_num_free_gpu_blocks()

    def _num_seqs(self, group: SequenceGroup) -> int:
        """Sequences the request will run: ``n`` before the fork, then its unfinished sequences."""
        if len(group.seqs) < group.sampling_params.n:
            return group.sampling_params.n
        return sum(1 for s in group.seqs if s.status in _UNFINISHED)

    def _rank(self, group: SequenceGroup) -> int:
        return self._order[group.request_id]

    def _free_for_recompute(self, seqs: list[Sequence]) -> None:
        """Preemption by recompute: drop the blocks; each sequence is prefilled again from its tokens."""
        for seq in seqs:
            self.block_manager.free(seq)
            seq.reset_for_recompute()

    def _release(self, group: SequenceGroup) -> None:
        """Free every block of the request (a no-op for sequences without blocks) and forget it."""
        for seq in group.seqs:
            self.block_manager.free(seq)
        self._forget(group)

    def _forget(self, group: SequenceGroup) -> None:
        self._requests.pop(group.request_id, None)
        self._order.pop(group.request_id, None)
