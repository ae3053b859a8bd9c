"""Chunked prefill against whole-prompt prefill: time to first token, inter-token latency, throughput.

The trade-off is the subject of Sarathi-Serve (Agrawal et al., OSDI 2024): a step that prefills a long
prompt in one piece stalls every request that is decoding beside it, so their inter-token latency (ITL)
spikes for the length of that prefill; cutting the prompt into chunks that fit a token budget bounds
every step's work, hence the ITL, at the price of a few more steps (a small throughput cost, and a
slightly later first token for the long prompt itself).

Workload (``latency_workload``): short requests that all arrive at the start and decode for a long time,
and long prompts (1,000+ tokens, a few output tokens) that arrive one by one while they decode. Arrivals
are counted in generated tokens, not seconds: long prompt ``j`` enters once the engine has generated
``arrival_tokens`` tokens, so both runs see the same requests at the same point of the decode, whatever
the speed of the machine. Greedy, EOS ignored: both runs generate exactly the same number of tokens.

- ``run_engine``: the real engine (``LLMEngine.step`` driven by hand, requests added at their arrival),
  with chunking on (a budget of ``max_num_batched_tokens`` tokens) or off (whole prompts, vLLM v0's rule).
  TTFT and ITL are the engine's own (``LLM.stats()``, ``paged/engine/stats.py``); throughput is generated
  tokens over the run's wall-clock seconds, and also over this process's CPU seconds: with one torch
  thread on a CPU that is the engine's own work, which other programs on a shared machine do not inflate.
- ``compare_engine``: off and on, alternating, ``repeats`` times each; the median of each figure.
- ``simulate_budgets``: the same requests in the scheduling simulator (``paged_course.sim.scheduling``:
  the real scheduler, a cost model instead of the model) across budgets, chunking off included. Its cost
  model is a fixed cost per step plus a cost per computed token, so chunking costs throughput only
  through the extra steps that small budgets need; the re-reading of a chunk's context K/V is not modelled.
- ``run``: both, printed as tables (``python -m paged bench engine`` calls it), plots when ``out`` is given.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_table import blocks_needed
from paged.core.sequence import SamplingParams
from paged_course.sim.scheduling import CostModel, Request, simulate

LATENCY_KEYS = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
FIGURES = (
    "seconds",
    "cpu_seconds",
    "tok_s",
    "cpu_tok_s",
    *LATENCY_KEYS,
)  # what compare_engine takes medians of
SIM_BUDGETS = (64, 128, 256, 512, 1024, None)  # None: chunking off (whole prompts)


@dataclass(frozen=True)
class LatencyRequest:
    """One request of the latency workload.

    ``arrival_tokens``: the request enters once this many tokens have been generated (0: at the start).
    ``long``: one of the long prompts (the others are the short, long-decoding requests).
    """

    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival_tokens: int
    long: bool


def latency_workload(
    num_short: int = 16,
    num_long: int = 6,
    short_prompt=(16, 64),
    short_output=(128, 160),
    long_prompt=(1000, 1400),
    long_output=(8, 16),
    vocab: int = 2048,
    seed: int = 0,
) -> list[LatencyRequest]:
    """Short requests at the start, long prompts arriving evenly while they decode (module docstring).

    Lengths are uniform in the given inclusive ranges (tokens); token ids uniform in ``[2, vocab)``. Long
    prompt ``j`` (0-based) arrives after ``(j + 1) * num_short * min(short_output) // (num_long + 1)``
    generated tokens, so the arrivals spread over the short requests' decode.

    Raises:
        ValueError: no short request, a negative count, or an empty length range.
    """
    if num_short < 1 or num_long < 0:
        raise ValueError(f"need num_short >= 1 and num_long >= 0, got {num_short} and {num_long}")
    for name, (lo, hi) in (
        ("short_prompt", short_prompt),
        ("short_output", short_output),
        ("long_prompt", long_prompt),
        ("long_output", long_output),
    ):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be a range 1 <= low <= high tokens, got {(lo, hi)}")
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    work = [
        LatencyRequest(
            f"short{i}",
            torch.randint(2, vocab, (draw(*short_prompt),), generator=gen).tolist(),
            draw(*short_output),
            0,
            False,
        )
        for i in range(num_short)
    ]
    gap = num_short * short_output[0] // (num_long + 1)
    work += [
        LatencyRequest(
            f"long{j}",
            torch.randint(2, vocab, (draw(*long_prompt),), generator=gen).tolist(),
            draw(*long_output),
            (j + 1) * gap,
            True,
        )
        for j in range(num_long)
    ]
    return work


def run_engine(
    model,
    work: list[LatencyRequest],
    *,
    chunked: bool,
    budget: int = 256,
    max_num_seqs: int = 32,
    **llm_kwargs,
) -> dict:
    """One run of ``work`` on the engine; returns its figures (seconds; throughput in generated tokens/s).

    Args:
        model: a ``PreTrainedModel`` (the reference model of ``paged_course.bench.engine.bench_model``).
        chunked: chunked prefill with ``max_num_batched_tokens=budget``; False: whole prompts (the budget
            is then the config's default, ``max(max_model_len, 2048)``).
        max_num_seqs: most running sequences (the same for both modes).
        llm_kwargs: more ``LLM`` arguments (``max_model_len`` must hold the longest prompt + output).

    Returns a dict: ``seconds`` (wall clock), ``cpu_seconds`` (``time.process_time``), ``output_tokens``,
    ``tok_s`` and ``cpu_tok_s`` (generated tokens per wall / CPU second), ``ttft_p50/p99`` and ``itl_p50/p99``
    (seconds), ``steps``, ``prefill_chunks``, ``max_step_tokens``, ``tokens`` (per request id) and
    ``step_seconds`` / ``step_prefill_tokens`` (one entry per engine step).
    """
    from paged.engine.llm import LLM

    llm = LLM(
        model,
        verbose=False,
        max_num_seqs=max_num_seqs,
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=budget if chunked else None,
        profile=True,  # the step history and phase seconds
        **llm_kwargs,
    )
    engine = llm.engine
    pending = sorted(work, key=lambda r: r.arrival_tokens)
    tokens: dict[str, list[int]] = {}
    engine.metrics.new_window()
    start, cpu_start = time.perf_counter(), time.process_time()
    while pending or engine.has_unfinished_requests():
        generated = engine.metrics.counters["generated_tokens"]
        while pending and (
            pending[0].arrival_tokens <= generated or not engine.has_unfinished_requests()
        ):
            r = pending.pop(0)
            engine.add_request(
                r.prompt, SamplingParams(max_tokens=r.max_tokens, ignore_eos=True), r.request_id
            )
        for out in engine.step():
            tokens[out.request_id] = out.outputs[0].token_ids
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    stats, history = llm.stats(), engine.metrics.history
    output_tokens = sum(map(len, tokens.values()))
    return {
        "chunked": chunked,
        "budget": llm.config.scheduler.max_num_batched_tokens,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "output_tokens": output_tokens,
        "tok_s": output_tokens / seconds,
        "cpu_tok_s": output_tokens / cpu_seconds,
        **{k: stats[k] for k in LATENCY_KEYS},
        "steps": stats["steps"],
        "prefill_chunks": stats["prefill_chunks"],
        "max_step_tokens": max(h["prefill_tokens"] + h["decode_seqs"] for h in history),
        "tokens": tokens,
        "step_seconds": [h["seconds"] for h in history],
        "step_prefill_tokens": [h["prefill_tokens"] for h in history],
    }


def compare_engine(
    model, work: list[LatencyRequest], budget: int = 256, repeats: int = 3, **kwargs
) -> dict:
    """Chunking off and on (budget ``budget``), ``repeats`` runs each in the order off, on, on, off, ...,
    after one warm-up run.

    Returns ``{"off": ..., "on": ..., "runs": {...}, "same_tokens": bool, "itl_p99_ratio": off / on,
    "throughput_change": on / off - 1, "cpu_throughput_change": the same in tokens per CPU second}``;
    ``off`` and ``on`` hold the median of each figure over the repeats and the step records of the median
    run by p99 ITL (``run_engine``).
    """
    warm = [LatencyRequest("warm", work[-1].prompt[: budget + 8], 2, 0, True), work[0]]
    run_engine(
        model, warm, chunked=True, budget=budget, **kwargs
    )  # first forwards pay one-time costs
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for i in range(
        repeats
    ):  # off, on, on, off, ...: a slow spell of a shared machine hits both alike
        for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
            runs[name].append(
                run_engine(model, work, chunked=name == "on", budget=budget, **kwargs)
            )
    summary = {}
    for name, rs in runs.items():
        typical = sorted(rs, key=lambda r: r["itl_p99"])[len(rs) // 2]
        summary[name] = {**typical, **{k: statistics.median(r[k] for r in rs) for k in FIGURES}}
    off, on = summary["off"], summary["on"]
    return {
        **summary,
        "budget": budget,
        "repeats": repeats,
        "requests": len(work),
        "long_prompts": sum(r.long for r in work),
        "output_tokens": off["output_tokens"],
        "same_tokens": all(a["tokens"] == b["tokens"] for a in runs["off"] for b in runs["on"]),
        "itl_p99_ratio": off["itl_p99"] / on["itl_p99"],
        "throughput_change": on["tok_s"] / off["tok_s"] - 1,
        "cpu_throughput_change": on["cpu_tok_s"] / off["cpu_tok_s"] - 1,
        "runs": {name: [{k: r[k] for k in FIGURES} for r in rs] for name, rs in runs.items()},
    }


def sim_requests(work: list[LatencyRequest], cost: CostModel | None = None) -> list[Request]:
    """``work`` as simulator requests: an arrival of ``a`` generated tokens becomes the cost model's time of
    ``a / num_short`` decode steps of the short requests (``cost.step_seconds(num_short)`` each)."""
    cost = cost or CostModel()
    num_short = sum(not r.long for r in work)
    step = cost.step_seconds(num_short)
    return [
        Request(r.request_id, r.arrival_tokens / num_short * step, list(r.prompt), r.max_tokens)
        for r in work
    ]


def simulate_budgets(
    work: list[LatencyRequest],
    budgets=SIM_BUDGETS,
    cost: CostModel | None = None,
    max_num_seqs: int = 32,
    block_size: int = 16,
    max_model_len: int = 2048,
) -> list[dict]:
    """The workload in the scheduling simulator at each budget (``None``: chunking off); one row each.

    The KV pool holds every request at once (no preemption: the budget alone is compared). Rows:
    ``budget`` (None for off), ``ttft_p50/p99``, ``itl_p50/p99`` (cost-model seconds), ``tok_s``,
    ``steps``, ``max_step_tokens``.
    """
    cost = cost or CostModel()
    requests = sim_requests(work, cost)
    blocks = sum(blocks_needed(len(r.prompt) + r.output_len, block_size) for r in requests) + 1
    rows = []
    for budget in budgets:
        cfg = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=budget is not None,
        )
        res = simulate(
            requests,
            cfg,
            CacheConfig(block_size=block_size, num_gpu_blocks=blocks),
            cost,
            name="off" if budget is None else f"budget {budget}",
        )
        rows.append(
            {
                "budget": budget,
                **res.latency(),
                "tok_s": res.throughput,
                "steps": len(res.steps),
                "max_step_tokens": max(s["tokens"] for s in res.steps),
            }
        )
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f}"


def print_engine(result: dict, cpu: bool = True) -> None:
    """The engine table: p50 / p99 TTFT and ITL (ms), throughput, the ratios and the target's verdict.
    ``cpu``: the run was on a CPU, so throughput per CPU second is shown and judges the throughput part
    (wall-clock seconds on a shared CPU also count the other programs that ran meanwhile)."""
    print(
        f"{'':<22}{'TTFT p50':>9}{'TTFT p99':>9}{'ITL p50':>9}{'ITL p99':>9}{'tokens/s':>10}"
        + (f"{'tok/CPU s':>10}" if cpu else "")
        + f"{'steps':>7}"
    )
    for name, label in (("off", "whole prompts"), ("on", f"chunked, budget {result['budget']}")):
        r = result[name]
        print(
            f"{label:<22}{_ms(r['ttft_p50']):>9}{_ms(r['ttft_p99']):>9}{_ms(r['itl_p50']):>9}"
            f"{_ms(r['itl_p99']):>9}{r['tok_s']:>10.0f}"
            + (f"{r['cpu_tok_s']:>10.0f}" if cpu else "")
            + f"{r['steps']:>7}"
        )
    ratio, wall, per_cpu = (
        result["itl_p99_ratio"],
        result["throughput_change"],
        result["cpu_throughput_change"],
    )
    judged = per_cpu if cpu else wall
    print(
        f"chunked: p99 ITL {ratio:.2f}x lower; throughput {wall:+.1%} per wall-clock second"
        + (f", {per_cpu:+.1%} per CPU second" if cpu else "")
        + f"; same tokens in every run: {result['same_tokens']}"
    )
    print(
        f"target: p99 ITL >= 2x lower at no more than 10% throughput loss{' (per CPU second)' if cpu else ''}: "
        f"{'met' if ratio >= 2 and judged >= -0.10 else 'not met'}"
    )
    if result["repeats"] > 1:
        each = {
            name: ", ".join(f"{r['tok_s']:.0f}" for r in runs)
            for name, runs in result["runs"].items()
        }
        print(
            "tokens/s of each run (their spread is this machine's noise): "
            + "; ".join(f"{name} {values}" for name, values in each.items())
        )


def print_sim(rows: list[dict]) -> None:
    """The simulator table: one row per budget, latencies in ms of the cost model, throughput vs off."""
    off = next(r for r in rows if r["budget"] is None)
    print(
        f"{'budget':>8}{'TTFT p50':>9}{'TTFT p99':>9}{'ITL p50':>9}{'ITL p99':>9}{'tokens/s':>10}{'vs off':>8}"
    )
    for r in rows:
        label = "off" if r["budget"] is None else str(r["budget"])
        print(
            f"{label:>8}{_ms(r['ttft_p50']):>9}{_ms(r['ttft_p99']):>9}{_ms(r['itl_p50']):>9}{_ms(r['itl_p99']):>9}"
            f"{r['tok_s']:>10.0f}{r['tok_s'] / off['tok_s']:>8.2f}"
        )


def run(model, quick: bool = False, out: Path | None = None) -> dict:
    """Engine comparison and simulator sweep on ``latency_workload`` (smaller under ``quick``) for ``model``
    (``paged_course.bench.engine.bench_model()``: its 2,048 positions hold the long prompts); prints the
    tables and returns the results (JSON-able). With ``out``, writes ``engine_latency.png``."""
    from paged_course.bench import timing_threads

    if not torch.cuda.is_available():
        timing_threads()  # one torch thread by default: on a shared CPU extra threads only add noise
    if quick:
        work = latency_workload(
            num_short=6, num_long=2, short_output=(32, 40), long_prompt=(1000, 1050)
        )
    else:
        work = latency_workload()
    engine = compare_engine(model, work, budget=256, repeats=1 if quick else 5, max_model_len=2048)
    longs = [len(r.prompt) for r in work if r.long]
    print(
        f"\nchunked prefill: {len(work) - len(longs)} short requests decoding, {len(longs)} prompts of "
        f"{min(longs)}-{max(longs)} tokens arriving among them ({engine['output_tokens']} generated tokens; "
        f"median of {engine['repeats']} run(s), ms of this machine)"
    )
    print_engine(engine, cpu=not torch.cuda.is_available())
    sim = simulate_budgets(work)
    print(
        "same requests in the scheduling simulator (ms of its cost model, OPT-13B-like on an A100):"
    )
    print_sim(sim)
    if out is not None:
        from paged_course.viz.latency import plot_latency

        fig = plot_latency(engine, sim)
        fig.savefig(Path(out) / "engine_latency.png", dpi=120, bbox_inches="tight")
    for name in ("off", "on"):  # the JSON keeps the figures, not every token and step
        engine[name] = {
            k: v
            for k, v in engine[name].items()
            if k not in ("tokens", "step_seconds", "step_prefill_tokens")
        }
    return {"engine": engine, "sim": sim}
