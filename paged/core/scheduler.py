"""The scheduler: which sequences compute which tokens in the next step, and who gives up memory.

A hybrid of two engines. The step is vLLM v1's (``vllm/v1/core/sched/scheduler.py``, 0.8.5 and later):
no prefill or decode phase; every step spends one token budget (``max_num_batched_tokens``), and each
sequence's ``num_computed_tokens`` catches up with its token count. The swapped queue, preemption by
swap, the watermark and the fork of ``n`` samples are vLLM v0's (``vllm/core/scheduler.py``, 0.10.2, the
last release with v0's code), which v1 dropped. One ``schedule()`` call, in this order:

1. **running** (admission order): each sequence gets its next tokens: 1 for a decode, the next chunk of
   a partly computed prompt (as large as the budget allows, capped by ``long_prefill_token_threshold``).
   When ``allocate_slots`` returns ``None`` the most recently admitted running sequence is preempted
   until the older one fits (v1, ``self.running.pop()`` in ``schedule``, 0.10.2; paper §4.5: FCFS,
   preempt the latest first). *Recompute* frees the
   victim's blocks and puts it at the front of ``waiting`` (all its tokens are prefilled again later);
   *swap* (v0) moves its blocks to the CPU pool (``swapped``), or recomputes when the CPU pool is full. A
   sequence that cannot grow although it alone holds the pool ends ``FINISHED_KV_EXHAUSTED`` (this
   course's state: vLLM v1 instead refuses to start when ``max_model_len`` tokens do not fit the KV cache,
   ``check_enough_kv_cache_memory`` in ``vllm/v1/core/kv_cache_utils.py``, 0.10.2)
   rather than preempting itself forever; so does a recomputed one that grew too long to be admitted again.
2. **swapped** (only if nobody was preempted in this step; v0): swapped sequences come back, oldest first.
3. **waiting** (only if nobody was preempted and nothing is swapped out): first come, first served,
   while ``max_num_seqs``, the budget and the watermark (v0, admissions only) allow; the first that does
   not fit stops admission (no overtaking). The prefix is looked up once per admission attempt
   (``get_computed_blocks``) and its blocks passed to ``allocate_slots`` (v1); a hit counts as computed;
   the last prompt token is always computed.

Whether a request can ever run (over ``max_model_len``, ``n`` over ``max_num_seqs``, or a prompt larger
than the pool beside the watermark) is decided once, in ``add_request``: such a request never waits; it
is ``FINISHED_IGNORED`` with its reason and listed in the next step's ``ignored``.

With ``enable_chunked_prefill=False`` a prompt is never cut: it waits until its whole remaining length
fits the budget (vLLM v0, 0.10.2). The orders differ: vLLM v0's default scheduler runs prefills first (a step
with new prefills runs no decodes: ``_schedule_default``); vLLM v0 *with chunked prefill*
(``_schedule_chunked_prefill``, both in ``vllm/core/scheduler.py``, 0.10.2) and vLLM v1 run decodes first,
as here.

The scheduling unit is the sequence: the ``n`` samples of a request share the prompt's blocks after
the fork but are scheduled, preempted and swapped one by one (vLLM v1 runs each sample as a request, 0.10.2),
so siblings never crowd each other into an exhausted state. The scheduler advances
``num_computed_tokens`` when it schedules tokens, as vLLM v1's ``Scheduler.schedule`` does (inline in
0.8.5; in ``_update_after_schedule`` in 0.9.2 and 0.10.2).
"""

from __future__ import annotations

import itertools
from bisect import insort
from collections import deque
from collections.abc import Callable

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_manager import BlockSpaceManager
from paged.core.block_table import blocks_needed
from paged.core.scheduler_outputs import ScheduledSeq, SchedulerOutputs, StepResult
from paged.core.sequence import Sequence, SequenceGroup, SequenceStatus

__all__ = ["CacheConfig", "ScheduledSeq", "Scheduler", "SchedulerConfig", "SchedulerOutputs"]

S = SequenceStatus
RUNNING, SWAPPED, WAITING = S.RUNNING, S.SWAPPED, S.WAITING


