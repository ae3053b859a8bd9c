"""Three step orders on one trace: vLLM v0's default scheduler, v0 with chunked prefill, and v1 (chapter 06).

The engine's scheduler (``paged.core.scheduler.Scheduler``) is vLLM v1's: one token budget per step,
running sequences first (decodes and the next chunks of partly computed prompts), then swapped ones,
then new prompts, and nobody admitted in a step that preempted. For comparison only, two subclasses
rebuild vLLM v0's orders from the same policy methods (``vllm/core/scheduler.py``):

- ``V0DefaultScheduler`` (``_schedule_default``, chunked prefill off): new prompts first, whole, unless
  a request is swapped out; a step that admits a prompt runs **no decodes**; only a step without new
  prompts runs the decodes, then swapped sequences (if nobody was preempted). Build it with
  ``enable_chunked_prefill=False`` (a prompt waits until it fits the budget whole).
- ``V0ChunkedScheduler`` (``_schedule_chunked_prefill``): running first, then swapped (if nobody was
  preempted), then new prompts **even in a step that preempted**, into whatever budget is left.

``run_trace`` drives any of them with arrivals by step through the content-checked fake engine
(``paged_course.sim.kv_check.CheckedEngine``) and records what each request did at each step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from paged.config import CacheConfig, SchedulerConfig
from paged.core.scheduler import Scheduler
from paged.core.scheduler_outputs import SchedulerOutputs
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged_course.sim.kv_check import CheckedEngine

__all__ = ["V0DefaultScheduler", "V0ChunkedScheduler", "TraceRequest", "run_trace", "ORDERS"]


def _check_new_tokens(sched: Scheduler) -> None:
    for seq in sched.running:  # the engine's side of the contract, as Scheduler.schedule checks it
        if not seq.is_finished and len(seq) <= seq.num_computed_tokens:
            raise RuntimeError(
                f"sequence {seq.seq_id} has no new token: append the sampled token first"
            )


class V0DefaultScheduler(Scheduler):
    """vLLM v0's default order (module docstring): prefills first and alone, then decodes, then swapped."""

    def schedule(self) -> SchedulerOutputs:
        _check_new_tokens(self)
        self.free_finished()
        out, budget = SchedulerOutputs(), self.config.max_num_batched_tokens
        if not self.swapped:
            self._schedule_waiting(out, budget)
        if not out.scheduled:  # no new prompt in this step: the decodes run
            budget = self._schedule_running(out, budget)
            if not out.preempted:
                self._schedule_swapped(out, budget)
        return out


class V0ChunkedScheduler(Scheduler):
    """vLLM v0 with chunked prefill (module docstring): running, swapped, then new prompts into the rest."""

    def schedule(self) -> SchedulerOutputs:
        _check_new_tokens(self)
        self.free_finished()
        out = SchedulerOutputs()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
        self._schedule_waiting(out, budget)
        return out


ORDERS = {
    "vLLM v0 default": V0DefaultScheduler,
    "vLLM v0, chunked prefill": V0ChunkedScheduler,
    "vLLM v1 (this engine)": Scheduler,
}


@dataclass
class TraceRequest:
    """A request of a trace: its name, prompt length, tokens to generate and the step it arrives at."""

    name: str
    prompt_len: int
    max_tokens: int
    arrival_step: int = 0


def run_trace(
    scheduler_cls,
    requests: list[TraceRequest],
    block_size: int = 4,
    num_gpu_blocks: int = 64,
    max_num_batched_tokens: int = 16,
    max_model_len: int = 64,
    max_num_seqs: int = 8,
    enable_chunked_prefill: bool = True,
    max_steps: int = 200,
) -> list[dict[str, str]]:
    """Run ``requests`` through ``scheduler_cls`` step by step; one dict per step, request -> what it did:
    ``"P<n>"`` (a prefill chunk of n tokens), ``"D"`` (a decode), ``"wait"`` (in the waiting queue),
    ``"stall"`` (running or swapped, but not scheduled in this step), ``"pre"`` (preempted in this step; ``"pre+P6"``:
    preempted, then admitted again in the same step); a request not
    yet arrived or already finished is absent. Every step passes the fake engine's K/V content check."""
    sched = scheduler_cls(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
        ),
        CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks, watermark=0.0),
    )
    engine, ids, groups, steps = CheckedEngine(sched), itertools.count(), {}, []
    for t in itertools.count():
        for r in requests:
            if r.arrival_step == t:
                prompt = [1 + (7 * len(groups) + j) % 50 for j in range(r.prompt_len)]
                groups[r.name] = SequenceGroup(
                    r.name,
                    [Sequence(next(ids), prompt, block_size)],
                    SamplingParams(max_tokens=r.max_tokens),
                )
                sched.add_request(groups[r.name])
        if t > max(r.arrival_step for r in requests) and not sched.has_unfinished_requests():
            return steps
        if t >= max_steps:
            raise RuntimeError(f"the trace did not finish in {max_steps} steps")
        live = {name for name, g in groups.items() if not g.is_finished}
        out = engine.step()
        sched.free_finished()  # as the engine does after a step: finished requests leave at once
        row = {}
        for s in out.scheduled:
            row[s.seq.group.request_id] = f"P{s.num_tokens}" if s.is_prefill else "D"
        for (
            seq
        ) in out.preempted:  # preempted, and (v0 with chunked prefill) maybe admitted again at once
            rid = seq.group.request_id
            row[rid] = "pre" + (f"+{row[rid]}" if rid in row else "")
        for name in live - row.keys():
            seq = groups[name].seqs[0]
            if not seq.is_finished:
                row[name] = "wait" if seq.status is SequenceStatus.WAITING else "stall"
        steps.append(row)
    return steps
