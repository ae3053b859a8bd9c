"""What one scheduling step tells the engine: ``SchedulerOutputs`` and its per-sequence entries.

The scheduler (``paged/core/scheduler.py``) fills these; the engine reads them. vLLM v0 calls the object
``SchedulerOutputs`` (``vllm/core/scheduler.py``, 0.10.2); the per-sequence ``start`` / ``num_tokens`` pair is
vLLM v1's ``num_computed_tokens`` / ``num_scheduled_tokens`` (``vllm/v1/core/sched/output.py``, 0.10.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.core.sequence import Sequence


@dataclass
class ScheduledSeq:
    """One sequence in this step: compute ``token_ids[start : start + num_tokens]`` at those positions.

    ``start`` is the sequence's ``num_computed_tokens`` before this step (tokens ``0 .. start-1`` already
    have K/V in the pool: earlier steps, earlier chunks or prefix-cache hits). A prefill chunk has
    ``num_tokens >= 1`` (a fully cached prompt still computes its last token), a decode exactly 1.
    ``block_table``: the sequence's physical GPU blocks, valid until the next ``schedule()``.
    ``samples_next_token``: after this step every token of the sequence has K/V, so the engine samples its
    next token (False for a prompt chunk that is not the last one); fixed when scheduled, so it stays true
    after the engine appends the sampled token.
    """

    seq: Sequence
    start: int
    num_tokens: int
    block_table: list[int]
    samples_next_token: bool

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start : self.start + self.num_tokens]

    @property
    def is_prefill(self) -> bool:
        """Computes prompt tokens (or several tokens at once, as after a recompute preemption)."""
        return self.start < self.seq.num_prompt_tokens or self.num_tokens > 1


@dataclass
class SchedulerOutputs:
    """What the engine does in one step. Every list is in scheduling order.

    Fields:
        scheduled: the sequences that compute tokens in this step, running ones first (decodes and the
            next chunks of partly computed prompts), then swapped-in ones, then newly admitted ones.
        preempted: sequences preempted in this step (now ``SWAPPED``, or ``WAITING`` with
            ``num_computed_tokens == 0`` after recompute preemption).
        swapped_in: sequences brought back from the CPU pool in this step (also in ``scheduled``).
        ignored: sequences that can never run (decided by ``add_request`` since the last step), now
            ``FINISHED_IGNORED`` with ``finish_message``; no blocks.
        exhausted: sequences that can never grow, now ``FINISHED_KV_EXHAUSTED`` with ``finish_message``;
            their blocks are already freed.
        blocks_to_swap_out: ``(gpu_block, cpu_block)`` pairs to copy GPU -> CPU.
        blocks_to_swap_in: ``(cpu_block, gpu_block)`` pairs to copy CPU -> GPU.
        blocks_to_copy: ``(src, dst)`` GPU block pairs (copy-on-write of a shared last block).
        num_batched_tokens: tokens computed in this step (sum of ``num_tokens``).

    Engine contract, in this order:

    1. Report requests whose sequences are all finished (``ignored`` / ``exhausted`` ones included).
    2. Move KV: ``blocks_to_swap_out`` *first* (those GPU blocks are free again and may be handed to
       another sequence in this very step), then ``blocks_to_swap_in``, then ``blocks_to_copy``.
    3. Run the model once on every scheduled sequence's ``token_ids`` at ``positions``, writing K/V to
       ``slot = table[p // bs] * bs + p % bs``. In each layer, write the K/V of *all* scheduled tokens
       before any attention reads: a prefix-cache hit may name blocks another sequence fills this step.
    4. For each entry with ``samples``, sample one token from its last position (``n`` at a request's
       first sample, ``len(group.seqs) < n``) and hand them to ``scheduler.update_from_output``, which
       appends them, forks the other samples (``scheduler.fork_seq``) and finishes sequences on a stop
       condition (stop token, ``max_tokens``, or ``len(seq) >= max_model_len``). A simulated engine may
       instead append and set ``seq.status`` itself; ``free_finished()`` (or the next ``schedule()``) then
       frees the finished sequences' blocks.

    The scheduler has already advanced ``num_computed_tokens`` by ``num_tokens`` for every entry; the
    engine never changes it. Before the next ``schedule()`` every sequence that sampled must have its new
    token, or be finished; else ``schedule()`` raises ``RuntimeError``.
    """

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    swapped_in: list[Sequence] = field(default_factory=list)
    ignored: list[Sequence] = field(default_factory=list)
    exhausted: list[Sequence] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    num_batched_tokens: int = 0


@dataclass
class StepResult:
    """What ``Scheduler.update_from_output`` made of a step (vLLM v1 returns ``EngineCoreOutputs``,
    ``vllm/v1/core/sched/scheduler.py``, 0.10.2).

    Fields:
        finished: requests whose sequences all finished in this step (ignored and exhausted ones
            included), in the order they were touched.
        sampled: the sequences that got a token in this step, forked children included.
    """

    finished: list = field(default_factory=list)
    sampled: list[Sequence] = field(default_factory=list)
