"""``python -m paged bench engine``: the paged engine against transformers on one CPU workload.

Reference workload: a Llama config with 4 layers, hidden 256, 8 heads / 2 KV heads, vocab
2048, random weights (seed 0); 48 requests, prompts of 16-200 tokens, outputs of 8-96 tokens, greedy,
EOS ignored so every system produces exactly the requested tokens. Same process, same model object,
same dtype and torch threads; each side runs a small warm-up first, and one-time setup (our ``LLM()`` and
its KV pool, ``generate_batch``'s manager and thread) is not timed.

- ``paged``: ``LLM.generate`` on all 48 requests (continuous batching, paged KV, prefix caching on).
- ``static``: transformers ``generate`` in static batches of 16, left-padded, each batch running to its
  longest output (the pre-vLLM way: a batch ends when its slowest request ends).
- ``generate_batch``: transformers' own continuous batching with a paged cache
  (``model.continuous_batching_context_manager``, one ``add_request`` per request with its own
  ``max_new_tokens``; what ``generate_batch`` does, minus its single length for all).

Reported: useful tokens per second for each and the ratios (reported, never asserted), how many
requests produced identical tokens (the rest must part at a near-tie, ``paged_course.compare``), the
engine's time per phase with 64 running sequences (overhead = everything but the model forward), and
throughput against concurrency 1..128 for seed claim C6 (ours vs static ``generate``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from paged.core.sequence import SamplingParams
from paged.worker.attention import use_attention
from paged_course.bench import timing_threads
from paged_course.compare import greedy_agreement


def bench_model(seed: int = 0):
    """The reference model: Llama, 4 layers, hidden 256, 8 heads / 2 KV heads, vocab 2048, fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False, initializer_range=0.05, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval()


def make_workload(num_requests: int = 48, prompt_range=(16, 200), output_range=(8, 96), vocab: int = 2048,
                  seed: int = 0) -> list[tuple[list[int], int]]:
    """``(prompt_token_ids, max_tokens)`` pairs, uniform lengths, token ids in ``[2, vocab)``."""
    gen = torch.Generator().manual_seed(seed)
    work = []
    for _ in range(num_requests):
        p = int(torch.randint(prompt_range[0], prompt_range[1] + 1, (1,), generator=gen))
        o = int(torch.randint(output_range[0], output_range[1] + 1, (1,), generator=gen))
        work.append((torch.randint(2, vocab, (p,), generator=gen).tolist(), o))
    return work


def run_paged(model, work, **llm_kwargs) -> tuple[list[list[int]], float, dict]:
    """Our engine: ``(tokens per request, seconds, stats)``."""
    from paged.engine.llm import LLM

    llm = LLM(model, verbose=False, **llm_kwargs)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in work]
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in work], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return [o.outputs[0].token_ids for o in outs], seconds, llm.stats()


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
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(m for _, m in batch),
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens += [out[j, width : width + m].tolist() for j, (_, m) in enumerate(batch)]
    return tokens, time.perf_counter() - start


def _collect(manager, work, prefix: str) -> dict:
    """Submit ``work`` to a running transformers continuous-batching manager; its finished results by id."""
    results = {}
    for i, (prompt, max_new) in enumerate(work):
        manager.add_request(prompt, request_id=f"{prefix}{i}", max_new_tokens=max_new)
    while len(results) < len(work):
        res = manager.get_result(timeout=5)
        if res is None and not manager.is_running():
            break
        if res is not None and res.is_finished():
            results[res.request_id] = res
    return results


