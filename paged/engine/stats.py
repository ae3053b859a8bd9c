"""What the engine measures about itself: counters, latencies, and (when profiling) phases and history.

``LLMEngine.step`` hands one snapshot per step to ``EngineStats.on_step`` (vLLM v1's ``SchedulerStats``,
``vllm/v1/metrics/stats.py``, made once per step by ``Scheduler.make_stats``, 0.10.2). Only with ``profile=True``
does the step run a clock: seconds per phase (``seconds``, the device synced after each phase so that
each is charged its own time) and one ``history`` record per model step; without it ``seconds`` stays
empty, ``history`` is ``None`` and nothing waits for the device. Latencies follow vLLM v1's metrics
(``vllm/v1/metrics/stats.py``, 0.10.2): **time to first token** (TTFT) is a request's first sampled token minus
its arrival; **inter-token latency** (ITL) is the gap between consecutive tokens of one sequence. Both are
kept for the requests of the current window (``LLM.generate`` opens one per call) and reported as p50 / p99.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

# the counters, in the order ``LLMEngine.stats`` reports them
COUNTERS = (
    "swapped_out_blocks",
    "swapped_in_blocks",
    "cow_copies",
    "steps",
    "computed_tokens",
    "generated_tokens",
    "prefill_chunks",
)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by linear interpolation (numpy's default, as
    ``torch.quantile``); 0.0 when empty."""
    return torch.tensor(values, dtype=torch.float64).quantile(q).item() if values else 0.0


class PhaseClock:
    """``mark(phase)`` adds the seconds since the previous mark to ``seconds[phase]``; on CUDA it first
    waits for the device, so that queued kernels are charged to the phase that launched them."""

    def __init__(self, seconds: dict[str, float], device=None):
        self.seconds = seconds
        self.sync = device is not None and getattr(device, "type", None) == "cuda"
        self.device = device
        self.start = self.last = time.perf_counter()

    def __call__(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[phase] += now - self.last
        self.last = now

    def elapsed(self) -> float:
        """Seconds from the clock's start to its last mark."""
        return self.last - self.start


class EngineStats:
    """Counters (``counters``); with ``profile``, seconds per phase (``seconds``) and one ``history`` record
    per model step."""

    def __init__(self, profile: bool = False) -> None:
        self.profile = profile
        self.seconds: dict[str, float] = defaultdict(float)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.history: list[dict] | None = [] if profile else None
        self.peak_used_blocks = 0
        self.util_sum = 0.0
        self.new_window()

    def new_window(self) -> None:
        """Start collecting TTFT / ITL afresh (``LLM.generate`` calls it)."""
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self._last_token: dict[int, float] = {}

    def on_step(self, out, result, block_manager, seconds: float | None = None) -> None:
        """One step's snapshot: counts, peak blocks, the fraction of allocated slots that hold a token,
        token times (TTFT / ITL); with profiling, a ``history`` record (``seconds``: the step's)."""
        if result.sampled:
            self.on_tokens(result.sampled, time.perf_counter())
        if not out.scheduled:
            return
        used_blocks = block_manager.gpu_allocator.num_used_blocks
        block_size = block_manager.block_size
        prefill_tokens = chunks = empty = 0
        for s in out.scheduled:  # one pass over the step's sequences
            chunks += s.is_prefill
            prefill_tokens += s.num_tokens if s.is_prefill else 0
            empty += -(s.start + s.num_tokens) % block_size  # unfilled last-block slots
        counters = self.counters
        counters["steps"] += 1
        counters["computed_tokens"] += out.num_batched_tokens
        counters["prefill_chunks"] += chunks
        counters["cow_copies"] += len(out.blocks_to_copy)
        counters["swapped_out_blocks"] += len(out.blocks_to_swap_out)
        counters["swapped_in_blocks"] += len(out.blocks_to_swap_in)
        self.peak_used_blocks = max(self.peak_used_blocks, used_blocks)
        if used_blocks:
            self.util_sum += max(0.0, 1.0 - empty / (used_blocks * block_size))
        if self.history is not None:
            self.history.append(
                {
                    "prefill_tokens": prefill_tokens,
                    "decode_seqs": len(out.scheduled) - chunks,
                    "used_blocks": used_blocks,
                    "preempted": len(out.preempted),
                    "finished": len(result.finished),
                    "seconds": seconds,
                }
            )

    def on_tokens(self, seqs, now: float) -> None:
        """Each sequence in ``seqs`` got a token at ``now`` (a request's first one sets its TTFT)."""
        self.counters["generated_tokens"] += len(seqs)
        for seq in seqs:
            last = self._last_token.get(seq.seq_id)
            if last is not None:
                self.itl.append(now - last)
            elif seq is seq.group.seqs[0] and len(seq.output_token_ids) == 1:
                self.ttft.append(now - seq.group.arrival_time)
            self._last_token[seq.seq_id] = now

    def latency(self) -> dict[str, float]:
        """p50 / p99 of TTFT and ITL in seconds over the current window."""
        return {
            f"{name}_{tag}": percentile(values, q)
            for name, values in (("ttft", self.ttft), ("itl", self.itl))
            for tag, q in (("p50", 0.5), ("p99", 0.99))
        }
