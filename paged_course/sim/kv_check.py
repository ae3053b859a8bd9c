"""A fake engine that checks what every token attends to: the harness of the chapter 05 and 06 graded tests.

``CheckedEngine(scheduler)`` plays the engine's side of the ``SchedulerOutputs`` contract
(``paged/core/scheduler_outputs.py``) without a model. Its KV pool is a dictionary: slot -> the token
prefix whose last token's K/V the slot holds (``tuple(token_ids[:p + 1])`` for position ``p``), one for
the GPU pool and one for the CPU swap space. Each ``step()``:

1. calls ``schedule()`` and checks the step's limits (token budget, sequences per step, a decode computes
   one token, ``start`` is where the sequence's K/V end);
2. moves blocks as the contract orders: ``blocks_to_swap_out``, then ``blocks_to_swap_in``, then
   ``blocks_to_copy`` (copy-on-write);
3. "computes" every scheduled token: writes its slot ``table[p // bs] * bs + p % bs``, all writes first;
4. checks every position each scheduled sequence attends to (``0 .. start + num_tokens - 1``): its slot
   must hold exactly that sequence's own prefix. A prefix-cache hit on a wrong block, a skipped copy-on-write,
   a swap whose blocks were never copied, a preempted sequence that kept a stale ``num_computed_tokens``:
   each puts a wrong prefix (or nothing) in some slot and fails here, with the sequence and position;
5. samples: a token computed from the sequence's own tokens (so two forks that differ keep differing),
   forking ``n - 1`` children at a request's first sample, and finishes sequences at ``max_tokens`` or
   ``max_model_len``.

``run()`` repeats until no request is left and raises ``AssertionError`` past ``max_steps`` (a livelock).
"""

from __future__ import annotations

import itertools

from paged.core.sequence import SequenceStatus


class CheckedEngine:
    """Drive ``scheduler`` step by step with a content-checked fake KV pool (module docstring).

    Args:
        scheduler: a ``paged.core.scheduler.Scheduler`` (or a subclass: a learner's policy).
        vocab: sampled tokens are ``0 .. vocab - 1``.

    Attributes:
        log: the ``SchedulerOutputs`` of every step, in order.
        steps: steps run.
    """

    def __init__(self, scheduler, vocab: int = 97):
        self.sched, self.bs, self.vocab = scheduler, scheduler.cache_config.block_size, vocab
        self.gpu: dict[int, tuple] = {}
        self.cpu: dict[int, tuple] = {}
        self.child_ids = itertools.count(1_000_000)
        self.log: list = []
        self.steps = 0

    def _move(self, pairs, src: dict, dst: dict) -> None:
        bs = self.bs
        for a, b in pairs:
            for i in range(bs):
                value = src.get(a * bs + i)
                if value is None:
                    dst.pop(b * bs + i, None)
                else:
                    dst[b * bs + i] = value

    def step(self):
        """One ``schedule()`` and its execution (module docstring). Returns the ``SchedulerOutputs``."""
        cfg, bs = self.sched.config, self.bs
        out = self.sched.schedule()
        self.steps += 1
        self.log.append(out)
        assert out.num_batched_tokens == sum(s.num_tokens for s in out.scheduled), (
            "num_batched_tokens must be the sum of the scheduled tokens"
        )
        budget, seats = cfg.max_num_batched_tokens, cfg.max_num_seqs
        assert out.num_batched_tokens <= budget, (
            f"token budget exceeded: {out.num_batched_tokens} tokens > max_num_batched_tokens={budget}"
        )
        assert len(out.scheduled) <= seats, f"{len(out.scheduled)} sequences > max_num_seqs={seats}"
        seen = set()
        for s in out.scheduled:
            seq = s.seq
            assert seq.seq_id not in seen, f"sequence {seq.seq_id} scheduled twice in one step"
            seen.add(seq.seq_id)
            assert s.num_tokens >= 1, f"sequence {seq.seq_id} scheduled with {s.num_tokens} tokens"
            assert s.start + s.num_tokens <= len(seq), (
                f"sequence {seq.seq_id}: tokens {s.start}..{s.start + s.num_tokens - 1} scheduled, it has {len(seq)}"
            )
            assert seq.num_computed_tokens == s.start + s.num_tokens, (
                f"sequence {seq.seq_id}: num_computed_tokens must advance to start + num_tokens when scheduled"
            )
        self._move(out.blocks_to_swap_out, self.gpu, self.cpu)
        self._move(out.blocks_to_swap_in, self.cpu, self.gpu)
        self._move(out.blocks_to_copy, self.gpu, self.gpu)
        for s in out.scheduled:  # write the K/V of every scheduled token before any attention reads
            table = s.block_table
            assert len(table) * bs >= s.start + s.num_tokens, (
                f"sequence {s.seq.seq_id}: its block table has no slot for position {s.start + s.num_tokens - 1}"
            )
            for p in range(s.start, s.start + s.num_tokens):
                self.gpu[table[p // bs] * bs + p % bs] = tuple(s.seq.token_ids[: p + 1])
        for s in (
            out.scheduled
        ):  # attention: every position so far, cached, recomputed, copied or swapped back
            tokens, table = s.seq.token_ids, s.block_table
            for p in range(s.start + s.num_tokens):
                got = self.gpu.get(table[p // bs] * bs + p % bs)
                assert got == tuple(tokens[: p + 1]), (
                    f"sequence {s.seq.seq_id} position {p}: its slot holds the K/V of "
                    f"{'nothing' if got is None else 'another prefix'}: every token must attend to its own prefix"
                )
        for s in out.scheduled:
            if s.samples_next_token:
                self._sample(s.seq)
        return out

    def _sample(self, seq) -> None:
        group = seq.group
        seqs = [seq]
        while group.sampling_params.n > len(
            group.seqs
        ):  # parallel sampling: fork at the first sample
            child = seq.fork(next(self.child_ids))
            group.seqs.append(child)
            self.sched.fork_seq(seq, child)
            seqs.append(child)
        for s in seqs:
            k = group.seqs.index(s)
            s.append_token_id((sum(s.token_ids) * 31 + len(s) + 7 * k) % self.vocab)
            if (
                len(s.output_token_ids) >= group.sampling_params.max_tokens
                or len(s) >= self.sched.config.max_model_len
            ):
                s.status = SequenceStatus.FINISHED_LENGTH

    def run(self, max_steps: int = 500) -> int:
        """Step until no request is left. Returns the steps run."""
        while self.sched.has_unfinished_requests():
            assert self.steps < max_steps, f"no progress after {max_steps} steps: a livelock"
            self.step()
        return self.steps


def assert_all_free(scheduler) -> None:
    """Every block back in its pool and every queue empty (after ``run()``)."""
    bm = scheduler.block_manager
    assert bm.get_num_free_gpu_blocks() == bm.num_gpu_blocks, (
        f"GPU blocks leaked: {bm.num_gpu_blocks - bm.get_num_free_gpu_blocks()} still in use after every request ended"
    )
    assert bm.get_num_free_cpu_blocks() == bm.num_cpu_blocks, (
        "CPU swap blocks leaked after every request ended"
    )
    assert not (scheduler.waiting or scheduler.running or scheduler.swapped), (
        "queues not empty after every request ended"
    )