@torch.inference_mode()
def run_generate_batch(model, work) -> tuple[list[list[int]], float, float]:
    """transformers' continuous batching (paged cache), each request with its own ``max_new_tokens``.

    Warmed up like our engine, on the first 4 requests through the same manager (its built-in warm-up runs
    the largest possible batch and takes ~20 s on this CPU; it exists to capture CUDA graphs). Timed from the
    first request to the last result; starting and stopping its thread are not timed. Returns
    ``(tokens per request, seconds, start-up seconds)``: the start-up (manager and warm-up) is reported apart.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    use_attention(model, "sdpa")
    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0,
                              max_new_tokens=max(m for _, m in work))
    # the same KV pool and step budget as our LLM's CPU defaults (256 MiB of 16-token blocks, 2048 tokens a
    # step); left to itself it sizes its cache from the machine's free memory (tens of seconds to allocate)
    block_bytes = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * 16 * 4 * (
        model.config.hidden_size // model.config.num_attention_heads)
    cb_config = ContinuousBatchingConfig(page_size=16, num_blocks=256 * 2**20 // block_bytes, max_batch_tokens=2048)
    begin = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=config, block=True, timeout=30, warmup=False,
                                                   continuous_batching_config=cb_config) as manager:
        _collect(manager, work[:4], "warm-up")
        start = time.perf_counter()
        results = _collect(manager, work, "r")
        seconds = time.perf_counter() - start
    return [list(results[f"r{i}"].generated_tokens)[:m] if f"r{i}" in results else [] for i, (_, m) in
            enumerate(work)], seconds, start - begin


def agreement(model, work, ours, theirs) -> dict:
    """Requests with identical tokens; the others must part at a near-tie (``paged_course.compare``)."""
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
    _, seconds, stats = run_paged(model, work, max_num_seqs=num_seqs)
    phases = stats["seconds"]
    total = sum(phases.values())
    return {"num_seqs": num_seqs, "wall_seconds": seconds, "phases": phases,
            "share": {k: v / total for k, v in phases.items()}, "overhead_share": 1 - phases["forward"] / total,
            "steps": stats["steps"]}


def concurrency_sweep(model, levels, prompt_len: int = 64, max_tokens: int = 32) -> list[dict]:
    """Tokens/s at each concurrency: ``c`` identical-length requests at once, ours vs static ``generate``."""
    rows = []
    for c in levels:
        work = make_workload(c, (prompt_len, prompt_len), (max_tokens, max_tokens), seed=2)
        _, ours, _ = run_paged(model, work, max_num_seqs=max(c, 1))
        _, theirs = run_static(model, work, batch_size=c)
        useful = c * max_tokens
        rows.append({"concurrency": c, "paged_tok_s": useful / ours, "hf_tok_s": useful / theirs})
    return rows


def run(quick: bool = False, out: Path | None = None) -> dict:
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
    useful = sum(m for _, m in work)
    run_paged(model, work[:4])  # warm-up: a first forward pays one-time costs, on both sides
    run_static(model, work[:4])
    ours, t_ours, stats = run_paged(model, work)
    theirs, t_static = run_static(model, work)
    result = {"requests": num, "useful_tokens": useful, "torch_threads": threads,
              "paged": {"seconds": t_ours, "tok_s": useful / t_ours, "stats": stats},
              "static_generate": {"seconds": t_static, "tok_s": useful / t_static,
                                  "agreement": agreement(model, work, ours, theirs)}}
    result["ratio_vs_static"] = t_static / t_ours
    try:
        batch_tokens, t_batch, t_batch_startup = run_generate_batch(model, work)
        result["generate_batch"] = {"seconds": t_batch, "tok_s": useful / t_batch, "startup_seconds": t_batch_startup,
                                    "agreement": agreement(model, work, ours, batch_tokens)}
        result["ratio_vs_generate_batch"] = t_batch / t_ours
    except (ImportError, TypeError) as err:  # a transformers older than the course's pin (>= 5.20) lacks this API
        result["generate_batch"] = {"skipped": f"{type(err).__name__}: {err}"}
        result["ratio_vs_generate_batch"] = None
    device = next(model.parameters()).device
    print(f"workload: {num} requests, prompts 16-200, outputs 8-96 ({useful} tokens), Llama 4x256, vocab 2048, "
          f"{device}, {threads} torch thread(s)")
    print(f"{'system':<34}{'seconds':>9}{'tokens/s':>10}{'ratio':>8}  same tokens")
    print(f"{'paged (this engine)':<34}{t_ours:>9.2f}{useful / t_ours:>10.0f}{1:>8.2f}")
    for name, key in (("transformers generate (static 16)", "static_generate"),
                      ("transformers generate_batch", "generate_batch")):
        r = result[key]
        if "skipped" in r:
            print(f"{name:<34} skipped ({r['skipped']})")
            continue
        ag = r["agreement"]
        print(f"{name:<34}{r['seconds']:>9.2f}{r['tok_s']:>10.0f}{t_ours / r['seconds']:>8.2f}  "
              f"{ag['equal']}/{num} equal, {ag['near_tie']} near-tie, {ag['other']} other")
    print(f"paged is {result['ratio_vs_static']:.2f}x static generate (target >= 3x)")
    if result["ratio_vs_generate_batch"] is not None:
        print(f"paged is {result['ratio_vs_generate_batch']:.2f}x generate_batch (target >= 5x); generate_batch "
              f"also spent {result['generate_batch']['startup_seconds']:.1f} s on start-up (not timed)")
    ov = overhead(model, 64 if not quick else 32)
    result["overhead"] = ov
    print(f"\nengine step breakdown, {ov['num_seqs']} running sequences ({ov['steps']} steps):")
    for phase, seconds in ov["phases"].items():
        print(f"  {phase:<10}{seconds * 1e3:>9.1f} ms  {ov['share'][phase]:>6.1%}")
    print(f"  overhead (all but forward): {ov['overhead_share']:.1%} (target <= 10%)")
    levels = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
    sweep = concurrency_sweep(model, levels, max_tokens=16 if quick else 32)
    result["concurrency"] = sweep
    print(f"\nC6: tokens/s against concurrency (prompt 64, output {16 if quick else 32})")
    print(f"{'concurrency':>12}{'paged':>10}{'generate':>10}")
    for row in sweep:
        print(f"{row['concurrency']:>12}{row['paged_tok_s']:>10.0f}{row['hf_tok_s']:>10.0f}")
    if out is not None:
        from paged_course.viz.measure import plot_concurrency

        ax = plot_concurrency(sweep, device=str(next(model.parameters()).device))
        ax.figure.savefig(Path(out) / "engine_concurrency.png", dpi=120, bbox_inches="tight")
    from paged_course.bench import latency  # chunked prefill: TTFT / ITL with long prompts among running decodes

    result["latency"] = latency.run(model, quick=quick, out=out)
    return result
