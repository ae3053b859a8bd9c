"""Scheduling simulator: the real ``Scheduler`` and ``BlockSpaceManager``, a clock instead of a model.

Every step, ``schedule()`` runs for real; a fake model appends one token per scheduled sequence and a
cost model advances the clock. What it records: per-request timelines (waiting / running / preempted /
swapped), KV blocks in use, tokens per step, throughput. It also runs a static-batching baseline.

Cost model (``CostModel``; seconds, defaults shaped after OPT-13B on an A100 with PCIe 4, the setting
of the PagedAttention paper §6-7; only ratios matter):

    step      = step_overhead_s + per_token_s * (tokens computed in the step) + swap time
    swap time = per block moved: 2 * num_layers transfers (K and V of every layer, as vLLM's cache
                engine copies them) of block_size * kv_bytes_per_token / (2 * num_layers) bytes each,
                each costing transfer_latency_s + bytes / host_link_bytes_per_s

Recompute pays for preemption with prefill tokens computed again (``per_token_s`` each); swap pays
with bytes over the host link, and small blocks pay the per-transfer latency many times
(the paper's Fig. 19: swap is worse at small blocks, recompute's cost does not depend on block size).

Static batching (``simulate_static``): requests in arrival order, ``batch_size`` at a time; a batch
runs until its longest request is done, every row padded to the batch's longest prompt and output;
results come back when the batch ends (transformers' ``generate`` on a padded batch).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from paged.config import CacheConfig, SchedulerConfig
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged.engine.stats import percentile
from paged_course.engine_views import prefills

STATES = ("waiting", "running", "preempted", "swapped")


@dataclass
class CostModel:
    """Seconds per step (module docstring). Defaults: OPT-13B-like, fp16, PCIe 4 x16."""

    step_overhead_s: float = 0.020  # reading the weights once per step (a decode step's floor)
    per_token_s: float = 0.00015  # compute per token in the step (prefill and decode alike)
    kv_bytes_per_token: int = 2 * 40 * 5120 * 2  # K and V, 40 layers, hidden 5120, fp16 = 800 KiB
    num_layers: int = 40
    host_link_bytes_per_s: float = 25e9
    transfer_latency_s: float = 10e-6

    def swap_seconds(self, num_blocks: int, block_size: int) -> float:
        """Time to move ``num_blocks`` blocks one way between GPU and CPU."""
        transfers = num_blocks * 2 * self.num_layers
        nbytes = num_blocks * block_size * self.kv_bytes_per_token
        return transfers * self.transfer_latency_s + nbytes / self.host_link_bytes_per_s

    def step_seconds(
        self, num_tokens: int, num_blocks_swapped: int = 0, block_size: int = 16
    ) -> float:
        return (
            self.step_overhead_s
            + self.per_token_s * num_tokens
            + self.swap_seconds(num_blocks_swapped, block_size)
        )


@dataclass
class Request:
    """One simulated request: when it arrives, its prompt token ids and how many tokens it generates."""

    request_id: str
    arrival_s: float
    prompt: list[int]
    output_len: int


def make_workload(
    num_requests: int,
    seed: int = 0,
    mean_prompt: int = 128,
    mean_output: int = 128,
    max_len: int = 1024,
    rate: float | None = None,
    shared_prefix: int = 0,
) -> list[Request]:
    """Seeded requests with long-tailed lengths (log-normal, sigma 0.8, clipped to ``[1, max_len]``).

    Args:
        rate: requests per second (Poisson arrivals); ``None``: all arrive at time 0 (offline batch).
        shared_prefix: leading prompt tokens every request shares (a system prompt).
    """
    rng = random.Random(seed)
    system = [rng.randrange(1, 30_000) for _ in range(shared_prefix)]
    out, t = [], 0.0

    def draw(mean: float, hi: int) -> int:
        return max(
            1, min(hi, round(rng.lognormvariate(0.0, 0.8) * mean / 1.377))
        )  # E[lognormal] = 1.377

    for i in range(num_requests):
        if rate:
            t += rng.expovariate(rate)
        p = draw(mean_prompt, max_len - shared_prefix - 1)
        prompt = system + [rng.randrange(1, 30_000) for _ in range(p)]
        out.append(Request(f"r{i}", t, prompt, draw(mean_output, max_len - len(prompt))))
    return out


@dataclass
class ScheduleResult:
    """What a run recorded. Times in seconds of the cost model.

    ``timelines[request_id]`` is a list of ``(start, end, state)`` with state in ``STATES``;
    ``steps`` has one dict per step: ``time`` (start), ``seconds``, ``tokens``, ``prefill_tokens``,
    ``running`` (sequences), ``used_blocks``, ``used_slots`` (KV token slots held: blocks x block size,
    or for static batching the slots reserved up front), ``swapped_blocks`` (moved in + out).
    """

    name: str
    total_s: float = 0.0
    steps: list[dict] = field(default_factory=list)
    timelines: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    requests: dict[str, dict] = field(default_factory=dict)
    num_blocks: int = 0
    num_slots: int = 0
    free_blocks_at_end: int = 0
    num_preemptions: int = 0
    recomputed_tokens: int = 0
    swap_s: float = 0.0

    @property
    def output_tokens(self) -> int:
        return sum(r["output_tokens"] for r in self.requests.values())

    @property
    def throughput(self) -> float:
        """Generated tokens per second."""
        return self.output_tokens / self.total_s if self.total_s else 0.0

    @property
    def mean_latency_s(self) -> float:
        """Mean time from arrival to the last token, over finished requests."""
        done = [
            r["finish_s"] - r["arrival_s"]
            for r in self.requests.values()
            if r["finish_s"] is not None
        ]
        return sum(done) / len(done) if done else 0.0

    def latency(self) -> dict[str, float]:
        """p50 / p99 of time to first token (arrival to first token) and inter-token latency (gap between
        consecutive tokens of a request), in seconds, over the requests that produced them."""
        ttft = [
            r["first_token_s"] - r["arrival_s"]
            for r in self.requests.values()
            if r["first_token_s"] is not None
        ]
        itl = [
            b - a
            for r in self.requests.values()
            for a, b in zip(r.get("token_s", []), r.get("token_s", [])[1:])
        ]
        return {
            f"{name}_{tag}": percentile(values, q)
            for name, values in (("ttft", ttft), ("itl", itl))
            for tag, q in (("p50", 0.5), ("p99", 0.99))
        }

    def summary(self) -> dict:
        return {
            "name": self.name,
            "seconds": round(self.total_s, 3),
            "steps": len(self.steps),
            "output_tokens": self.output_tokens,
            "tokens_per_s": round(self.throughput, 1),
            "mean_latency_s": round(self.mean_latency_s, 3),
            "preemptions": self.num_preemptions,
            "recomputed_tokens": self.recomputed_tokens,
            "swap_s": round(self.swap_s, 3),
        }


def _add_segment(timeline: list, t0: float, t1: float, state: str) -> None:
    if timeline and timeline[-1][2] == state and abs(timeline[-1][1] - t0) < 1e-12:
        timeline[-1] = (timeline[-1][0], t1, state)
    else:
        timeline.append((t0, t1, state))


def simulate(
    workload: list[Request],
    scheduler_config: SchedulerConfig,
    cache_config: CacheConfig,
    cost: CostModel | None = None,
    name: str = "continuous",
    max_steps: int = 200_000,
    scheduler_cls=Scheduler,
) -> ScheduleResult:
    """Run the workload through a real ``Scheduler`` (continuous batching). Deterministic.

    The fake model appends token ``(prompt[0] + len(seq)) % 30000``; a request finishes after its
    ``output_len`` tokens or at ``max_model_len``. Preemptions, re-prefilled tokens and swap time are
    counted. ``scheduler_cls``: the engine's ``Scheduler`` or a subclass (a learner's policy, or a step
    order of ``paged_course.sim.step_order``). Raises ``RuntimeError`` past ``max_steps`` (a scheduler
    that stops making progress).
    """
    cost = cost or CostModel()
    sched = scheduler_cls(scheduler_config, cache_config)
    bm, bs = sched.block_manager, cache_config.block_size
    res = ScheduleResult(
        name, num_blocks=cache_config.num_gpu_blocks, num_slots=cache_config.num_gpu_blocks * bs
    )
    pending = sorted(workload, key=lambda r: r.arrival_s)
    by_id = {r.request_id: r for r in workload}
    active: dict[str, SequenceGroup] = {}
    ran: set[str] = set()
    now, next_pending, seq_ids = 0.0, 0, iter(range(10**9))
    while next_pending < len(pending) or sched.has_unfinished_requests():
        if len(res.steps) >= max_steps:
            raise RuntimeError(f"simulation made no progress in {max_steps} steps")
        if not sched.has_unfinished_requests() and pending[next_pending].arrival_s > now:
            now = pending[next_pending].arrival_s  # idle: jump to the next arrival
        while next_pending < len(pending) and pending[next_pending].arrival_s <= now:
            r = pending[next_pending]
            next_pending += 1
            group = SequenceGroup(
                r.request_id,
                [Sequence(next(seq_ids), r.prompt, bs)],
                SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                r.arrival_s,
            )
            sched.add_request(group)
            active[r.request_id] = group
            res.requests[r.request_id] = {
                "arrival_s": r.arrival_s,
                "first_token_s": None,
                "finish_s": None,
                "output_tokens": 0,
                "status": None,
                "preemptions": 0,
                "token_s": [],
            }
            res.timelines[r.request_id] = []
        out = sched.schedule()
        moved = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        seconds = cost.step_seconds(out.num_batched_tokens, moved, bs)
        res.swap_s += cost.swap_seconds(moved, bs)
        for seq in out.preempted:
            res.requests[seq.group.request_id]["preemptions"] += 1
        res.num_preemptions += len(out.preempted)
        prefill_tokens = sum(g.num_tokens for g in prefills(out))
        res.recomputed_tokens += sum(
            g.num_tokens for g in prefills(out) if g.seq.group.request_id in ran
        )
        used = bm.num_gpu_blocks - bm.get_num_free_gpu_blocks()
        res.steps.append(
            {
                "time": now,
                "seconds": seconds,
                "tokens": out.num_batched_tokens,
                "prefill_tokens": prefill_tokens,
                "running": len(out.scheduled),
                "used_blocks": used,
                "used_slots": used * bs,
                "swapped_blocks": moved,
            }
        )
        end = now + seconds
        scheduled = {g.seq.group.request_id for g in out.scheduled}
        for rid, group in list(
            active.items()
        ):  # timelines: the state of every active request this step
            seq = group.seqs[0]
            if rid in scheduled:
                state = "running"
            elif seq.status is SequenceStatus.SWAPPED:
                state = "swapped"
            elif seq.status is SequenceStatus.WAITING:
                state = "preempted" if rid in ran else "waiting"
            else:  # ignored or exhausted in this step
                state = None
            if state:
                _add_segment(res.timelines[rid], now, end, state)
        for (
            s
        ) in out.scheduled:  # the fake model: one token per sequence whose tokens are all computed
            rid, seq = s.seq.group.request_id, s.seq
            ran.add(rid)
            if not s.samples_next_token:  # a prompt chunk that is not the last one
                continue
            info = res.requests[rid]
            seq.append_token_id((seq.token_ids[0] + len(seq)) % 30_000)
            info["first_token_s"] = info["first_token_s"] or end
            info["token_s"].append(end)
            if (
                len(seq.output_token_ids) >= by_id[rid].output_len
                or len(seq) >= scheduler_config.max_model_len
            ):
                seq.status = SequenceStatus.FINISHED_LENGTH
        sched.free_finished()  # as the engine does after a step: finished requests leave at once
        for group in {
            x.group.request_id: x.group
            for x in [*out.ignored, *out.exhausted, *(s.seq for s in out.scheduled)]
        }.values():
            if group.is_finished:
                info = res.requests[group.request_id]
                info.update(
                    finish_s=end,
                    status=group.seqs[0].status.value,
                    output_tokens=len(group.seqs[0].output_token_ids),
                )
                active.pop(group.request_id, None)
        now = end
    res.total_s = now - min((r.arrival_s for r in workload), default=0.0)
    res.free_blocks_at_end = bm.get_num_free_gpu_blocks()
    return res


def simulate_static(
    workload: list[Request],
    batch_size: int,
    cost: CostModel | None = None,
    max_model_len: int | None = None,
    name: str = "static",
) -> ScheduleResult:
    """Static batching baseline (module docstring): fixed batches, padded rows, results at batch end.

    Memory: a batch reserves ``batch_size * max_model_len`` slots up front (pre-allocation for the
    longest possible request), so ``batch_size`` is what the KV cache can hold at the maximum length.
    """
    cost = cost or CostModel()
    res = ScheduleResult(name, num_slots=batch_size * max_model_len if max_model_len else 0)
    now = 0.0
    ordered = sorted(workload, key=lambda r: r.arrival_s)
    for i in range(0, len(ordered), batch_size):
        batch = ordered[i : i + batch_size]
        start = max(now, max(r.arrival_s for r in batch))
        longest_prompt = max(len(r.prompt) for r in batch)
        longest_out = max(r.output_len for r in batch)
        rows = len(batch)
        t = start + cost.step_seconds(rows * longest_prompt)  # padded prefill: also yields token 1
        reserved = rows * (max_model_len or longest_prompt + longest_out)
        steps = [
            {
                "time": start,
                "seconds": t - start,
                "tokens": rows * longest_prompt,
                "prefill_tokens": rows * longest_prompt,
                "running": rows,
                "used_blocks": None,
                "used_slots": reserved,
                "swapped_blocks": 0,
            }
        ]
        for _ in range(
            longest_out - 1
        ):  # padded decodes: every row computes until the longest is done
            steps.append(
                {
                    "time": t,
                    "seconds": cost.step_seconds(rows),
                    "tokens": rows,
                    "prefill_tokens": 0,
                    "running": rows,
                    "used_blocks": None,
                    "used_slots": reserved,
                    "swapped_blocks": 0,
                }
            )
            t += steps[-1]["seconds"]
        res.steps += steps
        for r in batch:
            res.timelines[r.request_id] = [(r.arrival_s, start, "waiting"), (start, t, "running")]
            res.requests[r.request_id] = {
                "arrival_s": r.arrival_s,
                "first_token_s": t,
                "finish_s": t,
                "output_tokens": r.output_len,
                "status": "length",
                "preemptions": 0,
            }
        now = t
    res.total_s = now - min((r.arrival_s for r in workload), default=0.0)
    return res


def recompute_vs_swap(
    workload: list[Request],
    block_sizes: list[int],
    kv_slots: int,
    max_model_len: int,
    cost: CostModel | None = None,
    max_num_seqs: int = 256,
) -> list[dict]:
    """One row per block size: total seconds and preemption overhead, recompute vs swap.

    The GPU pool holds ``kv_slots`` tokens (``kv_slots // block_size`` blocks) and the CPU swap space
    as many. ``overhead_s`` is the time spent on preemption: recomputed tokens x ``per_token_s`` for
    recompute, swap transfers for swap.
    """
    cost = cost or CostModel()
    rows = []
    for bs in block_sizes:
        row = {"block_size": bs}
        for mode in ("recompute", "swap"):
            cache = CacheConfig(
                block_size=bs,
                num_gpu_blocks=kv_slots // bs,
                num_cpu_blocks=kv_slots // bs,
                watermark=0.01,
            )
            cfg = SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                preemption_mode=mode,
                max_num_batched_tokens=max(max_model_len, max_num_seqs, 2048),
            )
            r = simulate(workload, cfg, cache, cost, name=f"{mode} bs={bs}")
            overhead = r.recomputed_tokens * cost.per_token_s if mode == "recompute" else r.swap_s
            row[f"{mode}_s"] = round(r.total_s, 3)
            row[f"{mode}_overhead_s"] = round(overhead, 3)
            row[f"{mode}_preemptions"] = r.num_preemptions
        rows.append(row)
    return rows


def chunk_budget_sweep(
    workload: list[Request],
    budgets: list[int],
    cache_config: CacheConfig,
    cost: CostModel | None = None,
    max_num_seqs: int = 64,
    max_model_len: int = 2048,
    long_prefill_token_threshold: int = 0,
    v0_default: bool = True,
) -> list[dict]:
    """Chunk budget against latency (Sarathi-Serve, Agrawal et al., OSDI 2024, §3 and Fig. 1/9): one row per
    budget of the engine's scheduler with chunked prefill, then (``v0_default``) one row for vLLM v0's
    default order (prefills first and whole, ``paged_course.sim.step_order.V0DefaultScheduler``, budget
    ``max(max_model_len, 2048)``).

    Each row: ``name``, ``budget``, ``ttft_p50`` / ``ttft_p99`` / ``itl_p50`` / ``itl_p99`` (seconds of the
    cost model, ``ScheduleResult.latency()``), ``tokens_per_s``, ``steps``, ``max_step_s`` (the longest step: the
    worst gap a decoding request can see) and ``preemptions``.
    """
    from paged_course.sim.step_order import V0DefaultScheduler

    cost = cost or CostModel()
    runs = [
        (
            f"chunked, budget {b}",
            b,
            SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                max_num_batched_tokens=b,
                long_prefill_token_threshold=long_prefill_token_threshold,
            ),
            Scheduler,
        )
        for b in budgets
    ]
    if v0_default:
        b = max(max_model_len, 2048)
        runs.append(
            (
                "v0 default (prefills first, whole)",
                b,
                SchedulerConfig(
                    max_num_seqs=max_num_seqs,
                    max_model_len=max_model_len,
                    max_num_batched_tokens=b,
                    enable_chunked_prefill=False,
                ),
                V0DefaultScheduler,
            )
        )
    rows = []
    for name, budget, cfg, cls in runs:
        r = simulate(workload, cfg, cache_config, cost, name=name, scheduler_cls=cls)
        rows.append(
            {
                "name": name,
                "budget": budget,
                **r.latency(),
                "tokens_per_s": r.throughput,
                "steps": len(r.steps),
                "max_step_s": max(s["seconds"] for s in r.steps),
                "preemptions": r.num_preemptions,
            }
        )
    return rows
