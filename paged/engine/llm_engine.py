"""The engine: continuous batching with chunked prefill over a paged KV cache, on a transformers model.

``LLMEngine.step()`` is one iteration of the serving loop, in vLLM v1's three verbs
(``vllm/v1/engine/core.py``, ``EngineCore.step``, 0.10.2; nano-vllm ``engine/llm_engine.py``):

1. ``scheduler.schedule()`` (``paged/core/scheduler.py``): this step's decodes and prompt chunks under one
   token budget, the block manager (``paged/core/block_manager.py``) giving each its slots or ``None``
   (then the scheduler preempts), and which blocks to swap and copy;
2. ``runner.execute_model(out)`` (``paged/worker/model_runner.py``): swap out, swap in and copy-on-write
   copies on the ``KVCache`` pool, one packed forward over every scheduled token (the attention,
   ``paged/worker/attention.py``, reading and writing the pool through each sequence's block table), then
   the sampler (``paged/worker/sampler.py``): token ids for each sequence whose tokens are all computed;
3. ``scheduler.update_from_output(out, sampled)``: append the tokens, fork a request's ``n`` samples at its
   first token, finish sequences on a stop token, EOS, ``max_tokens`` or ``max_model_len`` and free
   their blocks.

Then one stats snapshot per step (``paged/engine/stats.py``); with ``profile=True`` the step also times
each phase (the device synced) and keeps a per-step history. ``LLM`` (``paged/engine/llm.py``) wraps the
engine with model loading (``paged/engine/model_loader.py``), one ``EngineConfig`` and ``generate``.
"""

from __future__ import annotations

import itertools
import operator
import time
import warnings

from paged.config import EngineConfig
from paged.core.sequence import (
    CompletionOutput,
    RequestOutput,
    SamplingParams,
    Sequence,
    SequenceGroup,
)
from paged.engine.parts import Parts
from paged.engine.stats import EngineStats, PhaseClock
from paged.worker.model_runner import ModelRunner
from paged.worker.sampler import make_generator
from paged.worker.worker import init_kv_cache


class MaxModelLenWarning(UserWarning):
    """A request's prompt plus ``max_tokens`` exceed ``max_model_len``: it stops there, ``finish_reason``
    ``"length"`` (said once per engine, at ``add_request``)."""


