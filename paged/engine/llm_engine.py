"""The engine: continuous batching of requests over a paged KV cache, on a transformers model.

``LLMEngine.step()`` is one iteration of the serving loop (vLLM v0 ``vllm/engine/llm_engine.py``,
nano-vllm ``engine/llm_engine.py``):

1. **schedule**: the ``Scheduler`` picks this step's prefills and decodes, preempts when memory runs
   out, and says which blocks to swap and copy;
2. **cache ops**: swap out, swap in, then copy-on-write copies on the ``KVCache`` pool;
3. **model forward**: one packed forward over every scheduled token (``ModelRunner``), the attention
   reading and writing the pool through each sequence's block table;
4. **sample**: one token per sequence (``Sampler``); a request with ``n > 1`` forks after its prompt,
   the children sharing the prompt's blocks (copy-on-write later);
5. **update**: append the tokens, finish sequences on a stop token, EOS, ``max_tokens`` or
   ``max_model_len``, free finished sequences' blocks, return finished requests.

``LLM`` (in ``paged/engine/llm.py``) wraps it with model loading, KV sizing and ``generate``.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import torch

from paged.config import CacheConfig, SchedulerConfig
from paged.core.scheduler import Scheduler
from paged.core.sequence import CompletionOutput, RequestOutput, SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged.worker.model_runner import ModelRunner
from paged.worker.sampler import Sampler, make_generator


class LLMEngine:
    """Requests in, finished ``RequestOutput`` s out, one ``step()`` at a time.

    Args:
        model: a ``PreTrainedModel`` on the pool's device (switched to the ``"paged"`` attention).
        kv_cache: the ``KVCache`` pool, sized to ``cache_config.num_gpu_blocks`` / ``num_cpu_blocks``.
        scheduler_config, cache_config: see ``paged/config.py``.
        eos_token_ids: token ids that end a sequence unless ``ignore_eos``.
        tokenizer: decodes output text when given (else ``text`` stays empty).
        seed: seed of the sampler's shared generator (requests without their own ``seed``).
    """

    def __init__(self, model, kv_cache, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 eos_token_ids: set[int] | None = None, tokenizer=None, seed: int | None = 0):
        self.model = model
        self.kv_cache = kv_cache
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.scheduler = Scheduler(scheduler_config, cache_config)
        self.runner = ModelRunner(model, kv_cache, cache_config.block_size)
        self.sampler = Sampler(seed)
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids or ())
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        self._generators: dict[str, torch.Generator | None] = {}
        self.seconds: dict[str, float] = defaultdict(float)  # per phase, summed over steps
        self.counters: dict[str, int] = defaultdict(int)
        self.peak_used_blocks = 0
        self._util_sum = 0.0
        self.history: list[dict] = []  # one record per step that ran the model (for plots)

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_token_ids: list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, prompt: str | None = None) -> str:
        """Queue a request; returns its id.

        Raises:
            TypeError: ``sampling_params`` that is not a ``SamplingParams``, or a token id that is not an
                int (nothing is queued).
            ValueError: empty prompt, or a token id outside ``[0, vocab_size)`` (nothing is queued).
        """
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams; got {type(params).__name__}")
        request_id = str(next(self._request_ids)) if request_id is None else str(request_id)
        tokens = list(prompt_token_ids)
        if not tokens:
            raise ValueError(f"request {request_id!r}: the prompt is empty; at least one token is needed")
        wrong = next(((j, t) for j, t in enumerate(tokens) if not isinstance(t, int) or isinstance(t, bool)), None)
        if wrong is not None:
            raise TypeError(f"request {request_id!r}: token ids must be ints; got {type(wrong[1]).__name__} "
                            f"{wrong[1]!r} at position {wrong[0]}")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"request {request_id!r}: token id {bad[0]!r} outside [0, {self.vocab_size})")
        seq = Sequence(next(self._seq_ids), tokens, self.cache_config.block_size)
        self.scheduler.add_request(SequenceGroup(request_id, [seq], params, time.monotonic(), prompt))
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
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        finished = [self._output(g) for g in out.ignored + out.exhausted]
        if out.blocks_to_swap_out:
            self.kv_cache.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            self.kv_cache.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            self.kv_cache.copy_blocks(out.blocks_to_copy)
        self.counters["swapped_out_blocks"] += len(out.blocks_to_swap_out)
        self.counters["swapped_in_blocks"] += len(out.blocks_to_swap_in)
        self.counters["cow_copies"] += len(out.blocks_to_copy)
        t2 = time.perf_counter()
        self.seconds["schedule"] += t1 - t0
        self.seconds["cache_ops"] += t2 - t1
        if not out.scheduled:
            return finished
        forward_before = self.runner.forward_seconds
        entries = out.seq_block_tables()
        num_prefill_seqs = sum(len(g.seqs) for g in out.prefills)
        used = self._track_memory(entries)
        logits = self.runner.execute([(s.token_ids, len(s.seq), table) for s, table in entries], num_prefill_seqs)
        t4 = time.perf_counter()
        forward = self.runner.forward_seconds - forward_before
        self.seconds["forward"] += forward
        self.seconds["prepare"] += (t4 - t2) - forward  # block tables, packing, metadata
        self.counters["steps"] += 1
        self.counters["computed_tokens"] += out.num_batched_tokens
        self._sample_and_append(out, logits)
        t5 = time.perf_counter()
        self.seconds["sample"] += t5 - t4  # sampling, appending tokens, forks, stop checks
        finished += self._finish_requests(out)
        t6 = time.perf_counter()
        self.seconds["update"] += t6 - t5
        self.history.append({"prefill_tokens": sum(g.num_tokens for g in out.prefills),
                             "decode_seqs": sum(len(g.seqs) for g in out.decodes), "used_blocks": used,
                             "preempted": len(out.preempted), "finished": len(finished), "seconds": t6 - t0})
        return finished

    def _sample_and_append(self, out, logits: torch.Tensor) -> None:
        """Sample one token per scheduled sequence (``n`` for a request's first prefill) and append them."""
        rows, params, gens, targets = [], [], [], []
        for group in out.scheduled:
            sg = group.seq_group
            sp, gen = sg.sampling_params, self._generators.get(sg.request_id)
            copies = sp.n if group.is_prefill and len(sg.seqs) < sp.n else 1  # first step of parallel sampling
            for s in group.seqs:
                rows += [len(targets)] * copies
                params += [sp] * copies
                gens += [gen] * copies
                targets.append((sg, s.seq, copies))
        tokens = self.sampler.sample(logits[rows] if len(rows) != logits.shape[0] else logits, params, gens)
        self.counters["generated_tokens"] += len(tokens)
        max_len, i = self.scheduler_config.max_model_len, 0
        for sg, seq, copies in targets:
            sp = sg.sampling_params
            for token in tokens[i + 1 : i + copies]:  # parallel sampling: children share the prompt's blocks
                child = seq.fork(next(self._seq_ids))
                sg.seqs.append(child)
                self.scheduler.fork_seq(seq, child)
                self._append(child, token, sp, max_len)
            self._append(seq, tokens[i], sp, max_len)
            i += copies

    def _append(self, seq: Sequence, token: int, sp: SamplingParams, max_len: int) -> None:
        """Append a sampled token and finish the sequence on a stop token, EOS, ``max_tokens`` or ``max_len``."""
        seq.append_token_id(token)
        if (sp.stop_token_ids and token in sp.stop_token_ids) or (not sp.ignore_eos and token in self.eos_token_ids):
            seq.status = SequenceStatus.FINISHED_STOPPED
        elif len(seq) - seq.num_prompt_tokens >= sp.max_tokens or len(seq) >= max_len:
            seq.status = SequenceStatus.FINISHED_LENGTH

    def _finish_requests(self, out) -> list[RequestOutput]:
        done = [g.seq_group for g in out.scheduled if g.seq_group.is_finished]
        if done:
            self.scheduler.free_finished()
        return [self._output(g) for g in done]

    def _track_memory(self, entries) -> int:
        """Peak blocks in use and the fraction of allocated slots that hold a token (this step).
        Returns the GPU blocks in use."""
        used = self.scheduler.block_manager.gpu_allocator.num_used_blocks
        self.peak_used_blocks = max(self.peak_used_blocks, used)
        if used:
            bs = self.cache_config.block_size
            empty = sum(-len(s.seq) % bs for s, _ in entries)  # unfilled slots of each last block
            self._util_sum += max(0.0, 1.0 - empty / (used * bs))
        return used

    def _output(self, group: SequenceGroup) -> RequestOutput:
        self._generators.pop(group.request_id, None)
        outputs = []
        for i, seq in enumerate(sorted(group.seqs, key=lambda s: s.seq_id)):
            text = ""
            if self.tokenizer is not None and seq.output_token_ids:
                text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            outputs.append(CompletionOutput(i, list(seq.output_token_ids), text, seq.status.finish_reason,
                                            seq.finish_message))
        seq0 = group.seqs[0]
        return RequestOutput(group.request_id, group.prompt, list(group.prompt_token_ids), outputs, True,
                             seq0.num_cached_tokens)

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict:
        """KV blocks total / used / peak, slot utilization, prefix-cache hit rate, preemptions, swaps,
        tokens, and seconds per step phase (``forward`` is the model; the rest is engine overhead)."""
        bm, sched = self.scheduler.block_manager, self.scheduler
        steps = self.counters["steps"]
        return {
            "kv_blocks_total": bm.num_gpu_blocks,
            "kv_blocks_used": bm.gpu_allocator.num_used_blocks,
            "kv_blocks_peak": self.peak_used_blocks,
            "block_size": self.cache_config.block_size,
            "kv_cache_bytes": self.kv_cache.bytes,
            "slot_utilization": self._util_sum / steps if steps else 0.0,
            "prefix_cache_hit_rate": bm.prefix_cache_hit_rate,
            "preemptions": sched.num_preemptions,
            "recomputes": sched.num_recomputes,
            "swap_outs": sched.num_swap_outs,
            "swap_ins": sched.num_swap_ins,
            "swapped_out_blocks": self.counters["swapped_out_blocks"],
            "swapped_in_blocks": self.counters["swapped_in_blocks"],
            "cow_copies": self.counters["cow_copies"],
            "steps": steps,
            "computed_tokens": self.counters["computed_tokens"],
            "generated_tokens": self.counters["generated_tokens"],
            "seconds": dict(self.seconds),
        }

