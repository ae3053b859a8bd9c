"""The fragmentation simulator's event loops: which request holds which slots, from when to when.

One loop per kind of manager: the reserving managers (``static``, ``contiguous`` first-fit) and the paged
manager (on-demand blocks, watermark, recompute preemption), plus the same paged decisions made by an
object with :class:`PagedManager`'s interface (chapter 01 runs the learner's). Each returns segments
(request, start, end, initial and final tokens, reservation, offset) and the waiting queue's intervals;
turning those into per-step slot counts and a ``FragmentationResult`` is ``fragmentation``'s job. It imports
only the trace type and the engine's ``AllocStatus``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

import numpy as np

from paged.core.block_manager import AllocStatus
from paged_course.sim.workload import Trace


def _reservation(trace: Trace, manager: str) -> np.ndarray:
    if manager == "static":
        return np.full(trace.n, trace.max_seq_len, dtype=np.int64)
    return trace.prompt_len + trace.max_tokens


class ContiguousAllocator:
    """The contiguous manager's allocator: runs of adjacent slots, first fit, freed runs merged with the
    holes they touch (chapter 01's ``exercises/ex01_contiguous.py`` states the contract; ``holes`` are
    sorted ``[start, end)`` lists, ``runs`` is ``{start: size}``)."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.holes: list[list[int]] = [[0, num_slots]]
        self.runs: dict[int, int] = {}

    @property
    def free_slots(self) -> int:
        return sum(end - start for start, end in self.holes)

    @property
    def largest_hole(self) -> int:
        return max((end - start for start, end in self.holes), default=0)

    def allocate(self, size: int) -> int | None:
        """The start of a run of ``size`` slots in the lowest hole that holds it; ``None``: no change."""
        for i, (start, end) in enumerate(self.holes):
            if end - start >= size:
                if end - start == size:
                    del self.holes[i]
                else:
                    self.holes[i][0] = start + size
                self.runs[start] = size
                return start
        return None

    def free(self, start: int) -> None:
        """The run at ``start`` back among the holes (binary search), merged with the ones it touches."""
        end = start + self.runs.pop(start)
        i = bisect.bisect(self.holes, [start])
        before = i > 0 and self.holes[i - 1][1] == start
        after = i < len(self.holes) and self.holes[i][0] == end
        if before and after:
            self.holes[i - 1][1] = self.holes.pop(i)[1]
        elif before:
            self.holes[i - 1][1] = end
        elif after:
            self.holes[i][0] = start
        else:
            self.holes.insert(i, [start, end])

    def compact(self) -> list[tuple[int, int, int]]:
        """Slide the runs down in address order; the moved ones as ``(old_start, new_start, size)``, in an
        order safe to copy one after another (chapter 01's ``ch01.ex7`` states the contract)."""
        moves, top, runs = [], 0, {}
        for start in sorted(self.runs):
            if start != top:
                moves.append((start, top, self.runs[start]))
            runs[top] = self.runs[start]
            top += self.runs[start]
        self.runs, self.holes = runs, ([[top, self.num_slots]] if top < self.num_slots else [])
        return moves


