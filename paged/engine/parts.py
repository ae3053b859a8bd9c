"""The parts the course builds, each behind one small interface; the engine is assembled from them.

``LLM(..., parts=Parts(allocator=MyAllocator))`` runs the engine with a learner's allocator and the
reference for everything else. Each field is a class or a function with exactly the interface below
(the methods the engine calls, nothing more; written out as ``typing.Protocol`` classes in
``paged_course.capstone``); the defaults are this package's reference parts.
``Parts.attention(kv_cache)`` resolves the attention parts once per engine into the ``AttentionBackend``
the model runner owns.

- ``allocator`` (chapter 02): a class ``Allocator(num_blocks)`` with ``allocate_many(n) -> list[int]``,
  ``free_many(ids)``, ``incref(b)``, ``take(b)``, ``ref_count(b)`` and ``num_free_blocks``
  (reference: ``paged/core/allocator.py``).
- ``slot_mapping`` (chapter 03): ``(block_tables, start_positions, num_tokens, block_size) -> list[int]``
  (``paged/core/block_table.py``).
- ``write_kv`` (chapter 03): ``(key_cache, value_cache, key, value, slot_mapping) -> None``
  (``paged/worker/attention.py``).
- ``decode_attention`` (chapters 03 and 04): ``(query, key_cache, value_cache, block_tables, context_lens,
  scale) -> out``; ``None`` picks by device: ``paged/worker/attention.py`` on CPU, ``paged.kernels`` on CUDA.
- ``prefill_attention`` (chapter 07): ``(query [T, H, D], key_cache, value_cache, block_tables [C, W] int,
  query_start [C + 1] int, context_lens [C] int, max_query_len: int, scale: float) -> out [T, H, D]``, every
  chunk's new K/V already in the pool; chunk ``c``'s row ``i`` sits at position ``context_lens[c] - chunk_len
  + i`` and attends its cached prefix plus itself (GQA). ``None`` picks by device: ``prefill_attention`` in
  ``paged/worker/attention.py`` on CPU, ``paged.kernels.launch_prefill`` on CUDA.
- ``prepare_inputs`` (chapter 07): ``(block_tables, context_lens, query_lens, block_size, keep, slot_mapping,
  token_ids, width) -> (host int64 tensor, StepLayout)``: one step's integers packed for one transfer
  (``paged/worker/attention.py``; ``AttentionMetadata.from_buffer`` reads them back).
- ``sampler`` (chapter 07): a class ``Sampler(seed)`` with ``sample(logits [S, V] float32, params:
  list[SamplingParams], generators: list[torch.Generator | None] | None) -> list[int]``
  (``paged/worker/sampler.py``).
- ``prefix_cache`` (chapter 05): a class ``PrefixCache(block_size, hash_fn)`` with ``lookup(seq, max_blocks)``,
  ``insert(seq, block_ids, first, stop)``, ``evict(block_id)``, ``record_query``, ``hit_rate``, ``clear``
  (``paged/core/prefix_cache.py``).
- ``copy_on_write`` (chapter 05): ``(table, allocator, allocate) -> [(src, dst)]`` (``paged/core/block_manager.py``).
- ``block_manager`` (chapters 05 and 06): a class ``BlockSpaceManager(block_size, num_gpu_blocks,
  num_cpu_blocks, watermark, enable_prefix_caching, allocator_cls=, prefix_cache_cls=, copy_on_write=)``
  with the methods of ``paged_course.capstone.BlockManager`` (``paged/core/block_manager.py``).
- ``scheduler`` (chapter 06): a class ``Scheduler(scheduler_config, cache_config, block_manager, update)`` with
  ``schedule()``, ``update_from_output(out, sampled)`` and the request methods of ``paged/core/scheduler.py``
  (a subclass that overrides the policy methods is the usual learner's part).
- ``update`` (chapter 07): ``(scheduler, out: SchedulerOutputs, sampled: {seq_id: [token]}) -> StepResult``:
  apply a step's sampled tokens: fork a request's ``n - 1`` other samples at its first token
  (``scheduler.fork_seq``), append each token and set the sequence's status when it stops (a stop token or
  EOS, ``max_tokens``, ``max_model_len``), free finished sequences (``scheduler.free_finished``); the
  scheduler's ``update_from_output`` calls it once per step, so it stays a part of its own under a learner's
  scheduler (``update_from_output`` and ``update_sequence`` in ``paged/core/scheduler.py``).

Tensor shapes: query / out ``[S, H, D]``; caches ``[num_blocks, block_size, KVH, D]``; block_tables int32
``[S, W]`` (the width covers every context); context_lens int32 ``[S]``; key / value ``[T, KVH, D]``;
slot_mapping int64 ``[T]``. The engine validates its inputs once at ``add_request``; parts are called in
the hot loop and get no further checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from paged.core.allocator import BlockAllocator
from paged.core.block_manager import BlockSpaceManager, copy_on_write
from paged.core.block_table import slot_mapping
from paged.core.prefix_cache import PrefixCache
from paged.core.scheduler import Scheduler, update_from_output
from paged.worker.attention import (
    AttentionBackend,
    decode_attention,
    prefill_attention,
    prepare_inputs,
    select_backend,
    write_kv,
)
from paged.worker.sampler import Sampler


@dataclass(frozen=True)
class Parts:
    """The engine's swappable pieces (module docstring). ``decode_attention=None`` and
    ``prefill_attention=None`` pick by device: PyTorch on CPU, the Triton kernels on CUDA (``select_backend``)."""

    allocator: type = BlockAllocator
    prefix_cache: type = PrefixCache
    block_manager: type = BlockSpaceManager
    scheduler: type = Scheduler
    update: Callable = update_from_output
    copy_on_write: Callable = copy_on_write
    slot_mapping: Callable = slot_mapping
    prepare_inputs: Callable = prepare_inputs
    write_kv: Callable = write_kv
    decode_attention: Callable | None = None
    prefill_attention: Callable | None = None
    sampler: type = Sampler

    def attention(self, kv_cache) -> AttentionBackend:
        """The attention parts resolved once for ``kv_cache``'s device: what the model runner owns."""
        decode, prefill = decode_attention, prefill_attention
        if select_backend(kv_cache.device) == "triton":  # imported only then: it sets Triton's mode
            from paged.kernels import launch_decode as decode
            from paged.kernels import launch_prefill as prefill
        decode, prefill = self.decode_attention or decode, self.prefill_attention or prefill
        return AttentionBackend(kv_cache, self.write_kv, prefill, decode)
