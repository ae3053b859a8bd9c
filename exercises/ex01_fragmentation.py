# Generated from solutions/ex01_fragmentation.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

"""Exercise 01: the waste accounting and the paged manager of the fragmentation simulator (chapter 01).

You write two pieces of ``paged_course.sim.fragmentation`` and the chapter runs the simulator on them:

- ``slot_kinds(tokens, final, held)`` (ch01.ex1) splits the slots a request holds into real tokens,
  reserved slots and internal waste; ``simulate(..., slot_kinds=slot_kinds)`` applies it to every
  request at every step of a run.
- ``PagedManager`` decides for the paged manager: ``can_allocate`` (ch01.ex2) admits a request above a
  watermark of free blocks, ``grow`` (ch01.ex3) gives a running request its next block and preempts
  the most recently admitted request when none is free. ``simulate(..., paged_manager=PagedManager)``
  steps the simulation through your class.

The simulator's own versions (same names, same interfaces) are the reference; the graded tests compare
with plain loops written in the tests and with the simulator's own results. Check each step in the
chapter with ``check("ch01.ex1")`` (and ex2, ex3) or with ``python -m paged grade ch01``.
"""

from __future__ import annotations

import numpy as np

from paged.core.block_manager import AllocStatus

PART_REGIONS = {"slot_kinds": ("ch01.ex1",), "PagedManager": ("ch01.ex2", "ch01.ex3")}


def slot_kinds(tokens, final, held) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split the slots requests hold now into ``(real, reserved, internal)`` (PagedAttention paper §3, Fig. 2).

    Args:
        tokens: tokens each request holds now (1-D int array).
        final: tokens each request will hold when it finishes (``>= tokens``): the accounting knows the
            future, as the paper's Fig. 2 does.
        held: token slots allocated to each request now. Static: ``max_seq_len``; contiguous:
            ``prompt + max_tokens``; paged: ``ceil(tokens / block_size) * block_size`` (never below
            ``tokens``).

    Returns:
        Three int64 arrays shaped like ``tokens``: ``real`` slots hold a token now, ``reserved`` slots
        are empty but one of this request's future tokens will fill them, ``internal`` slots will stay
        empty until the request leaves. For every request they add up to ``held``.

    Invariants: ``real + reserved + internal == held`` and each is ``>= 0``, request by request, whatever
    its position in the batch; the inputs are not modified (an int64 array reaches the region as the
    caller's own array, without a copy). Vectorized: the simulator calls it for every request at every step.
    """
    tokens, final, held = (np.asarray(a, dtype=np.int64) for a in (tokens, final, held))
    raise NotImplementedError("ch01.ex1: (real, reserved, internal) per request; see the docstring")


class PagedManager:
    """The paged manager of the simulator: counts the blocks of each running request (blocks are not
    placed: any free block serves any request).

    ``simulate(trace, pool, "paged", block_size, watermark, paged_manager=PagedManager)`` builds
    ``PagedManager(pool // block_size, block_size, watermark)`` and, in every step, calls ``free`` for
    the requests that finished, ``can_allocate`` for the new arrivals (``NEVER``: rejected), ``grow`` for
    every running request whose tokens just overflowed its blocks (oldest admission first), then
    ``can_allocate`` and ``allocate`` for the head of the waiting queue while the answer is ``OK``.
    A request ``grow`` preempted goes back to the front of the waiting queue holding its prompt and the
    tokens it generated (recomputation, paper §4.5), unless it was the only one running: then it is cut
    short (truncated).

    State (set up for you; keep it up to date):
        held: ``{request id: blocks it holds}`` in admission order (the most recently admitted last;
            ``allocate`` adds at the end, ``free`` removes).
        num_free_blocks: blocks no request holds.
        watermark_blocks: ``int(watermark * num_blocks)``, the free blocks admission must leave.
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

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> AllocStatus:
        """May a request holding ``num_tokens`` tokens be admitted now? (vLLM v0 ``BlockSpaceManager.can_allocate``)

        ``AllocStatus.NEVER`` when its blocks do not fit beside the watermark even in an empty pool;
        ``AllocStatus.OK`` when taking them leaves at least ``watermark_blocks`` blocks free;
        ``AllocStatus.LATER`` otherwise. Changes nothing (admission is ``allocate``'s job).

        The edges: a request that leaves exactly ``watermark_blocks`` free is ``OK``; ``num_tokens`` an exact
        multiple of ``block_size`` needs no extra block.
        """
        raise NotImplementedError(
            "ch01.ex2: OK, LATER or NEVER for this many tokens (see the docstring)"
        )

    def allocate(self, req: int, num_tokens: int) -> None:
        """Admit ``req`` holding ``num_tokens`` tokens (its prompt, or all it held when it was preempted)."""
        need = self.blocks_for(num_tokens)
        if req in self.held or need > self.num_free_blocks:
            raise ValueError(
                f"allocate: request {req} is running already, or needs {need} blocks with "
                f"{self.num_free_blocks} free"
            )
        self.held[req] = need
        self.num_free_blocks -= need

    def free(self, req: int) -> None:
        """``req`` leaves (it finished, or it is preempted): its blocks go back to the pool."""
        self.num_free_blocks += self.held.pop(req)

    def grow(self, req: int, num_tokens: int) -> list[int]:
        """``req`` now holds ``num_tokens`` tokens: give it one more block if they overflow its blocks.

        When no block is free, preempt the most recently admitted request (``free`` it) until one is,
        or until ``req`` itself is preempted: then it takes no block. Returns the preempted request ids
        in the order they were preempted (``[]`` when nobody was).

        Invariants: ``num_free_blocks + sum(held.values()) == num_blocks``; a request never holds more
        blocks than ``blocks_for(num_tokens)``. Finding the newest request costs the same with 100,000
        running requests as with 10 (the simulator calls ``grow`` at every step for every growing request).
        """
        # Spot the bug: this grow runs and looks right, and it passes some of its checks, but one case
        # of the docstring goes wrong (chapter 01 shows the symptom). Fix it; the region counts only
        # when every one of its checks passes.
        if self.blocks_for(num_tokens) <= self.held[req]:
            return []
        victims = []
        while self.num_free_blocks == 0:
            victim = next(reversed(self.held))
            self.free(victim)
            victims.append(victim)
        self.held[req] += 1
        self.num_free_blocks -= 1
        return victims
