"""What one scheduling step tells the engine: ``SchedulerOutputs`` and its per-request entries.

The scheduler (``paged/core/scheduler.py``) fills these; the engine reads them. vLLM v0 calls the same
object ``SchedulerOutputs`` (``vllm/core/scheduler.py``); the per-sequence ``start`` / ``num_tokens``
pair is vLLM v1's ``num_computed_tokens`` / ``num_scheduled_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.core.block_manager import BlockSpaceManager
from paged.core.sequence import Sequence, SequenceGroup


@dataclass
class ScheduledSeq:
    """One sequence in this step: compute ``token_ids[start : start + num_tokens]`` at those positions.

    ``start`` is the sequence's ``num_computed_tokens`` before this step (tokens ``0 .. start-1`` already
    have K/V in the pool: earlier steps or prefix-cache hits). After ``schedule()`` returns,
    ``seq.num_computed_tokens == start + num_tokens == len(seq)``. A prefill has ``num_tokens >= 1`` (a
    fully cached prompt still computes its last token), a decode exactly 1.
    """

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start : self.start + self.num_tokens]

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.num_tokens)


@dataclass
class ScheduledGroup:
    """One request in this step: its group and the sequences that run (all unfinished ones: gang scheduling)."""

    seq_group: SequenceGroup
    seqs: list[ScheduledSeq]
    is_prefill: bool

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)


@dataclass
class SchedulerOutputs:
    """What the engine does in one step. Every list is in scheduling order.

    Fields:
        prefills: requests admitted from ``waiting`` in this step (new, or preempted by recompute);
            each sequence computes every token from its ``start`` on (``start`` > 0 after a prefix-cache hit).
        decodes: running and swapped-in requests; each sequence computes its one newest token.
        preempted: requests preempted in this step (the victim's sequences are now ``SWAPPED``, or
            ``WAITING`` with ``num_computed_tokens == 0`` after recompute preemption).
        swapped_in: requests brought back from the CPU pool in this step (also listed in ``decodes``).
        ignored: requests that can never run, now ``FINISHED_IGNORED`` with ``finish_message``; no blocks.
        exhausted: requests that can never grow, now ``FINISHED_KV_EXHAUSTED`` with ``finish_message``;
            their blocks are already freed.
        blocks_to_swap_out: ``(gpu_block, cpu_block)`` pairs to copy GPU -> CPU.
        blocks_to_swap_in: ``(cpu_block, gpu_block)`` pairs to copy CPU -> GPU.
        blocks_to_copy: ``(src, dst)`` GPU block pairs (copy-on-write of a shared last block).
        num_batched_tokens: tokens computed in this step (sum of ``num_tokens`` of every scheduled sequence).

    Engine contract, in this order:

    1. Report ``ignored`` and ``exhausted`` as finished (their blocks are already free).
    2. Move KV: ``blocks_to_swap_out`` *first* (those GPU blocks are free again and may be handed to
       another sequence in this very step), then ``blocks_to_swap_in``, then ``blocks_to_copy``.
    3. Run the model once on every scheduled sequence's ``token_ids`` at ``positions`` (prefills and
       decodes may share the step), writing K/V to ``slot = table[p // bs] * bs + p % bs`` with the tables
       of ``seq_block_tables()``. In each layer, write the K/V of *all* scheduled tokens before any
       attention reads: a prefill's prefix-cache hit may name blocks another prefill of the same step fills.
    4. Sample one token per scheduled sequence from its last position; ``seq.append_token_id(t)``. For
       ``n > 1``, at the request's first prefill (``is_prefill and len(seq_group.seqs) < n``) fork the
       other samples: ``child = seq.fork(new_id)``, ``seq_group.seqs.append(child)``,
       ``scheduler.fork_seq(seq, child)``, then append each one's own token.
    5. Set ``seq.status`` to a ``FINISHED_*`` value when a stop condition holds (stop token, ``max_tokens``,
       or ``len(seq) >= max_model_len``: the scheduler never grows a sequence past what the engine allows);
       ``free_finished()`` (or the next ``schedule()``) frees its blocks.

    The scheduler has already set ``num_computed_tokens = len(seq)`` for every scheduled sequence; the
    engine never changes it. Before the next ``schedule()`` every running sequence must have a new
    (sampled) token, normally exactly one, or be finished; else ``schedule()`` raises ``RuntimeError``.
    """

    prefills: list[ScheduledGroup] = field(default_factory=list)
    decodes: list[ScheduledGroup] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    swapped_in: list[SequenceGroup] = field(default_factory=list)
    ignored: list[SequenceGroup] = field(default_factory=list)
    exhausted: list[SequenceGroup] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    num_batched_tokens: int = 0
    block_manager: BlockSpaceManager | None = field(default=None, repr=False)

    @property
    def scheduled(self) -> list[ScheduledGroup]:
        """Prefills then decodes: every request that computes tokens in this step."""
        return self.prefills + self.decodes

    @property
    def num_seqs(self) -> int:
        return sum(len(g.seqs) for g in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when the step computes nothing and moves no block."""
        return not (self.prefills or self.decodes or self.blocks_to_swap_out)

    def seq_block_tables(self) -> list[tuple[ScheduledSeq, list[int]]]:
        """``(scheduled sequence, its GPU block table)`` for every scheduled sequence, prefills first.

        Tables are read when called (call it right after ``schedule()``); block ids index the GPU pool.
        """
        return [(s, self.block_manager.get_block_table(s.seq)) for g in self.scheduled for s in g.seqs]
