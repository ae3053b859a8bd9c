"""``python -m paged demo``: the main job. Serve a built-in workload with the paged engine and check it.

1. Load the model (default: the built-in byte-level Llama, ``paged.models``; ``--model`` takes a hub
   name or a local folder) and size the KV cache (printed). Bad flags exit through argparse (code 2)
   with the numbers, e.g. a ``--kv-memory-mb`` below one block (the engine's ``block_bytes``).
2. Warm up on a throwaway engine, then generate for ~64 requests that share a system prompt and
   differ in question and answer length, with continuous batching, prefix caching and a progress bar,
   on an engine whose stats start from zero.
3. Report the requests completed in full, and the ignored / KV-cache-exhausted ones grouped by their
   ``finish_message`` (``paged.engine.llm.group_finish_messages``); tokens, KV blocks total and peak,
   slot utilization, prefix-cache hit rate and preemptions.
4. Throughput over the requests completed in full only: all of them, or (when some did not complete)
   those requests timed again on their own on a fresh engine of the same size; none: no number.
5. Check a sample of the completed outputs against transformers' own greedy ``generate`` (same model
   object).
6. Time transformers' ``generate`` with static batches of 16 (left-padded) on the same completed
   requests, in the same run, and print the ratio when transformers generated every token too.

On CPU both sides run with ``$PAGED_BENCH_THREADS`` torch threads (default 1, as ``bench engine``): on a
small shared machine extra threads wait on each other and turn the comparison into noise.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import time
import warnings

import torch

from paged_course.bench import timing_threads

BLOCK_SIZE = 16  # tokens per KV block (the engine's default)
SYSTEM_PROMPT = (
    "You are a helpful tutor on LLM serving. Answer briefly and name the data structure involved.\n"
)
TOPICS = [
    "block tables",
    "copy-on-write",
    "prefix caching",
    "the watermark",
    "swapping to CPU",
    "recompute preemption",
    "slot mapping",
    "continuous batching",
    "GQA",
    "online softmax",
    "the block allocator",
    "reference counts",
    "internal fragmentation",
    "the scheduler",
]


def workload(num_requests: int = 64, seed: int = 0) -> list[tuple[str, int]]:
    """``(prompt text, max_tokens)`` pairs: a shared system prompt, a question of varied length, and an
    answer budget of 16-64 tokens."""
    rng = random.Random(seed)
    work = []
    for i in range(num_requests):
        topic = rng.choice(TOPICS)
        detail = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(0, 8)))
        question = (
            f"Question {i}: explain {topic}"
            + (f", compared with {detail}" if detail else "")
            + "?\nAnswer:"
        )
        work.append((SYSTEM_PROMPT + question, rng.randint(16, 64)))
    return work


def _encode(tokenizer, text: str, vocab: int) -> list[int]:
    if tokenizer is not None:
        return list(tokenizer(text)["input_ids"])
    return [b % vocab for b in text.encode()]


@torch.inference_mode()
def static_generate(
    model, prompts: list[list[int]], max_tokens: list[int], batch_size: int = 16, pad_id: int = 0
) -> tuple[list[list[int]], float]:
    """transformers ``generate`` in static left-padded batches (each batch runs to its longest answer)."""
    from paged.worker.attention import use_attention

    use_attention(model, "sdpa")
    device = next(model.parameters()).device
    outs, start = [], time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch, lens = prompts[i : i + batch_size], max_tokens[i : i + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max(lens),
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad_id,
        )
        outs += [gen[j, width : width + n].tolist() for j, n in enumerate(lens)]
    return outs, time.perf_counter() - start


def _ids(request_ids: list[str], limit: int = 8) -> str:
    shown = ", ".join(request_ids[:limit])
    return shown + (f", ... ({len(request_ids) - limit} more)" if len(request_ids) > limit else "")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _report_unfinished(outs, total: int, group_finish_messages) -> None:
    """Each ignored / exhausted / cut-short request, grouped by reason (numbers that differ as ranges)."""
    kinds = [
        ("ignored", "never ran", lambda r: r == "ignored"),
        ("KV cache exhausted", "stopped early", lambda r: r == "kv_cache_exhausted"),
        (
            "cut short",
            "ended before max_tokens",
            lambda r: r not in ("ignored", "kv_cache_exhausted"),
        ),
    ]
    for label, what, match in kinds:
        group = [o for o in outs if match(o.outputs[0].finish_reason)]
        if not group:
            continue
        reason = group[0].outputs[0].finish_reason if label != "cut short" else "length / stop"
        print(
            f"{label:<20}{len(group)} of {_n(total, 'request')} {what} (finish_reason {reason!r}):"
        )
        for count, summary, request_ids in group_finish_messages(group):
            print(
                f"  {count} x {summary}  [{'request' if count == 1 else 'requests'} {_ids(request_ids)}]"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m paged demo",
        description="The main job: serve a built-in workload with the paged engine.",
    )
    parser.add_argument(
        "--model", default=None, help="hub name or local folder (default: the built-in model)"
    )
    parser.add_argument(
        "--num-requests", type=int, default=64, help="requests in the workload (default 64)"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--kv-memory-mb",
        type=float,
        default=None,
        help="KV cache budget in MiB (default: 256 on CPU, profiled on CUDA)",
    )
    parser.add_argument(
        "--check", type=int, default=4, help="outputs checked against transformers (default 4)"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the static-batch generate timing"
    )
    args = parser.parse_args(argv)
    if args.num_requests < 1:
        parser.error(f"--num-requests must be >= 1, got {args.num_requests}")
    if args.check < 0:
        parser.error(
            f"--check must be >= 0 (the number of outputs compared with transformers), got {args.check}"
        )
    mb = args.kv_memory_mb
    if mb is not None and not (math.isfinite(mb) and mb >= 0):
        parser.error(f"--kv-memory-mb must be a positive KV cache budget in MiB, got {mb:g}")

    from paged.core.block_table import blocks_needed
    from paged.core.sequence import SamplingParams
    from paged.engine.llm import LLM, IgnoredRequestWarning, group_finish_messages
    from paged.engine.model_loader import load_model, resolve_device
    from paged.worker.attention import use_attention
    from paged.worker.kv_cache import block_bytes
    from paged.worker.worker import kv_shape
    from paged_course.reference.compare import greedy_agreement

    if str(args.device).startswith("cuda") and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        parser.error(
            f"--device {args.device}: this torch ({torch.__version__}, {build}) sees no CUDA GPU; "
            "run with --device cpu, or leave --device out (the default is CUDA when available, else CPU)"
        )
    try:
        device = resolve_device(args.device)
    except ValueError as err:
        parser.error(f"--device {args.device}: {err}")
    torch.manual_seed(0)
    if device.type == "cpu":
        timing_threads()
    print(
        f"== paged demo: {args.model or 'built-in byte-level Llama (4 layers, hidden 256, GQA 8/2)'} =="
    )
    try:
        model, tokenizer = load_model(args.model, None)
    except (TypeError, ValueError) as err:
        parser.error(f"--model {args.model}: {err}")
    layers, kv_heads, head_dim = kv_shape(model)
    dtype = next(model.parameters()).dtype
    per_block = block_bytes(
        layers, kv_heads, head_dim, BLOCK_SIZE, dtype
    )  # the engine's own sizing
    budget = None if mb is None else int(mb * 2**20)
    if budget is not None and budget < per_block:
        parser.error(
            f"--kv-memory-mb {mb:g} holds no KV block of {per_block} bytes (2 x {layers} layers x "
            f"{kv_heads} KV heads x {head_dim} x {BLOCK_SIZE} tokens x {dtype}); the smallest budget is "
            f"{per_block / 2**20:g} MiB"
        )
    try:
        llm = LLM(
            model,
            tokenizer=tokenizer,
            block_size=BLOCK_SIZE,
            device=device,
            kv_cache_memory_bytes=budget,
        )
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    model = llm.model
    vocab = model.get_output_embeddings().weight.shape[0]
    work = workload(args.num_requests)
    inputs = [text if tokenizer is not None else _encode(None, text, vocab) for text, _ in work]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in work]
    fresh = dict(tokenizer=tokenizer, block_size=BLOCK_SIZE, device=device, verbose=False)

    # warm-up (one-time costs) on a throwaway engine, so that the reported run's stats start from zero
    LLM(model, num_gpu_blocks=2, **fresh).generate(
        [[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredRequestWarning)  # reported below, grouped by reason
        start = time.perf_counter()
        outs = llm.generate(inputs, params)
        seconds = time.perf_counter() - start
    stats = llm.stats()
    prompts = [o.prompt_token_ids for o in outs]
    done = [i for i, o in enumerate(outs) if len(o.outputs[0].token_ids) == params[i].max_tokens]
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt_tokens = sum(len(p) for p in prompts)
    print(
        f"\nrequests            {len(outs)} (shared system prompt of {len(_encode(tokenizer, SYSTEM_PROMPT, vocab))} "
        "tokens, questions and answers of varied length)"
    )
    print(f"completed in full   {len(done)} of {len(outs)} (every answer token generated)")
    _report_unfinished(
        [o for i, o in enumerate(outs) if i not in set(done)], len(outs), group_finish_messages
    )
    ignored = [i for i, o in enumerate(outs) if o.outputs[0].finish_reason == "ignored"]
    skipped = sum(len(prompts[i]) for i in ignored)  # prompts that never ran
    other = prompt_tokens + generated - stats["computed_tokens"]
    hits = "prefix-cache hits, and each request's last token, which is never fed back"
    why = (
        hits
        if not skipped
        else f"{skipped} in the {_n(len(ignored), 'ignored prompt')}"
        + (f"; {other - skipped}: {hits}" if other - skipped else "")
    )
    print(
        f"tokens              {prompt_tokens} prompt, {generated} generated, {stats['computed_tokens']} computed"
        + (f" (the other {other}: {why})" if other else "")
    )
    print(
        f"time                {seconds:.2f} s for the {len(outs)} requests, {stats['steps']} steps"
    )
    print(
        f"KV blocks           {stats['kv_blocks_total']} total x {stats['block_size']} tokens, "
        f"peak {stats['kv_blocks_peak']} in use ({stats['kv_blocks_peak'] / stats['kv_blocks_total']:.1%}), "
        f"{stats['kv_blocks_used']} in use now"
    )
    print(
        f"slot utilization    {stats['slot_utilization']:.1%} of allocated slots hold a token (mean over steps)"
    )
    print(
        f"prefix cache        {stats['prefix_cache_hit_rate']:.1%} of the prompt tokens looked up were cache hits"
        + (" (prompts that ran)" if ignored else "")
    )
    print(
        f"preemptions         {stats['preemptions']} (swaps out/in {stats['swap_outs']}/{stats['swap_ins']})"
    )

    # throughput: only over requests completed in full; a partial workload is timed again on its own
    paged_seconds = seconds if len(done) == len(outs) else None
    if done and paged_seconds is None:
        total_blocks = stats["kv_blocks_total"]
        llm = None  # free its pool before the next one (on CUDA it may hold most of the GPU)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        again = LLM(model, num_gpu_blocks=total_blocks, **fresh)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IgnoredRequestWarning)
            start = time.perf_counter()
            rerun = again.generate(
                [inputs[i] for i in done], [params[i] for i in done], use_tqdm=False
            )
            elapsed = time.perf_counter() - start
        if all(len(o.outputs[0].token_ids) == params[i].max_tokens for i, o in zip(done, rerun)):
            paged_seconds = elapsed
    done_tokens = sum(params[i].max_tokens for i in done)
    if not done:
        # a request's KV holds its prompt and all answer tokens but the last (never fed back)
        alone = max(
            blocks_needed(len(p) + sp.max_tokens - 1, BLOCK_SIZE) for p, sp in zip(prompts, params)
        )
        print(
            f"throughput          none: no request completed in full, so no tokens/s and no ratio against "
            f"transformers (the largest request fills {alone} blocks = {alone * per_block / 2**20:.2f} MiB "
            "on its own)"
        )
    elif paged_seconds is None:
        print(
            f"throughput          none: the {_n(len(done), 'request')} completed in full did not all complete again "
            "when timed on their own, so no tokens/s and no ratio against transformers"
        )
    elif len(done) == len(outs):
        print(
            f"throughput          {done_tokens / paged_seconds:.0f} generated tokens/s "
            f"(all {len(outs)} requests completed in full)"
        )
    else:
        print(
            f"throughput          {done_tokens / paged_seconds:.0f} generated tokens/s over the "
            f"{_n(len(done), 'request')} completed in full ({done_tokens} tokens), timed again on their own: "
            f"{paged_seconds:.2f} s on a fresh engine of the same {stats['kv_blocks_total']} blocks"
        )

    if done:
        print("\nsample outputs (random weights: babble, kept printable):")
        for i in done[:2]:
            o = outs[i]
            print(f"  [{o.request_id}] ...{(o.prompt or '')[-40:]!r} -> {o.outputs[0].text[:60]!r}")

    checked = done[:: max(1, len(done) // max(args.check, 1))][: args.check]
    agree = 0
    if checked:
        use_attention(model, "sdpa")
        with torch.inference_mode():
            for i in checked:
                ids = torch.tensor([prompts[i]], device=device)
                ref = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=params[i].max_tokens,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )[0, len(prompts[i]) :].tolist()
                agree += greedy_agreement(model, prompts[i], outs[i].outputs[0].token_ids, ref).ok
        print(
            f"\ncheck vs transformers generate (greedy): {agree}/{len(checked)} sampled requests agree "
            "(identical tokens, or parting only at a logit near-tie)"
        )
        if agree < len(checked):
            print("WARNING: outputs differ from transformers beyond a near-tie")
    elif args.check:
        print("\ncheck vs transformers generate: skipped, no request completed in full")

    if not args.no_baseline and paged_seconds is not None:
        sub_prompts, sub_tokens = [prompts[i] for i in done], [params[i].max_tokens for i in done]
        static_generate(
            model, sub_prompts[:2], [2] * len(sub_prompts[:2])
        )  # warm-up, as for the engine above
        base_outs, base = static_generate(
            model, sub_prompts, sub_tokens, pad_id=getattr(tokenizer, "pad_token_id", None) or 0
        )
        same = f"the same {_n(len(done), 'request')}" + (
            "" if len(done) == len(outs) else " (those completed in full)"
        )
        if any(len(out) != n for out, n in zip(base_outs, sub_tokens)):
            print(
                f"transformers generate, static batches of 16, {same}: did not generate every token, so no ratio"
            )
        else:
            print(
                f"transformers generate, static batches of 16, {same}: {base:.2f} s, "
                f"{done_tokens / base:.0f} tokens/s -> paged engine throughput {base / paged_seconds:.2f}x of it "
                f"({torch.get_num_threads()} torch thread(s); timings on a busy machine are noisy)"
            )
    return 0 if agree == len(checked) else 1
