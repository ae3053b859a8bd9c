"""``LLM``: offline batched generation, vLLM style, on the paged engine.

    from paged.engine import LLM            # also: from paged.engine.llm import LLM
    llm = LLM()                             # built-in model; or a hub name, a local path, a model object
    outs = llm.generate(["Hello", "The cache"], SamplingParams(max_tokens=32))
    outs[0].outputs[0].text, llm.stats()

``LLM`` loads the model, sizes the KV cache pool, builds an ``LLMEngine`` and runs its ``step()`` until
every request is done (vLLM ``vllm/entrypoints/llm.py``). KV sizing: ``num_gpu_blocks`` when given;
else on CUDA a profiling run and ``gpu_memory_utilization`` (vLLM ``Worker.determine_num_available_blocks``),
or ``kv_cache_memory_bytes``; on CPU a byte budget (``kv_cache_memory_bytes``, default 256 MiB, capped at
what ``max_num_seqs`` sequences of ``max_model_len`` tokens could use). The sizing is printed.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_table import blocks_needed
from paged.core.sequence import CompletionOutput, RequestOutput, SamplingParams
from paged.engine.llm_engine import LLMEngine
from paged.engine.parts import Parts
from paged.worker.kv_cache import KVCache, block_bytes
from paged.worker.model_runner import kv_shape, profile_num_blocks

DEFAULT_CPU_KV_BYTES = 256 * 2**20


def load_model(model, dtype: torch.dtype | None):
    """``(model, tokenizer_or_None)`` for ``None`` (built-in), a name / path, or a ``PreTrainedModel``.

    Raises:
        ValueError: a name or path that transformers cannot load (the cause is chained).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    if model is None:
        from paged.models import load_default

        return load_default(dtype or torch.float32)
    if isinstance(model, PreTrainedModel):
        return (model.to(dtype) if dtype is not None else model).eval(), None
    if not isinstance(model, str):
        raise ValueError(f"model must be None, a name or path, or a PreTrainedModel; got {type(model).__name__}")
    from paged.models import quiet_progress_bars

    try:
        with quiet_progress_bars():
            loaded = AutoModelForCausalLM.from_pretrained(model, dtype=dtype or torch.float32)
    except Exception as err:  # OSError (not found / offline), ValueError / HFValidationError (bad name)
        raise ValueError(f"model {model!r} could not be loaded with AutoModelForCausalLM.from_pretrained "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); pass None "
                         "for the built-in model, a local folder, or a PreTrainedModel") from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception:  # a model folder without tokenizer files: token-id prompts only
        tokenizer = None
    return loaded.eval(), tokenizer


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            ids |= set(value) if isinstance(value, (list, tuple, set)) else {int(value)}
    return ids


