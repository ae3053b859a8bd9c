"""The parts the course builds, each behind one small interface; the engine is assembled from them.

``LLM(..., parts=Parts(allocator=MyAllocator))`` runs the engine with a learner's allocator and the
reference for everything else. Each field is a class or a function with exactly the interface below
(the methods the engine calls, nothing more); the defaults are this package's reference parts.

- ``allocator`` (chapter 02): a class ``Allocator(num_blocks)`` with ``allocate_many(n) -> list[int]``,
  ``free_many(ids)``, ``incref(b)``, ``take(b)``, ``ref_count(b)`` and ``num_free_blocks``
  (reference: ``paged/core/allocator.py``).
- ``slot_mapping`` (chapter 03): ``(block_tables, start_positions, num_tokens, block_size) -> list[int]``
  (``paged/core/block_table.py``).
- ``write_kv`` (chapter 03): ``(key_cache, value_cache, key, value, slot_mapping) -> None``
  (``paged/worker/attention.py``).
- ``decode_attention`` (chapters 03 and 04): ``(query, key_cache, value_cache, block_tables, context_lens,
  scale) -> out``; ``None`` picks by device: ``paged/worker/attention.py`` on CPU, ``paged.kernels`` on CUDA.
- ``prefix_cache`` (chapter 05): a class ``PrefixCache(block_size, hash_fn)`` with ``lookup(seq, max_blocks)``,
  ``insert(seq, block_ids, first, stop)``, ``evict(block_id)``, ``record_query``, ``hit_rate``, ``clear``
  (``paged/core/prefix_cache.py``).
- ``copy_on_write`` (chapter 05): ``(table, allocator, allocate) -> [(src, dst)]`` (``paged/core/block_manager.py``).
- ``prefill_attention`` (chapter 07): ``(query [T, H, D], key_cache, value_cache, block_tables [C, W],
  query_start [C + 1], context_lens [C], max_query_len, scale) -> out [T, H, D]``, every prompt chunk of a step
  in one call (the interface of ``paged.kernels.launch_prefill``); ``None`` picks by device.
- ``sampler`` (chapter 07): a class ``Sampler(seed)`` with ``sample(logits [S, V], params, generators) ->
  list[int]`` (``paged/worker/sampler.py``).
- ``scheduler`` (chapter 06): a class ``Scheduler(scheduler_config, cache_config, block_manager)`` with
  ``schedule()`` and the request methods of ``paged/core/scheduler.py`` (a subclass that overrides the
  policy methods is the usual learner's part).

Tensor shapes: query / out ``[S, H, D]``; caches ``[num_blocks, block_size, KVH, D]``; block_tables int32
``[S, W]`` (the width covers every context); context_lens int32 ``[S]``; key / value ``[T, KVH, D]``;
slot_mapping int64 ``[T]``. The engine validates its inputs once at ``add_request``; parts are called in
the hot loop and get no further checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Protocol

import torch

from paged.core.allocator import BlockAllocator
from paged.core.block_manager import copy_on_write
from paged.core.block_table import slot_mapping
from paged.core.prefix_cache import PrefixCache
from paged.core.scheduler import Scheduler
from paged.worker.attention import decode_attention, select_backend, write_kv
from paged.worker.sampler import Sampler


class Allocator(Protocol):
    """A pool of ``num_blocks`` block ids with reference counts (chapter 02; ``core/allocator.py``)."""

    num_free_blocks: int

    def allocate_many(self, n: int) -> list[int]: ...
    def free_many(self, block_ids) -> None: ...
    def incref(self, block_id: int) -> None: ...
    def take(self, block_id: int) -> None: ...
    def ref_count(self, block_id: int) -> int: ...


def _triton_decode(query, key_cache, value_cache, block_tables, context_lens, scale):
    """The Triton decode kernel without input checks (the engine built the inputs)."""
    from paged.kernels import launch_decode

    return launch_decode(query, key_cache, value_cache, block_tables, context_lens, scale)


@dataclass(frozen=True)
class Parts:
    """The engine's swappable pieces (module docstring). ``decode_attention=None`` picks by device:
    the PyTorch ``decode_attention`` on CPU, the Triton kernel on CUDA (``select_backend``)."""

    allocator: type = BlockAllocator
    prefix_cache: type = PrefixCache
    scheduler: type = Scheduler
    copy_on_write: Callable = copy_on_write
    slot_mapping: Callable = slot_mapping
    write_kv: Callable = write_kv
    decode_attention: Callable | None = None
    sampler: type = Sampler
    prefill_attention: Callable | None = None

    def decode_for(self, device: torch.device) -> Callable:
        """The decode attention this engine runs on ``device``."""
        if self.decode_attention is not None:
            return self.decode_attention
        return _triton_decode if select_backend(device) == "triton" else decode_attention

    def prefill_for(self, device: torch.device) -> Callable | None:
        """The chunk attention on ``device``: the ``prefill_attention`` part when one is given, else the Triton
        kernel that serves every chunk of a step in one call on CUDA (``paged.kernels.launch_prefill``), else
        ``None`` (one SDPA per chunk)."""
        if self.prefill_attention is not None:
            return self.prefill_attention
        if select_backend(device) != "triton":
            return None
        from paged.kernels import launch_prefill

        return launch_prefill

    def origins(self) -> dict[str, str]:
        """``{part: "module.name"}``: where each part comes from (a learner's or the reference)."""
        return {
            f.name: (
                f"{value.__module__}.{value.__qualname__}" if value is not None else "by device"
            )
            for f in fields(self)
            for value in [getattr(self, f.name)]
        }
