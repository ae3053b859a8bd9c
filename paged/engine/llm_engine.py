"""The engine: continuous batching with chunked prefill over a paged KV cache, on a transformers model.

``LLMEngine.step()`` is one iteration of the serving loop (vLLM ``vllm/v1/engine/core.py``, nano-vllm
``engine/llm_engine.py``):

1. **schedule**: the scheduler picks this step's decodes and prompt chunks under one token budget,
   preempts when memory runs out, and says which blocks to swap and copy;
2. **cache ops**: swap out, swap in, then copy-on-write copies on the ``KVCache`` pool;
3. **forward**: one packed forward over every scheduled token (``ModelRunner``), the attention reading
   and writing the pool through each sequence's block table;
4. **sample**: one token per sequence whose tokens are all computed (``Sampler``); a request with
   ``n > 1`` forks at its first sample, the children sharing the prompt's blocks (copy-on-write later);
5. **update**: append the tokens, finish sequences on a stop token, EOS, ``max_tokens`` or
   ``max_model_len``, free finished sequences' blocks, return finished requests.

Timing, counters and per-step history go to ``self.metrics`` (``paged/engine/stats.py``).
``LLM`` (``paged/engine/llm.py``) wraps the engine with model loading, KV sizing and ``generate``.
"""

from __future__ import annotations

import itertools
import time
import warnings