def short_repr(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (error messages quote what they got)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_token_ids(values, where: str) -> list[int]:
    """``values`` as plain int token ids (numpy and 0-d tensor ints too), checked where the engine takes
    prompts in (``add_request``, ``LLM.generate``). Raises TypeError naming ``where`` and the position of
    the first value that is not an int (a float, a bool, a list)."""
    tokens = []
    for position, value in enumerate(values):
        try:
            if isinstance(value, (bool, float)):
                raise TypeError
            tokens.append(operator.index(value))
        except TypeError:
            raise TypeError(
                f"{where}: token ids must be ints; got {type(value).__name__} {short_repr(value)} "
                f"at position {position}"
            ) from None
    return tokens


def _no_clock(phase: str) -> None:
    """The phase mark of a step without profiling: reads no clock, waits for nothing."""


class LLMEngine:
    """Requests in, finished ``RequestOutput`` s out, one ``step()`` at a time.

    Args:
        model: a ``PreTrainedModel`` on ``config.model.device`` (switched to the ``"paged"`` attention).
        config: the ``EngineConfig`` (``paged/config.py``), read here whole: the worker sizes and builds
            the KV pool from it (``paged/worker/worker.py``, which sets ``config.cache.num_gpu_blocks``
            when it was ``None``), the scheduler reads its ``scheduler`` and ``cache`` sections.
        tokenizer: decodes output text when given (else ``text`` stays empty).
        parts: the engine's pieces (``paged.engine.parts.Parts``; default: the reference parts).
        eos_token_ids: token ids that end a sequence unless ``ignore_eos``.
    """

    def __init__(
        self,
        model,
        config: EngineConfig,
        tokenizer=None,
        parts: Parts | None = None,
        eos_token_ids: set[int] | None = None,
    ):
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.kv_cache, self.sizing = init_kv_cache(model, config)
        self.parts = parts = parts or Parts()
        block_manager = parts.block_manager(
            config.cache.block_size,
            config.cache.num_gpu_blocks,
            config.cache.num_cpu_blocks,
            config.cache.watermark,
            config.cache.enable_prefix_caching,
            allocator_cls=parts.allocator,
            prefix_cache_cls=parts.prefix_cache,
            copy_on_write=parts.copy_on_write,
        )
        self.scheduler = parts.scheduler(
            config.scheduler, config.cache, block_manager, parts.update
        )
        self.runner = ModelRunner(model, self.kv_cache, parts, config)
        self.sampler = self.runner.sampler
        self.eos_token_ids = frozenset(eos_token_ids or ())
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.metrics = EngineStats(config.profile)
        self._request_ids = itertools.count()
        self._said_max_model_len = False  # MaxModelLenWarning comes once per engine

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        prompt: str | None = None,
    ) -> str:
        """Queue a request; returns its id. The engine's input boundary: everything is checked here.

        The first request whose prompt plus ``max_tokens`` exceed ``max_model_len`` gets a
        ``MaxModelLenWarning``: it will stop at ``max_model_len`` with ``finish_reason="length"``.

        Raises:
            TypeError: ``sampling_params`` that is not a ``SamplingParams``, or a token id that is not an
                int (nothing is queued).
            ValueError: empty prompt, or a token id outside ``[0, vocab_size)`` (nothing is queued).
        """
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"sampling_params must be a SamplingParams; got {type(params).__name__}"
            )
        request_id = str(next(self._request_ids)) if request_id is None else str(request_id)
        tokens = check_token_ids(prompt_token_ids, f"request {request_id!r}")
        if not tokens:
            raise ValueError(
                f"request {request_id!r}: the prompt is empty; at least one token is needed"
            )
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"request {request_id!r}: token id {bad[0]!r} outside [0, {self.vocab_size})"
            )
        limit = self.config.scheduler.max_model_len
        if not self._said_max_model_len and len(tokens) <= limit < len(tokens) + params.max_tokens:
            self._said_max_model_len = True
            warnings.warn(
                f"request {request_id!r}: its prompt of {len(tokens)} tokens plus max_tokens="
                f"{params.max_tokens} exceed max_model_len={limit}: it stops at {limit} tokens with "
                "finish_reason 'length' (raise max_model_len, up to the model's positions, or lower "
                "max_tokens; said once per engine)",
                MaxModelLenWarning,
                stacklevel=3,
            )
        seq = Sequence(next(self.scheduler.seq_ids), tokens, self.config.cache.block_size)
        group = SequenceGroup(request_id, [seq], params, time.perf_counter(), prompt)
        if not params.ignore_eos:
            group.stop_token_ids |= self.eos_token_ids
        group.generator = make_generator(params.seed)
        self.scheduler.add_request(group)
        return request_id

    def abort_request(self, request_id: str) -> bool:
        """Stop a request wherever it is and free its blocks; False if it is not unfinished here."""
        return self.scheduler.abort_request(str(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """Run one iteration (module docstring); returns the requests that finished in it. With
        ``profile`` a ``PhaseClock`` adds each phase's seconds to ``metrics.seconds`` and the step's to its
        ``metrics.history`` record; without it no clock runs."""
        clock = (
            PhaseClock(self.metrics.seconds, self.runner.device) if self.metrics.profile else None
        )
        mark = clock or _no_clock
        out = self.scheduler.schedule()
        mark("schedule")
        sampled = self.runner.execute_model(out, mark)
        result = self.scheduler.update_from_output(out, sampled)
        mark("update")
        seconds = clock.elapsed() if clock else None
        self.metrics.on_step(out, result, self.scheduler.block_manager, seconds)
        return [self._output(group) for group in result.finished]

    def _output(self, group: SequenceGroup) -> RequestOutput:
        outputs = []
        for i, seq in enumerate(sorted(group.seqs, key=lambda s: s.seq_id)):
            text = ""
            if self.tokenizer is not None and seq.output_token_ids:
                text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            outputs.append(
                CompletionOutput(
                    i,
                    list(seq.output_token_ids),
                    text,
                    seq.status.finish_reason,
                    seq.finish_message,
                )
            )
        return RequestOutput(
            group.request_id,
            group.prompt,
            list(group.prompt_token_ids),
            outputs,
            True,
            group.seqs[0].num_cached_tokens,
        )

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict:
        """KV blocks total / used / peak, slot utilization, prefix-cache hit rate, preemptions, swaps, tokens,
        prefill chunks, TTFT / ITL percentiles (seconds) of the current window, and seconds per step phase
        (``forward`` is the model; the rest is engine overhead)."""
        bm, sched, st = self.scheduler.block_manager, self.scheduler, self.metrics
        steps = st.counters["steps"]
        return {
            "kv_blocks_total": bm.num_gpu_blocks,
            "kv_blocks_used": bm.gpu_allocator.num_used_blocks,
            "kv_blocks_peak": st.peak_used_blocks,
            "block_size": self.config.cache.block_size,
            "kv_cache_bytes": self.kv_cache.bytes,
            "slot_utilization": st.util_sum / steps if steps else 0.0,
            "prefix_cache_hit_rate": bm.prefix_cache_hit_rate,
            "preemptions": sched.num_preemptions,
            "recomputes": sched.num_recomputes,
            "swap_outs": sched.num_swap_outs,
            "swap_ins": sched.num_swap_ins,
            **st.counters,
            **st.latency(),
            "seconds": dict(st.seconds),
        }
