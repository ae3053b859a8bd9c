"""Trace-driven KV-cache fragmentation simulator: static vs contiguous first-fit vs paged, on one pool.

The pool holds ``pool_slots`` token slots (one slot = one token's K and V in every layer; multiply by
``KVSpec.bytes_per_token`` for bytes). Time advances in decode steps: a request admitted at step ``s``
with ``init`` tokens (its prompt; after a recompute preemption, prompt + tokens generated so far) holds
``L(t) = init + (t - s)`` tokens at step ``t`` and leaves after the step where ``L`` reaches its final
length (prompt + output). Admission is first-come first-served: the head of the queue waits until it
fits, nobody skips ahead. The three managers:

- ``static``: every request gets a fixed slot of ``max_seq_len`` token slots, as when a framework
  pre-allocates a ``[batch, max_seq_len]`` cache (transformers' static cache; the paper's "Orca (Max)").
- ``contiguous``: every request reserves ``prompt_len + max_tokens`` adjacent slots, placed first-fit
  at the lowest address with a large enough hole; frees leave holes (external fragmentation).
- ``paged``: blocks of ``block_size`` slots allocated on demand as the sequence grows (vLLM; paper §4.2);
  admission needs the prompt's blocks plus a watermark of free blocks (``vllm/core/block_manager.py``);
  when a running sequence cannot get its next block, the most recently admitted request is preempted
  and recomputed later (paper §4.5); a request alone in the pool that cannot grow is truncated.
  A recompute costs nothing here: the re-admitted request holds its prompt and generated tokens again
  at once, in one step like any admission (``SimResult.recomputed_tokens`` counts that unpaid work).

Per step the simulator records, in token slots (each kind defined with future knowledge of the final
length, as in the paper's Fig. 2):

- ``real``: slots holding a token's KV.
- ``reserved``: allocated slots this request's own future tokens will fill (static/contiguous: final
  length minus current length; paged: the part of the last block it will still fill).
- ``internal``: allocated slots no token will ever fill (static/contiguous: reservation beyond the final
  length; paged: the slack of the final block, at most ``block_size - 1``).
- ``external``: free slots the waiting head request cannot use although enough memory is free in total
  (contiguous: no single hole is large enough; static: the pool remainder ``pool % max_seq_len``;
  paged: ``pool % block_size``). Zero while nobody waits or while free memory is simply too small.
- ``running``, ``waiting``, ``admitted`` (cumulative first admissions).

These are the paper's three kinds of waste (§3: reserved slots for future tokens, internal
fragmentation from over-provisioning, external fragmentation from the allocator). Other texts cut
differently: the fragmentation article's "internal" waste is all of an unused reservation (``reserved +
internal`` here), and its "reserved" waste is the copies kept for beam search, which this simulator
does not model (every request is one sequence).

``allocated = real + reserved + internal``; ``free = pool - allocated`` (``external`` is part of free).
Requests that can never fit (static: ``max_seq_len > pool``; contiguous: reservation > pool; paged:
prompt blocks > pool) are reported in ``rejected`` and skipped, never a hang.

Two pieces can be swapped for other implementations of the same interface (chapter 01 runs the
learner's): ``simulate(..., paged_manager=cls)`` runs the paged manager's decisions through an object of
``PagedManager``'s interface, stepped by the simulator; ``simulate(..., slot_kinds=fn)`` splits the slots
each request holds at each step into real / reserved / internal with ``fn`` (``slot_kinds``' interface).
Without them the same results come from faster code paths that never call per-request objects.

Cost: one Python iteration per event (arrival, finish, preemption), NumPy for everything per token
(``paged_manager``: one iteration per step in which some request takes a block).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from paged.core.block_manager import AllocStatus
from paged_course.sim.workload import Trace

MANAGERS = ("static", "contiguous", "paged")
KINDS = ("real", "reserved", "internal", "external")


@dataclass
class SimResult:
    """Per-step arrays (length ``num_steps``) and per-request outcomes of one simulation."""

    manager: str
    pool_slots: int
    block_size: int
    real: np.ndarray
    reserved: np.ndarray
    internal: np.ndarray
    external: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    admitted: np.ndarray
    segments: dict = field(repr=False)  # arrays req, start, end, init, final, reserve, offset
    rejected: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    preemptions: int = 0

    @property
    def num_steps(self) -> int:
        return len(self.real)

    @property
    def allocated(self) -> np.ndarray:
        return self.real + self.reserved + self.internal

    @property
    def recomputed_tokens(self) -> int:
        """Tokens prefilled again after recompute preemptions (paged only; 0 for static and contiguous).

        Every stay of a request after its first begins with a prefill of all it held when it was
        preempted (prompt + tokens generated so far): the sum of those ``init`` counts. The simulator
        charges that work nothing: a re-admission takes one step, like any admission, whatever its
        token count, so the paged run's utilization and step count are best cases.
        """
        req, start, init = self.segments["req"], self.segments["start"], self.segments["init"]
        order = np.lexsort((start, req))  # each request's stays in time order
        later = np.zeros(len(req), dtype=bool)
        later[1:] = req[order][1:] == req[order][:-1]
        return int(init[order][later].sum())

    def summary(self) -> dict:
        """Time-averaged figures: ``utilization`` = real / allocated slots; ``token_share`` = real /
        (allocated + external), the paper's Fig. 2 view; ``*_share`` = kind / pool; ``waste_split`` =
        each waste kind over all waste."""
        tot = {k: float(getattr(self, k).sum()) for k in KINDS}
        alloc = tot["real"] + tot["reserved"] + tot["internal"]
        waste = alloc - tot["real"] + tot["external"]
        pool_steps = float(self.pool_slots) * max(self.num_steps, 1)
        return {
            "manager": self.manager,
            "steps": self.num_steps,
            "mean_running": float(self.running.mean()),
            "utilization": tot["real"] / alloc if alloc else 0.0,
            "token_share": tot["real"] / (alloc + tot["external"]) if alloc else 0.0,
            **{f"{k}_share": tot[k] / pool_steps for k in KINDS},
            "free_share": 1.0 - alloc / pool_steps,
            "waste_split": {k: (tot[k] / waste if waste else 0.0) for k in KINDS[1:]},
            "rejected": len(self.rejected),
            "truncated": len(self.truncated),
            "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens,
        }


def _reservation(trace: Trace, manager: str) -> np.ndarray:
    if manager == "static":
        return np.full(trace.n, trace.max_seq_len, dtype=np.int64)
    return trace.prompt_len + trace.max_tokens


def _simulate_reserving(trace: Trace, pool: int, manager: str):
    """Static slots or contiguous first-fit: memory is fixed for a request's whole stay (event loop)."""
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
    # contiguous: holes are hi[k] - lo[k] for k <= count, with lo = [0, end_1, ..] and hi = [start_1, .., pool]
    lo, hi, count = np.zeros(n + 2, np.int64), np.full(n + 2, pool, np.int64), 0
    finishing: list[tuple[int, int, int]] = []  # heap of (end step, req, offset)
    waiting: deque[int] = deque()
    seg, intervals, rejected = [], [], []
    t, nxt, used, changed = 0, 0, 0, True

    def place(
        size: int,
    ) -> int | None:  # first fit: the lowest-address hole of at least `size` slots
        nonlocal count
        if manager == "static":
            return free_slots.pop() * msl if free_slots else None
        k = int(np.argmax(hi[: count + 1] - lo[: count + 1] >= size))
        if hi[k] - lo[k] < size:
            return None
        offset = int(lo[k])
        hi[k + 1 : count + 2] = hi[
            k : count + 1
        ].copy()  # the new allocation becomes number k (0-based)
        lo[k + 2 : count + 2] = lo[k + 1 : count + 1].copy()
        hi[k], lo[k + 1], count = offset, offset + size, count + 1
        return offset

    while nxt < n or waiting or finishing:
        while finishing and finishing[0][0] <= t:
            _, r, offset = heapq.heappop(finishing)
            used -= need[r]
            changed = True
            if manager == "static":
                free_slots.append(offset // msl)
            else:
                k = int(np.searchsorted(hi[:count], offset))
                hi[k:count] = hi[k + 1 : count + 1].copy()
                lo[k + 1 : count + 1] = lo[k + 2 : count + 2].copy()
                count -= 1
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


def slot_kinds(tokens, final, held) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split the slots requests hold into ``(real, reserved, internal)`` (the paper's Fig. 2 kinds, §3).

    Args:
        tokens: tokens each request holds now; final: tokens it will hold when it finishes (>= tokens);
        held: slots allocated to it now (static: ``max_seq_len``; contiguous: ``prompt + max_tokens``;
        paged: ``ceil(tokens / block_size) * block_size``). Equal-shaped int arrays.

    Returns int64 arrays of that shape: ``real`` slots hold a token, ``reserved`` slots will hold one of
    this request's future tokens, ``internal`` slots never will; they sum to ``held``.
    """
    tokens, final, held = (np.asarray(a, dtype=np.int64) for a in (tokens, final, held))
    filled = np.minimum(held, final)  # the slots that hold a token at some point of the stay
    return tokens, filled - tokens, held - filled


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


def _per_step_kinds(
    seg: np.ndarray, num_steps: int, manager: str, bs: int, kinds
) -> dict[str, np.ndarray]:
    """Per-step slot counts with a ``slot_kinds``-like function applied to every (request, step) pair.

    Expands each segment into one row per step of its stay (the request's tokens, final length and held
    slots at that step), classifies the rows with ``kinds`` and sums them per step (``bincount``).
    """
    r, s, e, init, final, reserve = (seg[:, k] for k in range(6))
    length = e - s
    row = np.repeat(np.arange(len(seg)), length)
    offset = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    step, tokens = s[row] + offset, init[row] + offset
    held = -(-tokens // bs) * bs if manager == "paged" else reserve[row]
    out = kinds(tokens, final[row], held)
    if len(out) != 3 or any(np.shape(a) != tokens.shape for a in out):
        raise ValueError(
            f"slot_kinds must return (real, reserved, internal), each of shape {tokens.shape}"
        )

    def per_step(weights):
        return np.bincount(step, np.asarray(weights, dtype=float), minlength=num_steps)[:num_steps]

    return {
        "real": per_step(out[0]),
        "reserved": per_step(out[1]),
        "internal": per_step(out[2]),
        "running": np.bincount(step, minlength=num_steps)[:num_steps].astype(float),
    }


def _per_step(seg: np.ndarray, num_steps: int, manager: str, bs: int) -> dict[str, np.ndarray]:
    """Rebuild per-step slot counts from residency segments (difference arrays, no per-token loop).

    A segment ``(req, start s, end e, init, final, reserve)`` holds ``init + t - s`` tokens at steps
    ``s <= t < e``. Every per-step sum is a difference array (+value at the first step, -value after
    the last) turned into a running total by ``cumsum``; a paged segment adds ``bs`` at each step where
    it starts a new block. Sums stay below 2**53, so float64 ``bincount`` is exact.
    """
    r, s, e, init, final, reserve = (seg[:, k] for k in range(6))

    def steps(points, weights):  # sum of weights landing on each step, then running total
        return np.cumsum(np.bincount(points, weights, minlength=num_steps + 1)[:num_steps])

    def over(start, stop, value):  # `value` held at every step of [start, stop)
        return steps(np.concatenate([start, stop]), np.concatenate([value, -value]).astype(float))

    count = over(s, e, np.ones_like(s))
    real = over(s, e, init - s) + count * np.arange(num_steps)
    if manager != "paged":
        return {
            "real": real,
            "allocated": over(s, e, reserve),
            "internal": over(s, e, reserve - final),
            "running": count,
        }
    b0 = -(-init // bs)  # blocks taken at admission
    first = (
        s + b0 * bs + 1 - init
    )  # step of the first new block, then every bs steps while resident
    n_new = np.maximum(0, (e - 1 - first) // bs + 1)
    j = np.arange(n_new.sum()) - np.repeat(np.cumsum(n_new) - n_new, n_new)
    growth = np.repeat(first, n_new) + j * bs
    allocated = steps(
        np.concatenate([s, e, growth]),
        np.concatenate([b0 * bs, -(b0 + n_new) * bs, np.full(len(growth), bs)]).astype(float),
    )
    last_block = -(-final // bs)  # internal waste: the final block's slack, once that block exists
    t_final = s + np.maximum(0, (last_block - 1) * bs + 1 - init)
    hit = t_final < e
    internal = over(t_final[hit], e[hit], (last_block * bs - final)[hit])
    return {"real": real, "allocated": allocated, "internal": internal, "running": count}


def simulate(
    trace: Trace,
    pool_slots: int,
    manager: str,
    block_size: int = 16,
    watermark: float = 0.01,
    *,
    paged_manager=None,
    slot_kinds=None,
) -> SimResult:
    """Run one manager on ``trace`` with a pool of ``pool_slots`` token slots; see the module docstring.

    Args:
        paged_manager: a class with ``PagedManager``'s interface to make the paged manager's decisions
            (``manager="paged"`` only); default: the built-in event loop, which decides the same.
        slot_kinds: a function with ``slot_kinds``' interface to split each request's held slots into
            real / reserved / internal at every step; default: the built-in accounting, which gives the same.

    Raises:
        ValueError: an unknown manager, ``pool_slots`` or ``block_size`` <= 0, watermark outside [0, 1),
            ``paged_manager`` with another manager than ``paged``, a ``slot_kinds`` whose output has the
            wrong shape.
    """
    if manager not in MANAGERS:
        raise ValueError(f"manager must be one of {MANAGERS}, got {manager!r}")
    if pool_slots <= 0 or block_size <= 0:
        raise ValueError(
            f"pool_slots and block_size must be > 0, got pool_slots={pool_slots}, "
            f"block_size={block_size}"
        )
    if not 0 <= watermark < 1:
        raise ValueError(f"watermark must be in [0, 1), got {watermark}")
    if paged_manager is not None and manager != "paged":
        raise ValueError(f"paged_manager replaces the paged manager; manager is {manager!r}")
    if paged_manager is not None:
        seg, intervals, rejected, truncated, pre = _simulate_managed(
            trace, pool_slots, block_size, watermark, paged_manager
        )
    elif manager == "paged":
        seg, intervals, rejected, truncated, pre = _simulate_paged(
            trace, pool_slots, block_size, watermark
        )
    else:
        seg, intervals, rejected, truncated, pre = _simulate_reserving(trace, pool_slots, manager)
    seg_arr = np.array(seg, dtype=np.int64).reshape(-1, 7)
    num_steps = int(seg_arr[:, 2].max()) if len(seg_arr) else 0
    iv = np.array(intervals, dtype=np.int64).reshape(-1, 4)
    iv = iv[iv[:, 0] < num_steps]
    lengths = np.minimum(iv[:, 1], num_steps) - iv[:, 0]
    admitted = np.zeros(num_steps + 1, np.int64)
    by_req = seg_arr[np.lexsort((seg_arr[:, 1], seg_arr[:, 0]))]
    first_admit = by_req[np.unique(by_req[:, 0], return_index=True)[1], 1]
    np.add.at(admitted, first_admit, 1)
    if slot_kinds is None:
        steps = _per_step(seg_arr, num_steps, manager, block_size)
        steps["reserved"] = steps["allocated"] - steps["real"] - steps["internal"]
    else:
        steps = _per_step_kinds(seg_arr, num_steps, manager, block_size, slot_kinds)
    real, reserved, internal, running = (
        np.rint(steps[k]).astype(np.int64) for k in ("real", "reserved", "internal", "running")
    )
    names = ["req", "start", "end", "init", "final", "reserve", "offset"]
    return SimResult(
        manager,
        pool_slots,
        block_size,
        real,
        reserved,
        internal,
        np.repeat(iv[:, 3], lengths),
        running,
        np.repeat(iv[:, 2], lengths),
        np.cumsum(admitted)[:num_steps],
        {k: seg_arr[:, i] for i, k in enumerate(names)},
        np.array(rejected, np.int64),
        np.array(truncated, np.int64),
        pre,
    )


def compare(
    trace: Trace,
    pool_slots: int,
    block_size: int = 16,
    watermark: float = 0.01,
    *,
    paged_manager=None,
    slot_kinds=None,
) -> dict[str, SimResult]:
    """The three managers on the same trace and pool (``paged_manager`` and ``slot_kinds``: as ``simulate``)."""
    return {
        m: simulate(
            trace,
            pool_slots,
            m,
            block_size,
            watermark,
            slot_kinds=slot_kinds,
            paged_manager=paged_manager if m == "paged" else None,
        )
        for m in MANAGERS
    }


def summary_table(results: dict[str, SimResult]) -> str:
    """A fixed-width table of ``SimResult.summary()`` for each manager (shares in % of the pool)."""
    head = (
        f"{'manager':<11}{'steps':>8}{'running':>9}{'util':>7}{'tokens':>8}{'reserv':>8}{'intern':>8}"
        f"{'extern':>8}{'free':>7}{'rej':>5}{'preempt':>8}"
    )
    rows = [head, "-" * len(head)]
    for res in results.values():
        s = res.summary()
        rows.append(
            f"{s['manager']:<11}{s['steps']:>8}{s['mean_running']:>9.1f}{s['utilization']:>7.1%}"
            f"{s['real_share']:>8.1%}{s['reserved_share']:>8.1%}{s['internal_share']:>8.1%}"
            f"{s['external_share']:>8.1%}{s['free_share']:>7.1%}{s['rejected']:>5}{s['preemptions']:>8}"
        )
    return "\n".join(rows)


def max_concurrency(
    pool_slots: int,
    seq_len: int,
    manager: str = "paged",
    block_size: int = 16,
    max_seq_len: int | None = None,
) -> int:
    """How many ``seq_len``-token sequences fit in the pool at once (chapter 08's capacity arithmetic).

    static: ``pool // max_seq_len`` (default ``max_seq_len = seq_len``); contiguous: ``pool // seq_len``;
    paged: ``(pool // block_size) // ceil(seq_len / block_size)``.
    """
    if min(pool_slots, seq_len, block_size) <= 0:
        raise ValueError(
            f"pool_slots, seq_len and block_size must be > 0, got {pool_slots}, {seq_len}, "
            f"{block_size}"
        )
    if manager == "static":
        return pool_slots // (max_seq_len or seq_len)
    if manager == "contiguous":
        return pool_slots // seq_len
    if manager == "paged":
        return (pool_slots // block_size) // -(-seq_len // block_size)
    raise ValueError(f"manager must be one of {MANAGERS}, got {manager!r}")
