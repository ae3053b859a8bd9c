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

import numbers
import operator
import os
import re
import threading
import warnings
from collections.abc import Iterable

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


HUB_TIMEOUT_S = 3.0  # seconds: one bounded question to the hub before transformers' download (which retries ~25 s)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to run on: ``None`` picks CUDA when available, else CPU.

    Raises:
        ValueError: a device other than ``"cpu"`` / ``"cuda"`` / ``"cuda:N"``, CUDA when this torch
            sees no GPU, or a CUDA index past the GPUs present.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device must be 'cpu' or 'cuda' (or 'cuda:N'); got {device!r} (paged runs on CPU or "
            "an NVIDIA GPU through CUDA)"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = (
                "a CPU-only build"
                if torch.version.cuda is None
                else f"built for CUDA {torch.version.cuda}"
            )
            raise ValueError(
                f"device {device!r} needs CUDA, but torch {torch.__version__} ({build}) sees no GPU "
                "(torch.cuda.is_available() is False); use device='cpu'"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    return dev


def _looks_local(name: str) -> bool:
    """A path rather than a hub name: starts with ``.``, ``/`` or ``~``, exists, or sits in an existing folder."""
    parent = os.path.dirname(name)
    return (
        name.startswith((".", "/", "~"))
        or os.path.exists(name)
        or bool(parent and os.path.isdir(parent))
    )


def _check_hub(name: str) -> None:
    """Ask the hub about ``name`` once, within ``HUB_TIMEOUT_S`` (``huggingface_hub.model_info``).

    Returns when the hub answered (the download may go ahead). Raises ``ValueError`` when
    ``HF_HUB_OFFLINE`` is set, the hub is unreachable or silent, the name is invalid, or the hub has no
    such model. Run in a daemon thread so that even a hanging name lookup cannot hold the caller.
    """
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    hub = constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so "
            f"the hub ({hub}) was not asked; download it once with the network on, or pass a folder"
        )
    answer: dict = {}

    def ask() -> None:
        try:
            huggingface_hub.HfApi(endpoint=hub).model_info(name, timeout=HUB_TIMEOUT_S)
            answer["ok"] = True
        except Exception as err:  # reported below, in the caller's thread
            answer["error"] = err

    thread = threading.Thread(target=ask, name="paged-hub-check", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S + 0.5)
    err = answer.get("error")
    offline = "; check the network, or pass a local folder"
    # httpx / requests ReadTimeout, ConnectTimeout, ...
    if not answer or "Timeout" in type(err).__name__:
        raise ValueError(
            f"the Hugging Face hub ({hub}) is unreachable: no answer within {HUB_TIMEOUT_S:g} s "
            "(paged.engine.llm.HUB_TIMEOUT_S), "
            f"and model {name!r} is not in the local cache{offline}"
        ) from err
    if isinstance(err, HFValidationError):
        raise ValueError(
            f"model {name!r} is neither an existing folder nor a valid hub name: {err}"
        ) from err
    if isinstance(err, RepositoryNotFoundError):
        raise ValueError(
            f"model {name!r} was not found on the hub ({hub}); a private or gated model needs "
            "`hf auth login` first"
        ) from err
    if err is not None and not isinstance(err, HfHubHTTPError):  # no HTTP answer at all
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(
            f"the Hugging Face hub ({hub}) is unreachable ({type(err).__name__}: {first}), and model "
            f"{name!r} is not in the local cache{offline}"
        ) from err


def load_model(model, dtype: torch.dtype | None):
    """``(model, tokenizer_or_None)`` for ``None`` (built-in), a name / path, or a ``PreTrainedModel``.

    A name is looked up in the local Hugging Face cache first (no network); only when it is missing
    there is the hub asked, once and within ``HUB_TIMEOUT_S``, before the download.

    Raises:
        TypeError: ``model`` of another type.
        ValueError: a local-looking path that does not exist, a name the hub does not know or cannot be
            asked about (offline, unreachable), or a model transformers cannot load (the cause is chained).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

    if model is None:
        from paged.models import load_default

        return load_default(dtype or torch.float32)
    if isinstance(model, PreTrainedModel):
        return (model.to(dtype) if dtype is not None else model).eval(), None
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            f"model must be None, a hub name or folder path, or a PreTrainedModel; "
            f"got {type(model).__name__}"
        )
    from paged.models import quiet_progress_bars

    name, local = os.fspath(model), _looks_local(os.fspath(model))
    if local:
        name = os.path.expanduser(name)
        if not os.path.isdir(name):
            what = "is a file, not a model folder" if os.path.exists(name) else "does not exist"
            raise ValueError(
                f"model folder {model!r} {what} ({os.path.abspath(name)}); pass a folder holding "
                "config.json and the weights, a hub name such as 'org/model', None for the built-in "
                "model, or a PreTrainedModel"
            )

    def from_pretrained(cls, **kwargs):
        with quiet_progress_bars():
            return cls.from_pretrained(name, **kwargs)

    kwargs = {"dtype": dtype or torch.float32}
    try:
        # no network
        loaded = from_pretrained(AutoModelForCausalLM, local_files_only=True, **kwargs)
    # not (fully) in the local cache; for a folder: no config.json or weights
    except OSError as err:
        if local:
            raise _load_error(model, err) from err
        loaded = None
    except Exception as err:  # an unknown architecture, a bad config, ...
        raise _load_error(model, err) from err
    if downloaded := loaded is None:
        _check_hub(name)  # fails within HUB_TIMEOUT_S when the hub cannot be asked
        try:
            loaded = from_pretrained(AutoModelForCausalLM, **kwargs)
        except Exception as err:
            raise _load_error(model, err) from err
    try:  # a model without tokenizer files: token-id prompts only
        tokenizer = from_pretrained(AutoTokenizer, local_files_only=True)
    except Exception:
        tokenizer = None
    if tokenizer is None and not local:  # the tokenizer is downloaded apart from the weights
        try:
            if not downloaded:
                _check_hub(name)
            tokenizer = from_pretrained(AutoTokenizer)
        except Exception:
            tokenizer = None
    return loaded.eval(), tokenizer


def _load_error(model, err: Exception) -> ValueError:
    first = str(err).splitlines()[0] if str(err) else ""
    return ValueError(
        f"model {model!r} could not be loaded with AutoModelForCausalLM.from_pretrained "
        f"({type(err).__name__}: {first}); pass None for the built-in model, a local folder, "
        "or a PreTrainedModel"
    )


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            ids |= set(value) if isinstance(value, (list, tuple, set)) else {int(value)}
    return ids


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


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_number(value) -> bool:
    return isinstance(value, numbers.Number) or (
        isinstance(value, torch.Tensor) and value.dim() == 0
    )


def _token_id(value, prompt: int, position: int) -> int:
    """``value`` as a plain int token id (numpy / 0-d tensor ints too); TypeError for anything else."""
    if not isinstance(value, bool) and not isinstance(value, float):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(
        f"prompts[{prompt}]: token ids must be ints; got {type(value).__name__} {_short(value)} at "
        f"position {position}"
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
            f"{type(prompts).__name__} {_short(prompts)}"
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
            enable_chunked_prefill (on by default, as in vLLM v1), long_prefill_token_threshold:
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
            step's batch to the next captured size (vLLM's flag and ladder); ``True`` runs every step
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
        device = resolve_device(device)  # before loading: a bad device fails fast
        model, found_tokenizer = load_model(model, dtype)
        self.model = model.to(device)
        self.tokenizer = tokenizer if tokenizer is not None else found_tokenizer
        dtype = next(self.model.parameters()).dtype
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(
            model.config, "n_positions", 2048
        )
        max_model_len = max_model_len or int(limit)
        if max_model_len > int(limit):
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's {int(limit)} positions"
            )
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            preemption_mode=preemption_mode,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
        )
        layers, kv_heads, head_dim = kv_shape(model)
        bytes_per_block = block_bytes(layers, kv_heads, head_dim, block_size, dtype)
        how = "num_gpu_blocks"
        if num_gpu_blocks is None and device.type == "cuda" and kv_cache_memory_bytes is None:
            num_gpu_blocks, how = profile_num_blocks(
                model,
                block_size,
                scheduler_config.max_num_batched_tokens,
                max_num_seqs,
                gpu_memory_utilization,
                dtype,
            )
        elif num_gpu_blocks is None:
            budget = (
                DEFAULT_CPU_KV_BYTES
                if kv_cache_memory_bytes is None
                else int(kv_cache_memory_bytes)
            )
            num_gpu_blocks = budget // bytes_per_block
            if num_gpu_blocks <= 0:
                raise ValueError(
                    f"kv_cache_memory_bytes={budget} holds no KV block of {bytes_per_block} bytes"
                )
            cap = max_num_seqs * blocks_needed(max_model_len, block_size)
            how = f"budget {budget / 2**20:.4g} MiB"
            if kv_cache_memory_bytes is None and num_gpu_blocks > cap:
                num_gpu_blocks, how = (
                    cap,
                    how + f", capped at {max_num_seqs} seqs x {max_model_len} tokens",
                )
        cache_config = CacheConfig(
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            watermark=watermark,
            enable_prefix_caching=enable_prefix_caching,
        )
        # decode steps as CUDA graphs: the pool holds one block more, the padding rows'
        cuda_graphs = device.type == "cuda" and not enforce_eager
        kv_cache = KVCache(
            layers,
            num_gpu_blocks + (1 if cuda_graphs else 0),
            block_size,
            kv_heads,
            head_dim,
            dtype,
            device,
            num_cpu_blocks,
        )
        self.sizing = (
            f"KV cache: {num_gpu_blocks} blocks x {block_size} tokens = {num_gpu_blocks * block_size} "
            f"slots, {kv_cache.bytes / 2**20:.1f} MiB on {device} ({bytes_per_block} B/block: 2 x {layers} "
            f"layers x {kv_heads} KV heads x {head_dim} x {block_size} x {dtype}; {how})"
            + (f"; CPU swap {num_cpu_blocks} blocks" if num_cpu_blocks else "")
        )
        if verbose:
            print(self.sizing)
        self.engine = LLMEngine(
            self.model,
            kv_cache,
            scheduler_config,
            cache_config,
            _eos_ids(self.model, self.tokenizer),
            self.tokenizer,
            seed,
            parts,
            cuda_graphs,
            profile,
        )

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
                f"{type(prompt).__name__} {_short(prompt)}"
            )
        return [_token_id(t, index, j) for j, t in enumerate(prompt)], None

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
                    f"{_short(params[bad])}"
                )
        elif isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        else:
            hint = " (build one with SamplingParams(**params))" if isinstance(params, dict) else ""
            raise TypeError(
                f"sampling_params must be a SamplingParams or a list of them, one per prompt; got "
                f"{type(params).__name__} {_short(params)}{hint}"
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