def update_sequence(seq: Sequence, token: int, max_model_len: int) -> None:
    """Append a sampled ``token`` to ``seq`` and mark it finished on a stop token (``FINISHED_STOPPED``:
    EOS unless ``ignore_eos``, and ``stop_token_ids``), on ``max_tokens`` output tokens or on
    ``max_model_len`` tokens in all (``FINISHED_LENGTH``); a stop token wins over the lengths. The
    ``update`` part (``update_from_output`` below) calls it per sampled token."""
    seq.append_token_id(token)
    if token in seq.group.stop_token_ids:
        seq.status = S.FINISHED_STOPPED
    elif (
        len(seq) - seq.num_prompt_tokens >= seq.group.sampling_params.max_tokens
        or len(seq) >= max_model_len
    ):
        seq.status = S.FINISHED_LENGTH


def update_from_output(
    scheduler: Scheduler, out: SchedulerOutputs, sampled: dict[int, list[int]]
) -> StepResult:
    """Apply a step's sampled tokens: the ``update`` part, which ``Scheduler.update_from_output`` calls
    (vLLM v1 ``Scheduler.update_from_output``, 0.10.2; nano-vllm ``Scheduler.postprocess``).

    ``sampled``: ``{seq_id: token ids}`` from ``ModelRunner.execute_model``, one token per sequence, or
    ``n`` at a request's first sample: the sequence keeps the first and forks a child for each other one
    before appending (``scheduler.fork_seq``: the child shares its blocks, vLLM v0's parallel sampling,
    ``Scheduler.fork_seq`` in ``vllm/core/scheduler.py``, 0.10.2).
    Each token goes through ``update_sequence``; if a sequence finished, ``scheduler.free_finished()``
    frees its blocks at once. Returns the finished requests (ignored and exhausted ones of ``out``
    included) and the sequences that got a token.
    """
    seqs = {entry.seq.seq_id: entry.seq for entry in out.scheduled}
    max_model_len = scheduler.config.max_model_len
    got: list[Sequence] = []
    for seq_id, tokens in sampled.items():
        seq = seqs[seq_id]
        for token in tokens[1:]:
            child = seq.fork(next(scheduler.seq_ids))
            seq.group.seqs.append(child)
            scheduler.fork_seq(seq, child)
            update_sequence(child, token, max_model_len)
            got.append(child)
        update_sequence(seq, tokens[0], max_model_len)
        got.append(seq)
    touched = {s.group.request_id: s.group for s in [*out.ignored, *out.exhausted, *got]}
    if any(s.is_finished for s in got):
        scheduler.free_finished()
    return StepResult([g for g in touched.values() if g.is_finished], got)