def _simulate_reserving(trace: Trace, pool: int, manager: str, allocator_cls=ContiguousAllocator):
    """Static slots or contiguous first-fit: memory is fixed for a request's whole stay (event loop).
    ``allocator_cls``: the contiguous manager's allocator (a class with ``ContiguousAllocator``'s interface,
    chapter 01 passes the learner's)."""
    allocator = allocator_cls(pool)
    need = _reservation(trace, manager).tolist()
    final, prompt, arrival = (
        trace.final_len.tolist(),
        trace.prompt_len.tolist(),
        trace.arrival.tolist(),
    )
    n, msl = trace.n, trace.max_seq_len
    free_slots = list(
        range(pool // msl - 1, -1, -1)
    )  # static: slot indices, lowest on top of the stack
    finishing: list[tuple[int, int, int]] = []  # heap of (end step, req, offset)
    waiting: deque[int] = deque()
    seg, intervals, rejected = [], [], []
    t, nxt, used, changed = 0, 0, 0, True

    def place(size: int) -> int | None:
        if manager == "static":
            return free_slots.pop() * msl if free_slots else None
        return allocator.allocate(size)

    while nxt < n or waiting or finishing:
        while finishing and finishing[0][0] <= t:
            _, r, offset = heapq.heappop(finishing)
            used -= need[r]
            changed = True
            if manager == "static":
                free_slots.append(offset // msl)
            else:
                allocator.free(offset)
        while nxt < n and arrival[nxt] <= t:
            changed |= not waiting
            (rejected.append(nxt) if need[nxt] > pool else waiting.append(nxt))
            nxt += 1
        while (
            waiting and changed
        ):  # nothing new can fit unless memory was freed or the head changed
            offset = place(need[waiting[0]])
            if offset is None:
                break
            r = waiting.popleft()
            end = t + final[r] - prompt[r] + 1
            heapq.heappush(finishing, (end, r, offset))
            seg.append((r, t, end, prompt[r], final[r], need[r], offset))
            used += need[r]
        changed = False
        ext = 0
        if waiting:
            ext = (
                pool % msl
                if manager == "static"
                else (pool - used if pool - used >= need[waiting[0]] else 0)
            )
        t_next = min(
            finishing[0][0] if finishing else math.inf, arrival[nxt] if nxt < n else math.inf
        )
        if t_next == math.inf:
            break
        intervals.append((t, t_next, len(waiting), ext))
        t = t_next
    return seg, intervals, rejected, [], 0


def _simulate_paged(trace: Trace, pool: int, bs: int, watermark: float):
    """Paged blocks on demand with watermark admission and recompute preemption (event loop).

    Blocks are counted, not placed (any free block serves any request). A request admitted at step
    ``s`` with ``init`` tokens takes a new block at every step ``t > s`` with ``L(t) % bs == 1``, i.e.
    when ``t % bs == (s - init + 1) % bs``: its *phase*. Counting the running requests per phase gives
    the blocks wanted over any stretch of steps in O(block_size), so the loop jumps from event to event
    (arrival, finish, pool exhausted) without visiting the steps in between.
    """
    nb = pool // bs
    wm = int(watermark * nb)
    final, prompt, arrival = (
        trace.final_len.tolist(),
        trace.prompt_len.tolist(),
        trace.arrival.tolist(),
    )
    n = trace.n
    running: dict[int, tuple[int, int, int]] = {}  # req -> (start, init, end), in admission order
    phase_count = [0] * bs
    finishing: list[
        tuple[int, int]
    ] = []  # heap of (end, req); entries of preempted stays are skipped
    waiting: deque[tuple[int, int]] = deque()  # (req, tokens to prefill)
    seg, intervals, rejected, truncated = [], [], [], []
    preemptions, t, nxt, used = 0, 0, 0, 0  # used: blocks held by the running requests

    def blocks_at(r: int, at: int) -> int:
        start, init, _ = running[r]
        return -(-(init + at - start) // bs)

    def leave(
        r: int, at: int, held: int
    ) -> int:  # end r's stay before step `at`; tokens it had at at - 1
        nonlocal used
        used -= held
        start, init, _ = running.pop(r)
        phase_count[(start - init + 1) % bs] -= 1
        seg.append((r, start, at, init, final[r], 0, -1))
        return init + at - 1 - start

    def wanted(k: int) -> int:  # new blocks the running requests take in steps t+1 .. t+k
        periods, rest = divmod(k, bs)
        return periods * len(running) + sum(phase_count[(t + j) % bs] for j in range(1, rest + 1))

    while nxt < n or waiting or running:
        while finishing and finishing[0][0] <= t:  # `used` counts blocks held at step t - 1 here
            end, r = heapq.heappop(finishing)
            if r in running and running[r][2] == end:
                leave(r, t, blocks_at(r, t - 1))
        while nxt < n and arrival[nxt] <= t:
            never = -(-prompt[nxt] // bs) > nb - wm  # vLLM's AllocStatus.NEVER
            (rejected.append(nxt) if never else waiting.append((nxt, prompt[nxt])))
            nxt += 1
        used += phase_count[t % bs] if running else 0  # growth at step t
        while used > nb:  # preempt the newest request (recompute later) until the rest fit
            newest = next(reversed(running))
            tokens = leave(newest, t, blocks_at(newest, t))
            if running:
                waiting.appendleft((newest, tokens))
                preemptions += 1
            else:  # alone and still cannot grow: the KV cache is exhausted for this request
                truncated.append(newest)
        while waiting and used + -(-waiting[0][1] // bs) <= nb - wm:
            r, tokens = waiting.popleft()
            end = t + final[r] - tokens + 1
            running[r] = (t, tokens, end)
            phase_count[(t - tokens + 1) % bs] += 1
            heapq.heappush(finishing, (end, r))
            used += -(-tokens // bs)
        # next event: an arrival, a finish, or the first step whose new blocks exceed the free ones
        t_next = min(
            arrival[nxt] if nxt < n else math.inf, finishing[0][0] if finishing else math.inf
        )
        if t_next == math.inf:
            break
        if running:
            free = nb - used
            full = free // len(running)  # whole periods of bs steps that surely fit
            total = full * len(running)
            for k in range(full * bs + 1, min((full + 1) * bs, t_next - t - 1) + 1):
                total += phase_count[(t + k) % bs]
                if total > free:
                    t_next = t + k
                    break
            used += wanted(t_next - t - 1)  # blocks held at step t_next - 1
        intervals.append((t, int(t_next), len(waiting), pool % bs if waiting else 0))
        t = int(t_next)
    return seg, intervals, rejected, truncated, preemptions


class PagedManager:
    """The paged manager's block bookkeeping, one request at a time (what ``simulate`` decides for ``paged``).

    Blocks are counted, not placed: any free block serves any request, so a count per request is the
    whole state. The simulator drives an object of this interface step by step
    (``simulate(..., paged_manager=PagedManager)``); in each step it calls, in this order, ``free`` for the
    requests that finished, ``can_allocate`` for the arrivals (``NEVER``: rejected), ``grow`` for every
    running request whose last block is full, oldest admission first, and ``can_allocate`` / ``allocate``
    for the head of the waiting queue while it answers ``OK`` (first come, first served).

    Args:
        num_blocks: blocks in the pool (``pool_slots // block_size``).
        block_size: token slots per block (> 0).
        watermark: fraction of the pool that admission keeps free: ``watermark_blocks =
            int(watermark * num_blocks)`` (vLLM v0 ``vllm/core/block_manager.py``; chapter 02, seed error E9).

    State: ``held`` maps each running request to the blocks it holds, in admission order (the most
    recently admitted request last; a preempted request that comes back is admitted anew);
    ``num_free_blocks`` is ``num_blocks`` minus their sum.
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01):
        if num_blocks < 0 or block_size <= 0 or not 0 <= watermark < 1:
            raise ValueError(
                f"need num_blocks >= 0, block_size > 0 and watermark in [0, 1), got {num_blocks}, "
                f"{block_size}, {watermark}"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.held: dict[int, int] = {}
        self.num_free_blocks = num_blocks

    def can_allocate(self, num_tokens: int) -> AllocStatus:
        """``NEVER`` if ``num_tokens`` need more blocks than the pool holds beside the watermark, ``OK`` if
        taking them leaves at least ``watermark_blocks`` free, else ``LATER`` (vLLM v0 ``can_allocate``)."""
        need = -(-num_tokens // self.block_size)
        if need > self.num_blocks - self.watermark_blocks:
            return AllocStatus.NEVER
        return (
            AllocStatus.OK
            if self.num_free_blocks - need >= self.watermark_blocks
            else AllocStatus.LATER
        )

    def allocate(self, req: int, num_tokens: int) -> None:
        """Admit ``req`` holding ``num_tokens`` tokens (its prompt, or all it held before a preemption)."""
        need = -(-num_tokens // self.block_size)
        if req in self.held or need > self.num_free_blocks:
            raise ValueError(
                f"allocate: request {req} is running already, or needs {need} blocks with "
                f"{self.num_free_blocks} free"
            )
        self.held[req] = need
        self.num_free_blocks -= need

    def grow(self, req: int, num_tokens: int) -> list[int]:
        """``req`` now holds ``num_tokens`` tokens: give it a block when they overflow its blocks.

        With no free block, the most recently admitted request is preempted (its blocks freed; the
        simulator recomputes it later) until one is free, or until ``req`` itself is the victim (then it
        takes nothing). Returns the preempted requests, in preemption order (paper §4.5: the last
        admitted is the first evicted; vLLM v0 ``Scheduler._schedule_running``).
        """
        if -(-num_tokens // self.block_size) <= self.held[req]:
            return []
        victims = []
        while not self.num_free_blocks:
            victim = next(reversed(self.held))
            self.free(victim)
            victims.append(victim)
            if victim == req:
                return victims
        self.held[req] += 1
        self.num_free_blocks -= 1
        return victims

    def free(self, req: int) -> None:
        """``req`` leaves (finished, or preempted): its blocks return to the pool."""
        self.num_free_blocks += self.held.pop(req)


def _simulate_managed(trace: Trace, pool: int, bs: int, watermark: float, manager_cls):
    """The paged manager through an object of ``PagedManager``'s interface, stepped by the simulator.

    Same output as ``_simulate_paged``. The loop visits only the steps in which something happens: an
    arrival, a finish, or a running request whose last block is full (its *phase*, as in
    ``_simulate_paged``: a request admitted at step ``s`` with ``init`` tokens fills a block at every step
    ``t`` with ``t % bs == (s - init) % bs`` and takes its next one at the step after).
    """
    manager = manager_cls(pool // bs, bs, watermark)
    final, prompt, arrival = (
        trace.final_len.tolist(),
        trace.prompt_len.tolist(),
        trace.arrival.tolist(),
    )
    n = trace.n
    running: dict[int, tuple[int, int, int]] = {}  # req -> (start, init, end), in admission order
    order: dict[int, int] = {}  # req -> admission number, to call grow oldest first
    phases: list[set[int]] = [
        set() for _ in range(bs)
    ]  # requests that take a block at steps t, t % bs == k
    finishing: list[
        tuple[int, int]
    ] = []  # heap of (end, req); entries of preempted stays are skipped
    waiting: deque[tuple[int, int]] = deque()  # (req, tokens to prefill)
    seg, intervals, rejected, truncated = [], [], [], []
    preemptions, t, nxt, admissions = 0, 0, 0, 0

    def leave(r: int, at: int) -> int:  # end r's stay before step `at`; tokens it had at at - 1
        start, init, _ = running.pop(r)
        phases[(start - init + 1) % bs].discard(r)
        seg.append((r, start, at, init, final[r], 0, -1))
        return init + at - 1 - start

    while nxt < n or waiting or running:
        while finishing and finishing[0][0] <= t:
            end, r = heapq.heappop(finishing)
            if r in running and running[r][2] == end:
                manager.free(r)
                leave(r, t)
        while nxt < n and arrival[nxt] <= t:
            never = manager.can_allocate(prompt[nxt]) == AllocStatus.NEVER
            (rejected.append(nxt) if never else waiting.append((nxt, prompt[nxt])))
            nxt += 1
        for r in sorted(phases[t % bs], key=order.__getitem__):
            if r not in running:  # preempted earlier in this step
                continue
            start, init, _ = running[r]
            for victim in manager.grow(r, init + t - start):
                tokens = leave(victim, t)
                if running:
                    waiting.appendleft((victim, tokens))
                    preemptions += 1
                else:  # alone and still cannot grow: the KV cache is exhausted for this request
                    truncated.append(victim)
        while waiting and manager.can_allocate(waiting[0][1]) == AllocStatus.OK:
            r, tokens = waiting.popleft()
            manager.allocate(r, tokens)
            end = t + final[r] - tokens + 1
            running[r], order[r] = (t, tokens, end), admissions
            admissions += 1
            phases[(t - tokens + 1) % bs].add(r)
            heapq.heappush(finishing, (end, r))
        t_next = min(
            arrival[nxt] if nxt < n else math.inf, finishing[0][0] if finishing else math.inf
        )
        if t_next == math.inf:
            break
        if running:  # the next step in which a running request takes a block
            t_next = min(t_next, t + next(k for k in range(1, bs + 1) if phases[(t + k) % bs]))
        intervals.append((t, int(t_next), len(waiting), pool % bs if waiting else 0))
        t = int(t_next)
    return seg, intervals, rejected, truncated, preemptions
