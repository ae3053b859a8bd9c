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
  at once, in one step like any admission (``FragmentationResult.recomputed_tokens`` counts that unpaid work).

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

The event loops live in ``fragmentation_events``; this module turns their segments into the per-step
counts and results. Cost: one Python iteration per event (arrival, finish, preemption), NumPy for everything per token
(``paged_manager``: one iteration per step in which some request takes a block).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paged_course.sim.fragmentation_events import (
    ContiguousAllocator,
    PagedManager,
    _simulate_managed,
    _simulate_paged,
    _simulate_reserving,
)
from paged_course.sim.workload import Trace

MANAGERS = ("static", "contiguous", "paged")
KINDS = ("real", "reserved", "internal", "external")


@dataclass
class FragmentationResult:
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
    contiguous_allocator=None,
) -> FragmentationResult:
    """Run one manager on ``trace`` with a pool of ``pool_slots`` token slots; see the module docstring.

    Args:
        paged_manager: a class with ``PagedManager``'s interface to make the paged manager's decisions
            (``manager="paged"`` only); default: the built-in event loop, which decides the same.
        contiguous_allocator: a class with ``ContiguousAllocator``'s interface to place the contiguous
            manager's runs (``manager="contiguous"`` only); default: ``ContiguousAllocator``, the
            simulator's own.
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
    if contiguous_allocator is not None and manager != "contiguous":
        raise ValueError(
            f"contiguous_allocator places the contiguous manager's runs; manager is {manager!r}"
        )
    if paged_manager is not None:
        seg, intervals, rejected, truncated, pre = _simulate_managed(
            trace, pool_slots, block_size, watermark, paged_manager
        )
    elif manager == "paged":
        seg, intervals, rejected, truncated, pre = _simulate_paged(
            trace, pool_slots, block_size, watermark
        )
    else:
        seg, intervals, rejected, truncated, pre = _simulate_reserving(
            trace, pool_slots, manager, contiguous_allocator or ContiguousAllocator
        )
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
    return FragmentationResult(
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
    contiguous_allocator=None,
) -> dict[str, FragmentationResult]:
    """The three managers on the same trace and pool (``paged_manager``, ``slot_kinds`` and
    ``contiguous_allocator``: as ``simulate``)."""
    return {
        m: simulate(
            trace,
            pool_slots,
            m,
            block_size,
            watermark,
            slot_kinds=slot_kinds,
            paged_manager=paged_manager if m == "paged" else None,
            contiguous_allocator=contiguous_allocator if m == "contiguous" else None,
        )
        for m in MANAGERS
    }


def summary_table(results: dict[str, FragmentationResult]) -> str:
    """A fixed-width table of ``FragmentationResult.summary()`` for each manager (shares in % of the pool)."""
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


__all__ = [
    "KINDS",
    "MANAGERS",
    "ContiguousAllocator",
    "PagedManager",
    "FragmentationResult",
    "compare",
    "max_concurrency",
    "simulate",
    "slot_kinds",
    "summary_table",
]
