"""One forward pass of a transformers model over a scheduled batch, on the paged KV cache.

``ModelRunner.prepare(scheduled)`` packs every token the step computes into one row (``input_ids [T]``):
for each scheduled sequence ``token_ids[start : start + num_tokens]`` (a prompt chunk, or the one token a
decode computes), chunks first and decodes last, and builds the step's ``AttentionMetadata`` (positions,
slot mapping, block tables, context lengths) once. ``forward(batch)`` runs the model and returns the
logits of the last token of each sequence that samples (a prompt's last chunk, or a decode),
``[K, vocab]`` float32. The K/V of the new tokens land in the pool inside the attention function.
``execute_model(out)`` is the engine's one call per step (vLLM v1 ``GPUModelRunner.execute_model``): the
step's KV moves, ``prepare``, ``forward``, then ``sample``, returning the sampled token ids.

On CUDA, with ``cuda_graphs`` (``LLM(enforce_eager=False)``, the default there), a step of decodes only is
served by a ``DecodeGraph``: the model's forward captured once per batch size of ``GRAPH_SIZES`` (vLLM's and
nano-vllm's ladder), replayed on a buffer at a fixed address into which the step's packed metadata are
copied, the batch padded to the next captured size. A decode step then costs one host-to-device copy and
one graph launch instead of the Python of every layer. Steps with prompt chunks run eagerly.

Also here: sizing the pool. ``profile_num_blocks`` follows vLLM's ``Worker.determine_num_available_blocks``
(``vllm/worker/worker.py``): run the largest step the scheduler may issue with no KV cache, read the peak
of GPU memory, and give the pool ``total x gpu_memory_utilization - peak`` bytes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from paged.core.scheduler_outputs import ScheduledSeq, SchedulerOutputs
from paged.worker.attention import AttentionMetadata, forward_logits, use_paged_attention
from paged.worker.kv_cache import KVCache
from paged.worker.sampler import Sampler

GRAPH_SIZES = (
    1,
    2,
    4,
    8,
    *range(16, 4097, 16),
)  # decode batch sizes to capture, up to max_num_seqs


@dataclass
class Batch:
    """A prepared step: its metadata (with the packed ``input_ids [T]``) and the entries that sample, in row
    order; for a decode step served by a CUDA graph, ``graph`` and its padded ``host`` buffer instead."""

    meta: AttentionMetadata | None
    sampling: list[ScheduledSeq]
    graph: DecodeGraph | None = None
    host: torch.Tensor | None = None


class DecodeGraph:
    """The forward of a decode step of ``size`` sequences, captured once as a CUDA graph (vLLM, nano-vllm).

    Its metadata are views of one int64 device buffer at a fixed address (``AttentionMetadata.pack`` layout
    with ``width`` table columns); ``run(host)`` copies a step's packed buffer into it and replays the graph.
    Rows past the step's sequences are padding: token 0 at position 0 with the table ``[pad_block]``, so
    their K/V go to the pool's last block, which no block table names. On CPU (tests) nothing is captured and
    ``run`` runs the same forward eagerly on the same buffer.
    """

    def __init__(self, runner: ModelRunner, size: int, width: int, pool=None):
        self.runner, self.size, self.width = runner, size, width
        host, self.layout = self.pack([], [])
        self.buf = host.to(runner.device)
        self.graph = None
        if runner.device.type == "cuda":
            self.step()  # warm-up outside the graph: Triton compiles, the allocator settles
            torch.cuda.synchronize(runner.device)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.logits = self.step()

    def pack(
        self, tables: list[list[int]], lens: list[int], tokens: list[int] | None = None
    ) -> tuple:
        pad, r = self.size - len(tables), self.runner
        return AttentionMetadata.pack(
            tables + [[r.pad_block]] * pad,
            lens + [1] * pad,
            [1] * self.size,
            r.kv_cache.block_size,
            None,
            r.parts.slot_mapping,
            (tokens or []) + [0] * pad,
            self.width,
        )

    def step(self) -> torch.Tensor:
        r = self.runner
        meta = AttentionMetadata.from_buffer(
            r.kv_cache,
            self.buf,
            self.layout,
            r.kv_cache.block_size,
            write_kv=r.parts.write_kv,
            decode=r.decode,
        )
        return forward_logits(r.model, meta.input_ids, meta)

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
        parts: the engine's ``Parts``; the runner uses ``slot_mapping``, ``write_kv`` and the decode attention.
        decode: the decode attention to run (``parts.decode_attention`` resolved for the device).
        prefill: ``None`` (one SDPA per chunk) or the kernel that attends all chunks of a step at once
            (``paged.kernels.launch_prefill``, on CUDA).
        max_num_seqs, max_model_len: with ``cuda_graphs``, the largest decode batch and table width captured.
        cuda_graphs: capture decode steps as CUDA graphs (``DecodeGraph``, ``GRAPH_SIZES`` up to
            ``max_num_seqs``); the pool's last block is then the padding rows' (the block manager must
            own one block fewer than ``kv_cache`` holds).
        seed: seed of the sampler's shared generator (requests without a generator of their own).
    """

    def __init__(
        self,
        model,
        kv_cache: KVCache,
        parts,
        decode,
        prefill=None,
        max_num_seqs: int = 256,
        max_model_len: int = 2048,
        cuda_graphs: bool = False,
        seed: int | None = 0,
    ):
        self.sampler = getattr(parts, "sampler", Sampler)(seed)
        self.model, self.kv_cache, self.parts, self.decode, self.prefill = (
            model,
            kv_cache,
            parts,
            decode,
            prefill,
        )
        self.device = kv_cache.device
        self.pad_block = kv_cache.num_blocks - 1
        self.graphs: dict[int, DecodeGraph] = {}
        if cuda_graphs:
            sizes = [b for b in GRAPH_SIZES if b < max_num_seqs] + [max_num_seqs]
            pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
            use_paged_attention(model)
            try:
                with torch.inference_mode():
                    for size in reversed(
                        sizes
                    ):  # the largest first: the smaller ones reuse its memory
                        self.graphs[size] = DecodeGraph(
                            self, size, -(-max_model_len // kv_cache.block_size), pool
                        )
            except (
                RuntimeError
            ) as err:  # a forward that cannot be captured (it syncs with the host): stay eager
                warnings.warn(
                    f"CUDA graph capture failed, decode steps run eagerly: {err}", stacklevel=2
                )
                self.graphs = {}

    def prepare(self, scheduled: list[ScheduledSeq]) -> Batch:
        """Pack a step (chunks first, decodes last) and build its metadata once for every layer."""
        batch = sorted(
            scheduled, key=lambda s: s.num_tokens == 1
        )  # stable: chunks keep their order
        keep = [i for i, s in enumerate(batch) if s.samples]
        tables, lens, tokens = (
            [s.block_table for s in batch],
            [s.start + s.num_tokens for s in batch],
            [t for s in batch for t in s.token_ids],
        )
        size = min((b for b in self.graphs if b >= len(batch)), default=0)
        if size and len(keep) == len(batch) == len(
            tokens
        ):  # decodes only, each samples: a captured size
            return Batch(
                None, batch, self.graphs[size], self.graphs[size].pack(tables, lens, tokens)[0]
            )
        meta = AttentionMetadata.build(
            self.kv_cache,
            tables,
            lens,
            [s.num_tokens for s in batch],
            self.kv_cache.block_size,
            self.device,
            keep,
            self.parts.slot_mapping,
            tokens,
            write_kv=self.parts.write_kv,
            decode=self.decode,
            prefill=self.prefill,
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
        return forward_logits(self.model, batch.meta.input_ids, batch.meta)

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
        tokens = self.sampler.sample(logits, params, generators)
        sampled, i = {}, 0
        for entry, k in zip(entries, counts):
            sampled[entry.seq.seq_id] = tokens[i : i + k]
            i += k
        return sampled


def kv_shape(model) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of a transformers decoder (GPT-2: KV heads = heads).

    Reads ``num_hidden_layers`` / ``n_layer``, ``num_key_value_heads`` (absent: MHA), and ``head_dim``
    when the config sets it, else ``hidden_size // num_attention_heads``.
    """
    config = model.config.get_text_config()
    get = lambda *names: next(
        (getattr(config, n) for n in names if getattr(config, n, None) is not None), None
    )  # noqa: E731
    heads = get("num_attention_heads", "n_head")
    head_dim = get("head_dim") or get("hidden_size", "n_embd") // heads
    return (
        int(get("num_hidden_layers", "n_layer")),
        int(get("num_key_value_heads") or heads),
        int(head_dim),
    )


@torch.inference_mode()
def profile_num_blocks(
    model,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    gpu_memory_utilization: float,
    dtype: torch.dtype,
) -> tuple[int, str]:
    """GPU blocks that fit beside the model's peak activation memory (CUDA only).

    Runs one dummy forward of ``max_num_batched_tokens`` tokens split over up to ``max_num_seqs``
    sequences through a 1-table-per-sequence scratch pool, then returns
    ``(total x utilization - peak bytes) // bytes_per_block`` and a one-line report.

    Raises:
        ValueError: utilization outside (0, 1], or no block fits (the message gives the numbers).
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    device = next(model.parameters()).device
    layers, kv_heads, head_dim = kv_shape(model)
    num_seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
    per_seq = max(2, max_num_batched_tokens // num_seqs)  # >= 2 tokens: every sequence is a chunk
    blocks_per_seq = -(-per_seq // block_size)
    scratch = KVCache(
        layers, num_seqs * blocks_per_seq, block_size, kv_heads, head_dim, dtype, device
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(num_seqs)]
    meta = AttentionMetadata.build(
        scratch, tables, [per_seq] * num_seqs, [per_seq] * num_seqs, block_size, device
    )
    use_paged_attention(model)
    forward_logits(model, torch.zeros(per_seq * num_seqs, dtype=torch.long, device=device), meta)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - scratch.bytes
    block_bytes = (
        scratch.bytes_per_block
    )  # the real pool's blocks have the scratch pool's shape and dtype
    del scratch, meta
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    available = int(total * gpu_memory_utilization) - peak
    num_blocks = available // block_bytes
    report = (
        f"GPU {total / 2**30:.1f} GiB x {gpu_memory_utilization:.2f} - peak {peak / 2**30:.2f} GiB "
        f"(weights + activations) = {available / 2**30:.2f} GiB for KV -> {num_blocks} blocks of "
        f"{block_bytes / 2**10:.0f} KiB"
    )
    if num_blocks <= 0:
        raise ValueError(f"no KV block fits: {report}")
    return num_blocks, report