class LLM:
    """Generate text with continuous batching over a paged KV cache.

    Args:
        model: ``None`` (the built-in byte-level Llama, ``paged.models``), a hub name or local path
            (``AutoModelForCausalLM.from_pretrained``), or a ``PreTrainedModel`` used as given. The model
            is switched to the ``"paged"`` attention (``paged.worker.attention``); call
            ``paged.worker.attention.use_attention(model)`` before using it with ``model.generate`` again.
        tokenizer: used for text prompts and output text (default: the model's, when found).
        block_size: tokens per KV block.
        num_gpu_blocks: pool size in blocks (skips the sizing below).
        num_cpu_blocks: CPU swap space in blocks (``preemption_mode="swap"`` needs > 0).
        max_model_len: most tokens per sequence (default: the model's position limit).
        enable_prefix_caching, preemption_mode, watermark, max_num_seqs, max_num_batched_tokens,
            enable_chunked_prefill (on by default, as in vLLM v1), long_prefill_token_threshold:
            see ``paged/config.py``.
        kv_cache_memory_bytes: KV budget in bytes (CPU default 256 MiB).
        gpu_memory_utilization: CUDA: fraction of GPU memory for weights + activations + KV.
        device: ``"cpu"`` / ``"cuda"`` (default: CUDA when available).
        dtype: model and cache dtype (default: the model's).
        seed: seed of the sampler's shared generator.
        verbose: print the KV sizing.
        parts: the engine's pieces (``paged.engine.parts.Parts``): a learner's allocator, prefix cache,
            scheduler, slot mapping, KV write or decode attention in place of the reference ones.

    Raises:
        ValueError: unknown model, ``max_model_len`` over the model's positions, bad sizes (from the
            configs), or a budget that holds no block.
    """

    def __init__(self, model=None, *, tokenizer=None, block_size: int = 16, num_gpu_blocks: int | None = None,
                 num_cpu_blocks: int = 0, max_model_len: int | None = None, enable_prefix_caching: bool = True,
                 preemption_mode: str = "recompute", watermark: float = 0.01, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, kv_cache_memory_bytes: int | None = None,
                 gpu_memory_utilization: float = 0.9, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, seed: int | None = 0, verbose: bool = True,
                 enable_chunked_prefill: bool = True, long_prefill_token_threshold: int = 0,
                 parts: Parts | None = None):
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model, found_tokenizer = load_model(model, dtype)
        self.model = model.to(device)
        self.tokenizer = tokenizer if tokenizer is not None else found_tokenizer
        dtype = next(self.model.parameters()).dtype
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", 2048)
        max_model_len = max_model_len or int(limit)
        if max_model_len > int(limit):
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's {int(limit)} positions")
        scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                           max_model_len=max_model_len, preemption_mode=preemption_mode,
                                           enable_chunked_prefill=enable_chunked_prefill,
                                           long_prefill_token_threshold=long_prefill_token_threshold)
        layers, kv_heads, head_dim = kv_shape(model)
        bytes_per_block = block_bytes(layers, kv_heads, head_dim, block_size, dtype)
        how = "num_gpu_blocks"
        if num_gpu_blocks is None and device.type == "cuda" and kv_cache_memory_bytes is None:
            num_gpu_blocks, how = profile_num_blocks(model, block_size, scheduler_config.max_num_batched_tokens,
                                                     max_num_seqs, gpu_memory_utilization, dtype)
        elif num_gpu_blocks is None:
            budget = DEFAULT_CPU_KV_BYTES if kv_cache_memory_bytes is None else int(kv_cache_memory_bytes)
            num_gpu_blocks = budget // bytes_per_block
            if num_gpu_blocks <= 0:
                raise ValueError(f"kv_cache_memory_bytes={budget} holds no KV block of {bytes_per_block} bytes")
            cap = max_num_seqs * blocks_needed(max_model_len, block_size)
            how = f"budget {budget / 2**20:.0f} MiB"
            if kv_cache_memory_bytes is None and num_gpu_blocks > cap:
                num_gpu_blocks, how = cap, how + f", capped at {max_num_seqs} seqs x {max_model_len} tokens"
        cache_config = CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                   num_cpu_blocks=num_cpu_blocks, watermark=watermark,
                                   enable_prefix_caching=enable_prefix_caching)
        kv_cache = KVCache(layers, num_gpu_blocks, block_size, kv_heads, head_dim, dtype, device, num_cpu_blocks)
        self.sizing = (f"KV cache: {num_gpu_blocks} blocks x {block_size} tokens = {num_gpu_blocks * block_size} "
                       f"slots, {kv_cache.bytes / 2**20:.1f} MiB on {device} ({bytes_per_block} B/block: 2 x {layers} "
                       f"layers x {kv_heads} KV heads x {head_dim} x {block_size} x {dtype}; {how})"
                       + (f"; CPU swap {num_cpu_blocks} blocks" if num_cpu_blocks else ""))
        if verbose:
            print(self.sizing)
        self.engine = LLMEngine(self.model, kv_cache, scheduler_config, cache_config,
                                _eos_ids(self.model, self.tokenizer), self.tokenizer, seed, parts)

    def _encode(self, prompt) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token-id lists or LLM(tokenizer=...)")
            return list(self.tokenizer(prompt)["input_ids"]), prompt
        return list(prompt), None

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt; one ``RequestOutput`` per prompt, in input order.

        ``prompts``: a text, a token-id list, or a list of them. ``sampling_params``: one for all or one
        per prompt. A prompt that can never run (empty, a token id outside the vocabulary, longer than
        ``max_model_len`` or than the whole cache) finishes with ``finish_reason="ignored"`` and a
        ``finish_message``; the others complete.

        Raises:
            ValueError: a list of sampling params of another length than the prompts; a text prompt
                without a tokenizer.
        """
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        results: dict[str, RequestOutput] = {}
        order = []
        self.engine.metrics.new_window()  # TTFT / ITL of this call
        for prompt, sp in zip(prompts, params):
            token_ids, text = self._encode(prompt)
            try:
                order.append(self.engine.add_request(token_ids, sp, prompt=text))
            except ValueError as err:  # this request only: report it, run the others
                rid = f"rejected-{len(order)}"
                order.append(rid)
                results[rid] = RequestOutput(rid, text, token_ids, [CompletionOutput(
                    0, [], "", "ignored", f"ignored: {err}")], True)
        bar = tqdm(total=len(prompts), desc="generate", unit="req", disable=not use_tqdm)
        bar.update(len(results))
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                results[out.request_id] = out
                bar.update(1)
        bar.close()
        return [results[rid] for rid in order]

    def stats(self) -> dict:
        """See ``LLMEngine.stats`` (latencies are those of the last ``generate``)."""
        return self.engine.stats()
