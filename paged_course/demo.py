"""``python -m paged demo``: the main job. Serve a built-in workload with the paged engine and check it.

1. Load the model (default: the built-in byte-level Llama, ``paged.models``; ``--model`` takes a hub
   name or a local folder) and size the KV cache (printed).
2. Generate for ~64 requests that share a system prompt and differ in question and answer length,
   with continuous batching, prefix caching and a progress bar.
3. Report requests, tokens, tokens/s, KV blocks total and peak, slot utilization, prefix-cache hit
   rate and preemptions.
4. Check a sample of the outputs against transformers' own greedy ``generate`` (same model object).
5. Time transformers' ``generate`` with static batches of 16 (left-padded) on the same workload, in
   the same run, and print the ratio.

On CPU both sides run with ``$PAGED_BENCH_THREADS`` torch threads (default 1, as ``bench engine``): on a
small shared machine extra threads wait on each other and turn the comparison into noise.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from paged_course.bench import timing_threads

SYSTEM_PROMPT = "You are a helpful tutor on LLM serving. Answer briefly and name the data structure involved.\n"
TOPICS = ["block tables", "copy-on-write", "prefix caching", "the watermark", "swapping to CPU",
          "recompute preemption", "slot mapping", "continuous batching", "GQA", "online softmax",
          "the block allocator", "reference counts", "internal fragmentation", "the scheduler"]


def workload(num_requests: int = 64, seed: int = 0) -> list[tuple[str, int]]:
    """``(prompt text, max_tokens)`` pairs: a shared system prompt, a question of varied length, and an
    answer budget of 16-64 tokens."""
    rng = random.Random(seed)
    work = []
    for i in range(num_requests):
        topic = rng.choice(TOPICS)
        detail = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(0, 8)))
        question = f"Question {i}: explain {topic}" + (f", compared with {detail}" if detail else "") + "?\nAnswer:"
        work.append((SYSTEM_PROMPT + question, rng.randint(16, 64)))
    return work


def _encode(tokenizer, text: str, vocab: int) -> list[int]:
    if tokenizer is not None:
        return list(tokenizer(text)["input_ids"])
    return [b % vocab for b in text.encode()]


@torch.inference_mode()
def static_generate(model, prompts: list[list[int]], max_tokens: list[int], batch_size: int = 16,
                    pad_id: int = 0) -> tuple[list[list[int]], float]:
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
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False,
                             eos_token_id=None, pad_token_id=pad_id)
        outs += [gen[j, width : width + n].tolist() for j, n in enumerate(lens)]
    return outs, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m paged demo",
                                     description="The main job: serve a built-in workload with the paged engine.")
    parser.add_argument("--model", default=None, help="hub name or local folder (default: the built-in model)")
    parser.add_argument("--num-requests", type=int, default=64, help="requests in the workload (default 64)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--kv-memory-mb", type=float, default=None,
                        help="KV cache budget in MiB (default: 256 on CPU, profiled on CUDA)")
    parser.add_argument("--check", type=int, default=4, help="outputs checked against transformers (default 4)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the static-batch generate timing")
    args = parser.parse_args(argv)
    if args.num_requests < 1:
        parser.error(f"--num-requests must be >= 1, got {args.num_requests}")

    from paged.core.sequence import SamplingParams
    from paged.engine.llm import LLM
    from paged.worker.attention import use_attention
    from paged_course.compare import greedy_agreement

    torch.manual_seed(0)
    if args.device != "cuda" and not torch.cuda.is_available():
        timing_threads()
    print(f"== paged demo: {args.model or 'built-in byte-level Llama (4 layers, hidden 256, GQA 8/2)'} ==")
    try:
        budget = None if args.kv_memory_mb is None else int(args.kv_memory_mb * 2**20)
        llm = LLM(args.model, device=args.device, kv_cache_memory_bytes=budget)
    except ValueError as err:
        parser.exit(2, f"error: {err}\n")
    model, tokenizer = llm.model, llm.tokenizer
    vocab = model.get_output_embeddings().weight.shape[0]
    work = workload(args.num_requests)
    texts = [text for text, _ in work]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in work]

    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up: one-time costs
    start = time.perf_counter()
    outs = llm.generate(texts if tokenizer is not None else [_encode(None, t, vocab) for t in texts], params)
    seconds = time.perf_counter() - start
    stats = llm.stats()
    prompts = [o.prompt_token_ids for o in outs]
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt_tokens = sum(len(p) for p in prompts)
    print(f"\nrequests            {len(outs)} (shared system prompt of {len(_encode(tokenizer, SYSTEM_PROMPT, vocab))} "
          "tokens, questions and answers of varied length)")
    print(f"tokens              {prompt_tokens} prompt, {generated} generated, "
          f"{stats['computed_tokens']} computed (the other {prompt_tokens + generated - stats['computed_tokens']}: "
          "prefix-cache hits, and each request's last token, which is never fed back)")
    print(f"time                {seconds:.2f} s, {generated / seconds:.0f} generated tokens/s, {stats['steps']} steps")
    print(f"KV blocks           {stats['kv_blocks_total']} total x {stats['block_size']} tokens, "
          f"peak {stats['kv_blocks_peak']} in use ({stats['kv_blocks_peak'] / stats['kv_blocks_total']:.1%}), "
          f"{stats['kv_blocks_used']} in use now")
    print(f"slot utilization    {stats['slot_utilization']:.1%} of allocated slots hold a token (mean over steps)")
    print(f"prefix cache        {stats['prefix_cache_hit_rate']:.1%} of prompt tokens were cache hits")
    print(f"preemptions         {stats['preemptions']} (swaps out/in {stats['swap_outs']}/{stats['swap_ins']})")
    print("\nsample outputs (random weights: babble, kept printable):")
    for o in outs[:2]:
        print(f"  [{o.request_id}] ...{(o.prompt or '')[-40:]!r} -> {o.outputs[0].text[:60]!r}")

    checked = list(range(0, len(outs), max(1, len(outs) // max(args.check, 1))))[: args.check]
    if checked:
        use_attention(model, "sdpa")
        device = next(model.parameters()).device
        agree = 0
        with torch.inference_mode():
            for i in checked:
                ids = torch.tensor([prompts[i]], device=device)
                ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=params[i].max_tokens, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)[0, len(prompts[i]):].tolist()
                agree += greedy_agreement(model, prompts[i], outs[i].outputs[0].token_ids, ref).ok
        print(f"\ncheck vs transformers generate (greedy): {agree}/{len(checked)} sampled requests agree "
              "(identical tokens, or parting only at a logit near-tie)")
        if agree < len(checked):
            print("WARNING: outputs differ from transformers beyond a near-tie")

    if not args.no_baseline:
        static_generate(model, prompts[:2], [2, 2])  # warm-up, as for the engine above
        _, base = static_generate(model, prompts, [p.max_tokens for p in params],
                                  pad_id=getattr(tokenizer, "pad_token_id", None) or 0)
        print(f"transformers generate, static batches of 16: {base:.2f} s, {generated / base:.0f} tokens/s "
              f"-> paged engine throughput {base / seconds:.2f}x of it on this workload "
              f"({torch.get_num_threads()} torch thread(s); timings on a busy machine are noisy)")
    return 0 if not checked or agree == len(checked) else 1
