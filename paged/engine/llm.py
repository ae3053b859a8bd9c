"""``LLM``: offline batched generation in the style of vLLM v1's ``LLM``, on the paged engine.

    from paged.engine import LLM            # also: from paged.engine.llm import LLM
    llm = LLM()                             # built-in model; or a hub name, a local path, a model object
    outs = llm.generate(["Hello", "The cache"], SamplingParams(max_tokens=32))
    outs[0].outputs[0].text, llm.stats()

``LLM`` loads the model (``paged/engine/model_loader.py``), builds one ``EngineConfig`` from its keyword
arguments (``paged/config.py``: every setting checked there, once), builds an ``LLMEngine`` and runs its
``step()`` until every request is done (vLLM v1 ``LLM._run_engine``,
``vllm/entrypoints/llm.py``, 0.10.2). The worker sizes the KV cache
pool (``paged/worker/worker.py``); the sizing is printed.
"""

from __future__ import annotations

import numbers
import re
import warnings
from collections.abc import Iterable

import torch
from tqdm.auto import tqdm

from paged.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, section
from paged.core.sequence import CompletionOutput, RequestOutput, SamplingParams
from paged.engine.llm_engine import LLMEngine, check_token_ids, short_repr
from paged.engine.model_loader import eos_token_ids, load_model, resolve_device
from paged.engine.parts import Parts


class IgnoredRequestWarning(UserWarning):
    """``LLM.generate``: some prompts ended ``"ignored"`` or ``"kv_cache_exhausted"`` (their reason inside)."""


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_REQUEST_ID = re.compile(r"(sequence \d+ of )?request '[^']*'(: )?")


def group_finish_messages(outputs: list[RequestOutput]) -> list[tuple[int, str, list[str]]]:
    """``(count, summary, request_ids)`` per distinct reason among ``outputs``' ``finish_message`` s, most
    common first.

    Messages that differ only in their numbers share a reason; a number that differs is shown as its
    range (``"prompt of 145-253 tokens"``). The request's id and its sequences' ids are left out of the
    summary (``request_ids`` has them). Outputs without a ``finish_message`` are grouped by ``finish_reason``.
    """
    groups: dict[tuple, list] = {}
    for out in outputs:
        first = out.outputs[0] if out.outputs else None
        message = (
            first.finish_message if first is not None else None
        ) or f"finish_reason={first.finish_reason if first is not None else None!r}"
        message = _REQUEST_ID.sub(
            lambda m: "" if m[2] else "a sequence of the request" if m[1] else "the request",
            message,
        )
        parts = _NUMBER.split(message)
        groups.setdefault(tuple(parts), []).append((_NUMBER.findall(message), out.request_id))
    summaries = []
    for parts, members in groups.items():
        text = parts[0]
        for i, part in enumerate(parts[1:]):
            values = sorted({m[0][i] for m in members}, key=float)
            text += (values[0] if len(values) == 1 else f"{values[0]}-{values[-1]}") + part
        summaries.append((len(members), text, [rid for _, rid in members]))
    return sorted(summaries, key=lambda g: -g[0])


def _is_number(value) -> bool:
    return isinstance(value, numbers.Number) or (
        isinstance(value, torch.Tensor) and value.dim() == 0
    )