class Scheduler:
    """Continuous batching with chunked prefill over a paged KV cache (module docstring).

    Args:
        scheduler_config: step limits, chunking and the preemption mode.
        cache_config: pool sizes, block size, watermark, prefix caching.
        block_manager: the ``BlockSpaceManager`` (its only view of memory); default: built from ``cache_config``.
        update: the ``update`` part, ``(scheduler, out, sampled) -> StepResult``, which
            ``update_from_output`` calls (default: the module's ``update_from_output``).

    Raises:
        ValueError: ``cache_config.num_gpu_blocks`` unset. The configs are trusted: ``EngineConfig`` has
            checked them together (swap preemption needs CPU blocks).
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        block_manager: BlockSpaceManager | None = None,
        update: Callable[[Scheduler, SchedulerOutputs, dict], StepResult] | None = None,
    ):
        if cache_config.num_gpu_blocks is None:
            raise ValueError(
                "cache_config.num_gpu_blocks must be set (the engine sizes the pool first)"
            )
        self.config, self.cache_config = scheduler_config, cache_config
        self.update = update or update_from_output
        self.block_manager = block_manager or BlockSpaceManager(
            cache_config.block_size,
            cache_config.num_gpu_blocks,
            cache_config.num_cpu_blocks,
            watermark=cache_config.watermark,
            enable_prefix_caching=cache_config.enable_prefix_caching,
        )
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()  # admission order: the last one is the next victim
        self.swapped: list[Sequence] = []  # oldest first
        self._requests: dict[str, SequenceGroup] = {}  # every unfinished request, by id
        self._order: dict[str, int] = {}  # arrival rank of each request (FCFS key)
        self._next_rank = 0
        # ids of new sequences: the engine's prompts and their forks
        self.seq_ids = itertools.count()
        self._ignored: list[Sequence] = []  # ended by add_request, reported by the next schedule()
        self._exhausted: list[Sequence] = []  # preempted sequences that can never return (idem)
        self.num_preemptions = self.num_recomputes = self.num_swap_outs = self.num_swap_ins = 0

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, seq_group: SequenceGroup) -> None:
        """Queue a request at the back of ``waiting``. Its sequences must be ``WAITING`` with this block size.

        Whether it can ever run is decided here, once: a prompt over ``max_model_len``, ``n`` over
        ``max_num_seqs``, or a prompt that does not fit beside the watermark in an empty pool is
        ``FINISHED_IGNORED`` with its reason, reported in the next ``schedule()``'s ``ignored``.

        Raises:
            ValueError: a request with this id is unfinished here already, a sequence is not waiting,
                or its ``block_size`` differs from ``cache_config.block_size``.
        """
        rid = seq_group.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already queued or running")
        for seq in seq_group.seqs:
            if seq.status is not WAITING:
                raise ValueError(
                    f"request {rid!r}: sequence {seq.seq_id} is {seq.status.value}, not waiting"
                )
            if seq.block_size != self.cache_config.block_size:
                raise ValueError(
                    f"request {rid!r}: sequence block_size {seq.block_size} != cache block_size "
                    f"{self.cache_config.block_size}"
                )
        self._requests[rid] = seq_group
        self._order[rid], self._next_rank = self._next_rank, self._next_rank + 1
        for seq in seq_group.seqs:
            reason = self._never_reason(seq)
            if reason is None:
                self.waiting.append(seq)
            else:
                self.finish(seq, S.FINISHED_IGNORED, "ignored: " + reason, self._ignored)

    def abort_request(self, request_id: str) -> bool:
        """Finish a request wherever its sequences are as ``FINISHED_ABORTED`` and free their blocks.
        Returns False (and changes nothing) when no unfinished request has this id."""
        group = self._requests.get(request_id)
        if group is None:
            return False
        for queue in (self.waiting, self.running, self.swapped):
            for seq in [s for s in queue if s.group is group]:
                queue.remove(seq)
        for seq in group.seqs:
            self.finish(seq, seq.status if seq.is_finished else S.FINISHED_ABORTED)
        return True

    def fork_seq(self, parent: Sequence, child: Sequence) -> None:
        """Share ``parent``'s blocks with ``child`` (parallel sampling); ``child`` runs from now on.
        The caller appends ``child`` to the request's ``seqs``."""
        self.block_manager.fork(parent, child)
        child.status = RUNNING
        self.running.append(child)

    def free_finished(self) -> None:
        """Finish the running sequences whose status says finished (set by ``update_from_output`` or by
        a simulated engine): free their blocks, drop finished requests. ``schedule()`` calls it first;
        ``update_from_output`` right after a step, to free memory sooner."""
        finished = [s for s in self.running if s.is_finished]
        if finished:
            self.running = deque(s for s in self.running if not s.is_finished)
            for seq in finished:
                self.finish(seq, seq.status)

    def update_from_output(
        self, out: SchedulerOutputs, sampled: dict[int, list[int]]
    ) -> StepResult:
        """Apply a step's sampled tokens with the ``update`` part (the module's ``update_from_output``:
        append, fork ``n`` samples at the first token, finish on a stop token, ``max_tokens`` or
        ``max_model_len``, free finished sequences at once)."""
        return self.update(self, out, sampled)

    def has_unfinished_requests(self) -> bool:
        """Whether a request runs, waits, or ended unreported (ignored or exhausted since the last step)."""
        return bool(self._requests or self._ignored or self._exhausted)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutputs:
        """Build the next step (module docstring: running, then swapped, then waiting).

        Raises:
            RuntimeError: a running sequence has no token left to compute (its sampled token was not
                appended: an engine bug); nothing changes.
        """
        for seq in self.running:  # check the engine's side of the contract before changing anything
            if not seq.is_finished and len(seq) <= seq.num_computed_tokens:
                raise RuntimeError(
                    f"sequence {seq.seq_id} of request {seq.group.request_id!r} has no new token: "
                    "append the sampled token (or finish the sequence) before schedule()"
                )
        self.free_finished()
        out = SchedulerOutputs(ignored=self._ignored, exhausted=self._exhausted)
        self._ignored, self._exhausted = [], []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
            if not self.swapped:
                self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutputs, budget: int) -> int:
        queue, self.running, bm = self.running, deque(), self.block_manager
        while queue:
            seq = queue.popleft()
            n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
            if n == 0:  # no budget left: it keeps its blocks and waits for the next step
                self.running.append(seq)
                continue
            while True:
                new_blocks = bm.allocate_slots(seq, n)
                if new_blocks is not None:
                    out.blocks_to_copy += new_blocks.copies
                    self.running.append(seq)
                    budget -= self._mark_scheduled(seq, n, out)
                    break
                if queue:  # evict the most recently admitted sequence, then try again
                    self._preempt(queue.pop(), out)
                elif self.running:  # older sequences already hold memory this step: yield to them
                    self._preempt(seq, out)
                    break
                else:  # alone in the pool and still no room: it can never grow
                    self._exhaust(seq, out)
                    break
        return budget

    def _schedule_swapped(self, out: SchedulerOutputs, budget: int) -> int:
        bm = self.block_manager
        while self.swapped and self._num_seats() < self.config.max_num_seqs:
            seq = self.swapped[0]
            n = self._chunk(len(seq) - seq.num_computed_tokens, budget)
            if n == 0:
                break
            pairs = bm.swap_in(seq, n)
            if pairs is None:
                if self.running:
                    break  # later: running sequences will free memory
                self.swapped.pop(0)  # nothing runs, yet it does not fit back: recompute it instead
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
        return budget

    def _schedule_waiting(self, out: SchedulerOutputs, budget: int) -> None:
        bm, seats = self.block_manager, self._num_seats()
        while self.waiting:
            seq = self.waiting[0]
            if seats + self._seats(seq) > self.config.max_num_seqs:
                break
            computed = bm.get_computed_blocks(seq)  # the one prefix lookup of this admission
            n = self._chunk(len(seq) - len(computed) * bm.block_size, budget)
            if n == 0 or bm.allocate_slots(seq, n, computed) is None:
                break  # FCFS: wait for budget or memory, nobody overtakes
            self.waiting.popleft()
            seq.status = RUNNING
            seats += self._seats(seq)
            self.running.append(seq)
            budget -= self._mark_scheduled(seq, n, out)

    # ------------------------------------------------------------------ helpers
    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens of a sequence with ``remaining`` uncomputed tokens that run now (0: not this step)."""
        threshold = self.config.long_prefill_token_threshold
        n = min(remaining, threshold) if threshold and remaining > 1 else remaining
        if n <= budget:
            return n
        return budget if self.config.enable_chunked_prefill else 0

    def _mark_scheduled(self, seq: Sequence, n: int, out: SchedulerOutputs) -> int:
        """List ``seq``'s next ``n`` tokens in ``out`` and mark them computed. Returns ``n``."""
        table = self.block_manager.block_tables[seq.seq_id].block_ids
        out.scheduled.append(
            ScheduledSeq(
                seq, seq.num_computed_tokens, n, table, seq.num_computed_tokens + n == len(seq)
            )
        )
        seq.num_computed_tokens += n
        out.num_batched_tokens += n
        return n

    def _seats(self, seq: Sequence) -> int:
        """Running sequences ``seq`` stands for: ``n`` for a request that has not forked yet, else 1."""
        group = seq.group
        return group.sampling_params.n if len(group.seqs) < group.sampling_params.n else 1

    def _num_seats(self) -> int:
        """Seats the running sequences hold (``max_num_seqs`` bounds it): their forks to come included."""
        return sum(map(self._seats, self.running))

    def _never_reason(self, seq: Sequence) -> str | None:
        """Why a new sequence can never run, or None: its length, ``n`` or the whole pool."""
        cfg = self.config
        if len(seq) > cfg.max_model_len:
            return f"prompt of {len(seq)} tokens is longer than max_model_len={cfg.max_model_len}"
        if self._seats(seq) > cfg.max_num_seqs:
            return f"n={self._seats(seq)} sequences exceed max_num_seqs={cfg.max_num_seqs}"
        return self._no_room_reason(seq)

    def _no_room_reason(self, seq: Sequence, what: str = "prompt") -> str | None:
        """Why ``seq`` (a ``what``) can never be admitted to the pool (its whole length beside the watermark),
        or None."""
        bm = self.block_manager
        if bm.can_ever_fit(len(seq)):
            return None
        bs = bm.block_size
        return (
            f"{what} of {len(seq)} tokens needs {blocks_needed(len(seq), bs)} blocks of {bs} tokens; "
            f"the KV cache has {bm.num_gpu_blocks} blocks and admission keeps {bm.watermark_blocks} "
            "free (watermark)"
        )

    def _preempt(self, seq: Sequence, out: SchedulerOutputs) -> None:
        """Evict a running sequence: swap it out if asked and the CPU pool has room, else recompute."""
        self.num_preemptions += 1
        out.preempted.append(seq)
        pairs = None
        if self.config.preemption_mode == "swap":
            pairs = self.block_manager.swap_out(seq)  # None: the CPU pool has no room
        if pairs is not None:
            out.blocks_to_swap_out += pairs
            seq.status = SWAPPED
            self.num_swap_outs += 1
            insort(self.swapped, seq, key=self._rank)
        else:
            self._recompute(seq, out)
            self.num_recomputes += 1

    def _recompute(self, seq: Sequence, out: SchedulerOutputs) -> None:
        """Drop ``seq``'s blocks; it waits at the front of ``waiting`` and is prefilled again from its tokens.
        Victims go newest first, so the front stays oldest first. One that grew too long to be admitted
        again ends ``FINISHED_KV_EXHAUSTED`` instead (listed in ``out.exhausted``)."""
        self.block_manager.free(seq)
        reason = self._no_room_reason(seq, "sequence")
        if reason is not None:
            self.finish(
                seq, S.FINISHED_KV_EXHAUSTED, "KV cache exhausted: " + reason, out.exhausted
            )
            return
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def _exhaust(self, seq: Sequence, out: SchedulerOutputs) -> None:
        bs, total = self.cache_config.block_size, self.block_manager.num_gpu_blocks
        need = blocks_needed(seq.num_computed_tokens + 1, bs)
        self.finish(
            seq,
            S.FINISHED_KV_EXHAUSTED,
            f"KV cache exhausted: sequence {seq.seq_id} of request {seq.group.request_id!r} needs {need} "
            f"blocks of {bs} tokens to grow past {seq.num_computed_tokens} tokens, but it alone already "
            f"holds the whole cache of {total} blocks",
            out.exhausted,
        )

    def finish(
        self,
        seq: Sequence,
        status: SequenceStatus,
        message: str | None = None,
        bucket: list | None = None,
    ) -> None:
        """The one way a sequence ends: set its ``FINISHED_*`` ``status`` (and ``finish_message``), free its
        blocks, list it in ``bucket`` (``out.ignored`` / ``out.exhausted``), and drop its request once every
        sequence of it is finished. The caller has taken it out of its queue."""
        seq.status = status
        if message is not None:
            seq.finish_message = message
        self.block_manager.free(seq)
        if bucket is not None:
            bucket.append(seq)
        if seq.group.is_finished:
            self._requests.pop(seq.group.request_id, None)
            self._order.pop(seq.group.request_id, None)

    def _rank(self, seq: Sequence) -> tuple[int, int]:
        return self._order[seq.group.request_id], seq.seq_id
