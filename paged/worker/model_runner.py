"""One forward pass of a transformers model over a scheduled batch, on the paged KV cache.

``ModelRunner.prepare(scheduled)`` packs every token the step computes into one row (``input_ids [T]``):
for each scheduled sequence ``token_ids[start : start + num_tokens]`` (a prompt chunk, or the one token a
decode computes), chunks first and decodes last, and builds the step's ``AttentionMetadata`` (positions,
slot mapping, block tables, context lengths) once. ``forward(batch)`` runs the model and returns the
logits of the last token of each sequence that samples (a prompt's last chunk, or a decode),
``[K, vocab]`` float32. The K/V of the new tokens land in the pool inside the attention function.
``execute_model(out)`` is the engine's one call per step (vLLM v1 ``GPUModelRunner.execute_model``,
``vllm/v1/worker/gpu_model_runner.py``, 0.11.1): the
step's KV moves, ``prepare``, ``forward``, then ``sample``, returning the sampled token ids.

On CUDA, with ``cuda_graphs`` (``LLM(enforce_eager=False)``, the default there), a step of decodes only is
served by a ``DecodeGraph``: the model's forward captured once per batch size of ``GRAPH_SIZES`` (nano-vllm's
ladder; vLLM v1 0.11.1 captures 1, 2, 4, then steps of 8 to 248 and of 16 above, ``vllm/config/vllm.py``),
replayed on a buffer at a fixed address into which the step's packed metadata are copied, the batch padded
to the next captured size. A decode step then costs one host-to-device copy and
one graph launch instead of the Python of every layer. Steps with prompt chunks run eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from paged.config import EngineConfig
from paged.core.scheduler_outputs import ScheduledSeq, SchedulerOutputs
from paged.worker.attention import (
    AttentionBackend,
    AttentionMetadata,
    use_paged_attention,
)
from paged.worker.kv_cache import KVCache

# decode batch sizes to capture, up to max_num_seqs
GRAPH_SIZES = (1, 2, 4, 8, *range(16, 4097, 16))


@dataclass
class Batch:
    """A prepared step: its metadata (with the packed ``input_ids [T]``) and the entries that sample, in row
    order; for a decode step served by a CUDA graph, ``graph`` and its padded ``host`` buffer instead."""

    meta: AttentionMetadata | None
    sampling: list[ScheduledSeq]
    graph: DecodeGraph | None = None
    host: torch.Tensor | None = None


class DecodeGraph:
    """The forward of a decode step of ``size`` sequences, captured once as a CUDA graph (nano-vllm).

    vLLM v1 does the same with full decode graphs (``CUDAGraphMode`` in ``vllm/config/compilation.py``, 0.11.1).

    Its metadata are views of one int64 device buffer at a fixed address (``prepare_inputs`` layout
    with ``width`` table columns); ``run(host)`` copies a step's packed buffer into it and replays the graph.
    Rows past the step's sequences are padding: token 0 at position 0 with the table ``[pad_block]``, so
    their K/V go to the pool's last block, which no block table names. On CPU (tests) nothing is captured and
    ``run`` runs the same forward eagerly on the same buffer.
    """

    def __init__(self, runner: ModelRunner, size: int, width: int, pool=None):
        self.runner, self.size, self.width = runner, size, width
        host, self.layout = self.pack([], [], [])
        self.buf = host.to(runner.device)
        self.graph = None
        if runner.device.type == "cuda":
            self.step()  # warm-up outside the graph: Triton compiles, the allocator settles
            torch.cuda.synchronize(runner.device)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.logits = self.step()

    def pack(self, tables: list[list[int]], lens: list[int], tokens: list[int]) -> tuple:
        pad, r = self.size - len(tables), self.runner
        return r.prepare_inputs(
            tables + [[r.pad_block]] * pad,
            lens + [1] * pad,
            [1] * self.size,
            r.kv_cache.block_size,
            None,
            r.slot_mapping,
            tokens + [0] * pad,
            self.width,
        )

    def step(self) -> torch.Tensor:
        meta = AttentionMetadata.from_buffer(self.buf, self.layout)
        return forward_logits(self.runner.model, meta, self.runner.attention)

    def run(self, host: torch.Tensor) -> torch.Tensor:
        """Logits ``[size, vocab]`` of the step packed in ``host`` (static until the next replay)."""
        self.buf.copy_(host.pin_memory() if self.graph is not None else host, non_blocking=True)
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.logits


class ModelRunner:
    """Runs ``model`` over packed batches against ``kv_cache``.

    Args:
        model: a ``PreTrainedModel`` (switched to the ``"paged"`` attention at every forward, so the same
            object can run ``model.generate`` in between after ``use_attention(model)``).
        kv_cache: the ``KVCache`` pool (same device and dtype as the model).
        parts: the engine's ``Parts``, resolved here once: ``parts.attention(kv_cache)`` (the
            ``AttentionBackend``: write_kv, prefill and decode attention), ``parts.sampler(seed)``,
            ``parts.prepare_inputs`` and ``parts.slot_mapping``.
        config: the ``EngineConfig``. ``model.seed`` seeds the sampler's shared generator; with
            ``model.cuda_graphs`` decode steps are captured as CUDA graphs (``DecodeGraph``,
            ``GRAPH_SIZES`` up to ``scheduler.max_num_seqs``, tables ``scheduler.max_model_len`` tokens
            wide) and the pool's last block is the padding rows' (the block manager owns one block fewer
            than ``kv_cache`` holds).
    """

    def __init__(self, model, kv_cache: KVCache, parts, config: EngineConfig):
        self.model, self.kv_cache = model, kv_cache
        self.attention = parts.attention(kv_cache)
        self.sampler = parts.sampler(config.model.seed)
        max_num_seqs, max_model_len = config.scheduler.max_num_seqs, config.scheduler.max_model_len
        self.prepare_inputs, self.slot_mapping = parts.prepare_inputs, parts.slot_mapping
        self.device = kv_cache.device
        self.pad_block = kv_cache.num_blocks - 1
        self.graphs: dict[int, DecodeGraph] = {}
        if config.model.cuda_graphs:
            sizes = [b for b in GRAPH_SIZES if b < max_num_seqs] + [max_num_seqs]
            pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
            use_paged_attention(model)
            try:
                with torch.inference_mode():
                    # the largest first: the smaller ones reuse its memory
                    for size in reversed(sizes):
                        self.graphs[size] = DecodeGraph(
                            self, size, -(-max_model_len // kv_cache.block_size), pool
                        )
            # a forward that cannot be captured (it syncs with the host): stay eager
            except RuntimeError as err:
                warnings.warn(
                    f"CUDA graph capture failed, decode steps run eagerly: {err}", stacklevel=2
                )
                self.graphs = {}

    def prepare(self, scheduled: list[ScheduledSeq]) -> Batch:
        """Pack a step (chunks first, decodes last) and build its metadata once for every layer."""
        # stable: chunks keep their order
        batch = sorted(scheduled, key=lambda s: s.num_tokens == 1)
        keep = [i for i, s in enumerate(batch) if s.samples_next_token]
        tables = [s.block_table for s in batch]
        lens = [s.start + s.num_tokens for s in batch]
        tokens = [t for s in batch for t in s.token_ids]
        size = min((b for b in self.graphs if b >= len(batch)), default=0)
        # decodes only, each samples: a captured size
        if size and len(keep) == len(batch) == len(tokens):
            return Batch(
                None, batch, self.graphs[size], self.graphs[size].pack(tables, lens, tokens)[0]
            )
        meta = AttentionMetadata.build(
            tables,
            lens,
            [s.num_tokens for s in batch],
            self.kv_cache.block_size,
            self.device,
            keep,
            self.slot_mapping,
            tokens,
            self.prepare_inputs,
        )
        return Batch(meta, [batch[i] for i in keep])

    def execute_model(
        self, out: SchedulerOutputs, mark: Callable[[str], None] = lambda phase: None
    ) -> dict[int, list[int]]:
        """Run one scheduled step: move KV (swap out first, then swap in, then copy-on-write copies), one
        forward over every scheduled token, then sampling.

        Returns ``{seq_id: token ids}`` for each sequence that samples, in batch order: one token, or
        ``n`` at a request's first sample (its first sequence keeps the first; the scheduler forks the
        others). ``mark(phase)`` is called after each phase (the profiling engine's ``PhaseClock``).
        """
        kv = self.kv_cache
        if out.blocks_to_swap_out:
            kv.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            kv.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            kv.copy_blocks(out.blocks_to_copy)
        mark("cache_ops")
        if not out.scheduled:
            return {}
        batch = self.prepare(out.scheduled)
        mark("prepare")
        logits = self.forward(batch)
        mark("forward")
        sampled = self.sample(batch.sampling, logits)
        mark("sample")
        return sampled

    @torch.inference_mode()
    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[len(batch.sampling), vocab]`` float32 of the sampling entries, in their order."""
        use_paged_attention(self.model)
        if batch.graph is not None:
            return batch.graph.run(batch.host)[: len(batch.sampling)]
        return forward_logits(self.model, batch.meta, self.attention)

    def sample(self, entries: list[ScheduledSeq], logits: torch.Tensor) -> dict[int, list[int]]:
        """``{seq_id: token ids}`` for ``entries`` (the rows of ``logits``): ``n - len(group.seqs) + 1``
        tokens each, so ``n`` at a request's first sample (parallel sampling) and 1 afterwards."""
        rows, params, generators, counts = [], [], [], []
        for row, entry in enumerate(entries):
            group = entry.seq.group
            k = group.sampling_params.n - len(group.seqs) + 1
            rows += [row] * k
            params += [group.sampling_params] * k
            generators += [group.generator] * k
            counts.append(k)
        if len(rows) != logits.shape[0]:
            logits = logits[rows]
        tokens = iter(self.sampler.sample(logits, params, generators))
        return {e.seq.seq_id: [next(tokens) for _ in range(k)] for e, k in zip(entries, counts)}


def forward_logits(model, meta: AttentionMetadata, attention: AttentionBackend) -> torch.Tensor:
    """One packed forward of the whole model over the step's ``meta.input_ids [T]`` -> logits ``[K, vocab]``
    float32 of the kept sequences (``meta.keep``), every layer attending through ``attention``."""
    out = model(
        input_ids=meta.input_ids.unsqueeze(0),
        position_ids=meta.positions.unsqueeze(0),
        use_cache=False,
        logits_to_keep=meta.keep,
        paged_metadata=meta,
        paged_backend=attention,
    )
    return out.logits[0].float()