def _prompt_list(prompts) -> list:
    """One prompt (a text, a token-id list) or an iterable of prompts -> a list of prompts."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, torch.Tensor) or type(prompts).__module__ == "numpy":
        prompts = prompts.tolist()
    if (
        prompts is None
        or isinstance(prompts, (bytes, dict, set, frozenset))
        or _is_number(prompts)
        or not isinstance(prompts, Iterable)
    ):
        raise TypeError(
            "prompts must be a text, a list of token ids, or a list of texts / token-id lists; got "
            f"{type(prompts).__name__} {short_repr(prompts)}"
        )
    prompts = list(prompts)
    if any(_is_number(p) for p in prompts):  # a flat list with numbers is one token-id prompt
        return [prompts]
    return prompts


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
            enable_chunked_prefill (on by default, as in vLLM v1, 0.10.2), long_prefill_token_threshold:
            see ``paged/config.py``.
        kv_cache_memory_bytes: KV budget in bytes (CPU default 256 MiB).
        gpu_memory_utilization: CUDA: fraction of GPU memory for weights + activations + KV.
        device: ``"cpu"`` / ``"cuda"`` / ``"cuda:N"`` (default: CUDA when available).
        dtype: model and cache dtype (default: the model's).
        seed: seed of the sampler's shared generator.
        verbose: print the KV sizing.
        parts: the engine's pieces (``paged.engine.parts.Parts``): a learner's allocator, prefix cache,
            scheduler, slot mapping, KV write or decode attention in place of the reference ones.
        enforce_eager: CUDA only: ``False`` (default) captures decode steps as CUDA graphs at start-up, one
            per batch size of ``paged.worker.model_runner.GRAPH_SIZES`` up to ``max_num_seqs``, and pads a
            step's batch to the next captured size (vLLM v1's ``enforce_eager``, 0.11.1; the
            ladder is nano-vllm's); ``True`` runs every step
            eagerly. No effect on CPU.
        profile: time each step phase (``stats()["seconds"]``; the device is synced after each phase) and
            keep one record per step (``engine.metrics.history``). Off (default): ``seconds`` is empty and
            the loop runs no clock.

    Raises:
        TypeError: ``model`` of another type than ``None`` / ``str`` / path / ``PreTrainedModel``.
        ValueError: an unsupported or absent device (``resolve_device``), a model folder that does not
            exist, a hub name the hub does not know or cannot be asked about within ``HUB_TIMEOUT_S``
            (``load_model``), ``max_model_len`` over the model's positions, bad sizes (from the configs),
            or a budget that holds no block.
    """

    def __init__(
        self,
        model=None,
        *,
        tokenizer=None,
        block_size: int = 16,
        num_gpu_blocks: int | None = None,
        num_cpu_blocks: int = 0,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        preemption_mode: str = "recompute",
        watermark: float = 0.01,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        seed: int | None = 0,
        verbose: bool = True,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        parts: Parts | None = None,
        enforce_eager: bool = False,
        profile: bool = False,
    ):
        settings = dict(locals())  # the keyword arguments by name (no other local exists yet)
        device = resolve_device(device)  # before loading: a bad device fails fast
        model, found_tokenizer = load_model(model, dtype)
        self.model = model.to(device)
        self.tokenizer = tokenizer if tokenizer is not None else found_tokenizer
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(
            model.config, "n_positions", 2048
        )
        settings["max_model_len"] = max_model_len or int(positions)
        self.config = EngineConfig(
            model=ModelConfig(
                device=device,
                dtype=next(self.model.parameters()).dtype,
                max_position_embeddings=int(positions),
                seed=seed,
                enforce_eager=enforce_eager,
            ),
            cache=section(CacheConfig, settings),
            scheduler=section(SchedulerConfig, settings),
            profile=profile,
        )
        self.engine = LLMEngine(
            self.model,
            self.config,
            self.tokenizer,
            parts,
            eos_token_ids(self.model, self.tokenizer),
        )
        self.sizing = self.engine.sizing
        if verbose:
            print(self.sizing)

    def _encode(self, prompt, index: int) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "a text prompt needs a tokenizer; pass token-id lists or LLM(tokenizer=...)"
                )
            return list(self.tokenizer(prompt)["input_ids"]), prompt
        if isinstance(prompt, torch.Tensor) or type(prompt).__module__ == "numpy":
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(
                f"prompts[{index}] must be a text or a list of token ids; got "
                f"{type(prompt).__name__} {short_repr(prompt)}"
            )
        return check_token_ids(prompt, f"prompts[{index}]"), None

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; one ``RequestOutput`` per prompt, in input order.

        ``prompts``: a text, a token-id list, or a list of them. ``sampling_params``: one for all or one
        per prompt. A prompt that can never run (empty, a token id outside the vocabulary, longer than
        ``max_model_len`` or than the whole cache) finishes with ``finish_reason="ignored"`` and a
        ``finish_message``; the others complete. Prompts that end ignored or ``"kv_cache_exhausted"`` are
        also reported by one ``IgnoredRequestWarning`` per distinct reason (``group_finish_messages``).
        Every prompt is checked before any is queued.

        Raises:
            TypeError: ``prompts`` or a prompt of another type (``None``, a dict, a nested list), a token
                id that is not an int, ``sampling_params`` that is not a ``SamplingParams`` or a list of them.
            ValueError: a list of sampling params of another length than the prompts; a text prompt
                without a tokenizer.
        """
        prompts = _prompt_list(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        if isinstance(params, (list, tuple)):
            params = list(params)
            bad = next((i for i, p in enumerate(params) if not isinstance(p, SamplingParams)), None)
            if bad is not None:
                raise TypeError(
                    f"sampling_params[{bad}] must be a SamplingParams; got {type(params[bad]).__name__} "
                    f"{short_repr(params[bad])}"
                )
        elif isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        else:
            hint = " (build one with SamplingParams(**params))" if isinstance(params, dict) else ""
            raise TypeError(
                f"sampling_params must be a SamplingParams or a list of them, one per prompt; got "
                f"{type(params).__name__} {short_repr(params)}{hint}"
            )
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        # every prompt checked before any is queued
        encoded = [self._encode(p, i) for i, p in enumerate(prompts)]
        results: dict[str, RequestOutput] = {}
        order = []
        self.engine.metrics.new_window()  # TTFT / ITL of this call
        for (token_ids, text), sp in zip(encoded, params):
            try:
                order.append(self.engine.add_request(token_ids, sp, prompt=text))
            except ValueError as err:  # this request only: report it, run the others
                rid = f"rejected-{len(order)}"
                order.append(rid)
                results[rid] = RequestOutput(
                    rid,
                    text,
                    token_ids,
                    [CompletionOutput(0, [], "", "ignored", f"ignored: {err}")],
                    True,
                )
        bar = tqdm(total=len(prompts), desc="generate", unit="req", disable=not use_tqdm)
        bar.update(len(results))
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                results[out.request_id] = out
                bar.update(1)
        bar.close()
        outputs = [results[rid] for rid in order]
        failed = [
            o
            for o in outputs
            if o.outputs and o.outputs[0].finish_reason in ("ignored", "kv_cache_exhausted")
        ]
        for count, summary, _ in group_finish_messages(failed):
            warnings.warn(
                f"LLM.generate: {count} of {len(outputs)} prompts did not "
                f"complete: {summary} (see each output's finish_reason and finish_message)",
                IgnoredRequestWarning,
                stacklevel=2,
            )
        return outputs

    def stats(self) -> dict:
        """See ``LLMEngine.stats`` (latencies are those of the last ``generate``)."""
        return self.engine.stats()