import torch

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_manager import BlockSpaceManager
from paged.core.scheduler_outputs import ScheduledSeq
from paged.core.sequence import (
    CompletionOutput,
    RequestOutput,
    SamplingParams,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from paged.engine.parts import Parts
from paged.engine.stats import EngineStats
from paged.worker.model_runner import ModelRunner
from paged.worker.sampler import Sampler, make_generator


class MaxModelLenWarning(UserWarning):
    """A request's prompt plus ``max_tokens`` exceed ``max_model_len``: it stops there, ``finish_reason``
    ``"length"`` (said once per engine, at ``add_request``)."""


class LLMEngine:
    """Requests in, finished ``RequestOutput`` s out, one ``step()`` at a time.

    Args:
        model: a ``PreTrainedModel`` on the pool's device (switched to the ``"paged"`` attention).
        kv_cache: the ``KVCache`` pool, sized to ``cache_config.num_gpu_blocks`` / ``num_cpu_blocks``.
        scheduler_config, cache_config: see ``paged/config.py``.
        eos_token_ids: token ids that end a sequence unless ``ignore_eos``.
        tokenizer: decodes output text when given (else ``text`` stays empty).
        seed: seed of the sampler's shared generator (requests without their own ``seed``).
        parts: the engine's pieces (``paged.engine.parts.Parts``; default: the reference parts).
        cuda_graphs: capture decode steps as CUDA graphs (``paged.worker.model_runner.DecodeGraph``); the
            pool then holds one block more than ``cache_config.num_gpu_blocks``, the padding rows' block.
    """

    def __init__(
        self,
        model,
        kv_cache,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        eos_token_ids: set[int] | None = None,
        tokenizer=None,
        seed: int | None = 0,
        parts: Parts | None = None,
        cuda_graphs: bool = False,
    ):
        self.model, self.kv_cache, self.tokenizer = model, kv_cache, tokenizer
        self.scheduler_config, self.cache_config = scheduler_config, cache_config
        self.parts = parts = parts or Parts()
        block_manager = BlockSpaceManager(
            cache_config.block_size,
            cache_config.num_gpu_blocks,
            cache_config.num_cpu_blocks,
            cache_config.watermark,
            cache_config.enable_prefix_caching,
            allocator_cls=parts.allocator,
            prefix_cache_cls=parts.prefix_cache,
            copy_on_write=parts.copy_on_write,
        )
        self.scheduler = parts.scheduler(scheduler_config, cache_config, block_manager)
        self.runner = ModelRunner(
            model,
            kv_cache,
            parts,
            parts.decode_for(kv_cache.device),
            parts.prefill_for(kv_cache.device),
            scheduler_config.max_num_seqs,
            scheduler_config.max_model_len,
            cuda_graphs,
        )
        self.sampler = Sampler(seed)
        self.eos_token_ids = set(eos_token_ids or ())
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.metrics = EngineStats()
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        self._said_max_model_len = False  # MaxModelLenWarning comes once per engine
        self._generators: dict[str, torch.Generator | None] = {}

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
        tokens = list(prompt_token_ids)
        if not tokens:
            raise ValueError(
                f"request {request_id!r}: the prompt is empty; at least one token is needed"
            )
        wrong = next(
            ((j, t) for j, t in enumerate(tokens) if not isinstance(t, int) or isinstance(t, bool)),
            None,
        )
        if wrong is not None:
            raise TypeError(
                f"request {request_id!r}: token ids must be ints; got {type(wrong[1]).__name__} "
                f"{wrong[1]!r} at position {wrong[0]}"
            )
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        tokens = [int(t) for t in tokens]  # int subclasses become plain ints
        if bad:
            raise ValueError(
                f"request {request_id!r}: token id {bad[0]!r} outside [0, {self.vocab_size})"
            )
        limit = self.scheduler_config.max_model_len
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
        seq = Sequence(next(self._seq_ids), tokens, self.cache_config.block_size)
        self.scheduler.add_request(
            SequenceGroup(request_id, [seq], params, time.perf_counter(), prompt)
        )
        self._generators[request_id] = make_generator(params.seed)
        return request_id

    def abort_request(self, request_id: str) -> bool:
        """Stop a request wherever it is and free its blocks; False if it is not unfinished here."""
        self._generators.pop(str(request_id), None)
        return self.scheduler.abort_request(str(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """Run one iteration (module docstring); returns the requests that finished in it."""
        mark, begin = self.metrics.clock(), time.perf_counter()
        out = self.scheduler.schedule()
        mark("schedule")
        kv = self.kv_cache
        for pairs, move in (
            (out.blocks_to_swap_out, kv.swap_out),
            (out.blocks_to_swap_in, kv.swap_in),
            (out.blocks_to_copy, kv.copy_blocks),
        ):
            if pairs:
                move(pairs)
        mark("cache_ops")
        sampled: list[Sequence] = []
        if out.scheduled:
            batch = self.runner.prepare(out.scheduled)
            mark("prepare")
            logits = self.runner.forward(batch)
            mark("forward")
            sampled = self._sample(batch.sampling, logits)
            mark("sample")
        finished = self._finish_requests(out, sampled)
        if out.scheduled:
            self.metrics.on_step(
                out,
                self.scheduler.block_manager.gpu_allocator.num_used_blocks,
                self.cache_config.block_size,
                len(finished),
                time.perf_counter() - begin,
            )
        mark("update")
        return finished

    def _sample(self, entries: list[ScheduledSeq], logits: torch.Tensor) -> list[Sequence]:
        """One token per entry (``n`` at a request's first sample, forking the children); returns the
        sequences that got a token, with stop conditions applied."""
        rows, params, gens, copies = [], [], [], []
        for row, entry in enumerate(entries):
            group = entry.seq.group
            sp = group.sampling_params
            k = (
                sp.n - len(group.seqs) + 1
            )  # > 1 only at the request's first sample: parallel sampling
            rows += [row] * k
            params += [sp] * k
            gens += [self._generators.get(group.request_id)] * k
            copies.append(k)
        tokens = self.sampler.sample(
            logits[rows] if len(rows) != logits.shape[0] else logits, params, gens
        )
        sampled, i, now = [], 0, time.perf_counter()
        for entry, k in zip(entries, copies):
            seq, group = entry.seq, entry.seq.group
            for token in tokens[i + 1 : i + k]:  # the children share the prompt's blocks
                child = seq.fork(next(self._seq_ids))
                group.seqs.append(child)
                self.scheduler.fork_seq(seq, child)
                sampled.append(self._append(child, token))
            sampled.append(self._append(seq, tokens[i]))
            i += k
        self.metrics.on_tokens(sampled, now)
        return sampled

    def _append(self, seq: Sequence, token: int) -> Sequence:
        """Append a sampled token and finish the sequence on a stop token, EOS, ``max_tokens`` or ``max_model_len``."""
        sp = seq.group.sampling_params
        seq.append_token_id(token)
        if token in sp.stop_token_ids or (not sp.ignore_eos and token in self.eos_token_ids):
            seq.status = SequenceStatus.FINISHED_STOPPED
        elif (
            len(seq) - seq.num_prompt_tokens >= sp.max_tokens
            or len(seq) >= self.scheduler_config.max_model_len
        ):
            seq.status = SequenceStatus.FINISHED_LENGTH
        return seq

    def _finish_requests(self, out, sampled: list[Sequence]) -> list[RequestOutput]:
        """Outputs of the requests that finished in this step; their blocks are freed at once."""
        touched = {s.group.request_id: s.group for s in [*out.ignored, *out.exhausted, *sampled]}
        done = [g for g in touched.values() if g.is_finished]
        if any(s.is_finished for s in sampled):
            self.scheduler.free_finished()
        return [self._output(g) for g in done]

    def _output(self, group: SequenceGroup) -> RequestOutput:
        self._generators.pop(group.request_id, None)
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
            "block_size": self.cache_config.block_size,
            "kv_cache_bytes": self.kv_cache.bytes,
            "slot_utilization": st.util_sum / steps if steps else 0.0,
            "prefix_cache_hit_rate": bm.prefix_cache_hit_rate,
            "preemptions": sched.num_preemptions,
            "recomputes": sched.num_recomputes,
            "swap_outs": sched.num_swap_outs,
            "swap_ins": sched.num_swap_ins,
            **{
                k: st.counters[k]
                for k in (
                    "swapped_out_blocks",
                    "swapped_in_blocks",
                    "cow_copies",
                    "steps",
                    "computed_tokens",
                    "generated_tokens",
                    "prefill_chunks",
                )
            },
            **st.latency(),
            "seconds": dict(st.seconds),
        }
