"""Exercise 06: one scheduling step over a tiny model of paged memory (chapter 06).

The real ``paged.core.scheduler.Scheduler`` asks a ``BlockSpaceManager`` about memory. Here memory is one
number, ``free_blocks``, and a request is its token count and the blocks it holds, so the policy stands
alone (PagedAttention paper §4.5; vLLM v0 ``vllm/core/scheduler.py``):

1. ``grow_running``: running requests, oldest first, each get the blocks for their tokens. When the
   free blocks do not suffice, the *most recently admitted* running request still in the queue is
   preempted (all its blocks come back) until the older one fits. If nobody younger is left, the request
   preempts itself, unless nothing older kept running either: then it is alone with every block and
   can never grow, so it is *exhausted*.
2. ``admit_waiting``: only when nobody was preempted. Waiting requests in order (first come, first
   served) are admitted while a seat is left (``max_num_seqs``) and admission leaves at least
   ``watermark_blocks`` free; the first that does not fit stops admission (nobody overtakes).

Check your answers with ``python -m paged grade ch06``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Req:
    """A request in the tiny memory model.

    ``num_tokens``: tokens that need a slot after this step (a running request: its tokens including the
    one it computes now; a waiting request: its prompt). ``num_blocks``: blocks it holds now (0 if waiting).
    """

    request_id: str
    num_tokens: int
    num_blocks: int = 0


@dataclass
class StepPlan:
    """The decision for one step. Lists hold request ids in the order the decisions were made."""

    running: list[str] = field(default_factory=list)  # run this step: kept running ones, then admitted
    preempted: list[str] = field(default_factory=list)
    exhausted: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    free_blocks: int = 0  # free blocks once the step's blocks are handed out


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
    return -(-num_tokens // block_size)


def grow_running(running: list[Req], free_blocks: int, block_size: int, plan: StepPlan) -> int:
    """Give every running request (oldest first) its blocks, preempting the newest when short.

    Fills ``plan.running``, ``plan.preempted`` and ``plan.exhausted``; returns the free blocks left.
    A preempted or exhausted request gives back all the blocks it held (``num_blocks``).
    """
    queue = list(running)
    # BEGIN SOLUTION ch06.ex1 -- oldest from the front; while short of blocks, evict from the back
    while queue:
        req = queue.pop(0)
        need = blocks_for(req.num_tokens, block_size) - req.num_blocks
        while need > free_blocks and queue:
            victim = queue.pop()
            free_blocks += victim.num_blocks
            plan.preempted.append(victim.request_id)
        if need <= free_blocks:
            free_blocks -= need
            plan.running.append(req.request_id)
        elif plan.running:
            free_blocks += req.num_blocks
            plan.preempted.append(req.request_id)
        else:
            free_blocks += req.num_blocks
            plan.exhausted.append(req.request_id)
    # END SOLUTION
    return free_blocks


def admit_waiting(waiting: list[Req], free_blocks: int, block_size: int, max_num_seqs: int,
                  watermark_blocks: int, plan: StepPlan) -> int:
    """Admit waiting requests first come, first served (module docstring). Returns the free blocks left.

    Appends to ``plan.admitted`` and ``plan.running``; ``len(plan.running)`` seats are already taken.
    """
    # BEGIN SOLUTION ch06.ex2 -- stop at the first without a seat or that cuts into the watermark
    for req in waiting:
        need = blocks_for(req.num_tokens, block_size)
        if len(plan.running) >= max_num_seqs or free_blocks - need < watermark_blocks:
            break
        free_blocks -= need
        plan.admitted.append(req.request_id)
        plan.running.append(req.request_id)
    # END SOLUTION
    return free_blocks


def schedule_step(running: list[Req], waiting: list[Req], free_blocks: int, block_size: int,
                  max_num_seqs: int = 256, watermark_blocks: int = 0) -> StepPlan:
    """One step: grow the running requests, then admit waiting ones if nobody was preempted.

    Args:
        running: running requests in admission order (the last one is the first victim).
        waiting: waiting requests in queue order.
        free_blocks: free blocks before the step.
        block_size: tokens per block.
        max_num_seqs: most requests running in one step.
        watermark_blocks: blocks that admission must leave free.
    """
    plan = StepPlan()
    free_blocks = grow_running(running, free_blocks, block_size, plan)
    if not plan.preempted:
        free_blocks = admit_waiting(waiting, free_blocks, block_size, max_num_seqs, watermark_blocks, plan)
    plan.free_blocks = free_blocks
    return plan
