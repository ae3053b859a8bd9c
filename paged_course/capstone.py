"""The capstone of chapter 07: the engine assembled from the learner's own parts.

``PART_SOURCES`` says where each part of ``paged.engine.parts.Parts`` lives in the learner's files; each
exercise module says which graded regions a part is made of in its ``PART_REGIONS`` dict (attribute ->
region ids). ``learner_parts()`` imports them afresh from ``exercises/`` (or ``solutions/``, whichever
``paged_course.check.impl_package()`` decided for this process) and, with ``verify=True``, keeps a part
only when its regions pass their checks, falling back to the reference otherwise and saying so;
``python -m paged grade ch07`` builds the engine without fallback and compares its tokens with
transformers' greedy ``generate``.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import fields
from typing import Protocol

import torch

from paged.core.block_table import BlockTable
from paged.core.scheduler_outputs import SchedulerOutputs, StepResult
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup
from paged.engine.parts import Parts
from paged_course.check import ROOT, exercise_module, impl_package, run_check

# The interfaces of the class parts of ``paged.engine.parts.Parts`` (the methods the engine calls on
# them); the function parts (slot_mapping, write_kv, decode_attention, prefill_attention, prepare_inputs,
# copy_on_write, update) have the signatures of that module's docstring.


class Allocator(Protocol):
    """A pool of ``num_blocks`` block ids with reference counts (chapter 02; ``core/allocator.py``)."""

    num_free_blocks: int

    def allocate_many(self, n: int) -> list[int]: ...
    def free_many(self, block_ids) -> None: ...
    def incref(self, block_id: int) -> None: ...
    def take(self, block_id: int) -> None: ...
    def ref_count(self, block_id: int) -> int: ...


class PrefixCacheLike(Protocol):
    """Full blocks by the hash of their tokens and everything before (chapter 05; ``core/prefix_cache.py``)."""

    def lookup(self, seq: Sequence, max_blocks: int) -> list[int]: ...
    def insert(self, seq: Sequence, block_ids: list[int], first: int, stop: int) -> None: ...
    def evict(self, block_id: int) -> None: ...
    def record_query(self, num_blocks: int, num_hits: int) -> None: ...
    def hit_rate(self) -> float: ...
    def clear(self) -> None: ...


class BlockManager(Protocol):
    """The scheduler's only view of memory: allocate or ``None`` (``core/block_manager.py``)."""

    block_size: int
    num_gpu_blocks: int
    watermark_blocks: int
    gpu_allocator: Allocator
    block_tables: dict[int, BlockTable]
    prefix_cache_hit_rate: float

    def can_ever_fit(self, num_tokens: int) -> bool: ...
    def get_computed_blocks(self, seq: Sequence) -> list[int]: ...
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, computed=None): ...
    def fork(self, parent: Sequence, child: Sequence) -> None: ...
    def free(self, seq: Sequence) -> None: ...
    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None: ...
    def swap_in(self, seq: Sequence, num_new_tokens: int = 0) -> list[tuple[int, int]] | None: ...


class SchedulerLike(Protocol):
    """What the engine calls on its scheduler (chapter 06; ``core/scheduler.py``)."""

    block_manager: BlockManager
    seq_ids: object  # an iterator of fresh sequence ids

    def add_request(self, seq_group: SequenceGroup) -> None: ...
    def abort_request(self, request_id: str) -> bool: ...
    def has_unfinished_requests(self) -> bool: ...
    def schedule(self) -> SchedulerOutputs: ...
    def update_from_output(
        self, out: SchedulerOutputs, sampled: dict[int, list[int]]
    ) -> StepResult: ...


class SamplerLike(Protocol):
    """One token id per row of ``logits`` (``worker/sampler.py``)."""

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None] | None = None,
    ) -> list[int]: ...


# part -> (exercise module, attribute); the regions come from the module's PART_REGIONS[attribute]
PART_SOURCES: dict[str, tuple[str, str]] = {
    "allocator": ("ex02_allocator", "BlockAllocator"),
    "slot_mapping": ("ex03_block_tables", "slot_mapping"),
    "write_kv": ("ex03_block_tables", "write_kv"),
    "decode_attention": ("ex03_block_tables", "decode_attention"),
    "prefix_cache": ("ex05_prefix_cache", "PrefixCache"),
    "copy_on_write": ("ex05_prefix_cache", "copy_on_write"),
    "block_manager": ("ex05_block_manager", "BlockSpaceManager"),
    "scheduler": ("ex06_scheduler", "Scheduler"),
    "prefill_attention": ("ex07_engine", "prefill_attention"),
    "sampler": ("ex07_engine", "Sampler"),
    "prepare_inputs": ("ex07_engine", "prepare_inputs"),
    "update": ("ex07_engine", "update_from_output"),
}


def learner_parts(
    impl: str | None = None, verify: bool = True, parts: tuple[str, ...] | None = None
) -> tuple[Parts, dict[str, str]]:
    """``(Parts, {part: where it comes from})`` built from the learner's files.

    Args:
        impl: ``exercises`` or ``solutions`` (default: ``impl_package()``, decided once per process).
        verify: run each part's checks and use the reference for a part that does not pass them.
        parts: only these parts (default: every part of ``PART_SOURCES``).

    Raises:
        ImportError / AttributeError: with ``verify=False``, a module or name the learner's file lacks.
    """
    impl = impl or impl_package()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    chosen, origin = {}, {}
    for part, (module, attribute) in PART_SOURCES.items():
        if parts is not None and part not in parts:
            continue
        source = _load(module, impl, verify)
        regions = getattr(source, "PART_REGIONS", {}).get(attribute, ())
        failing = [r for r in regions if not run_check(r, impl)] if verify else []
        if source is None:
            origin[part] = f"reference ({impl}/{module}.py does not import)"
            continue
        if failing or (verify and not regions):
            origin[part] = (
                f"reference ({', '.join(failing) or 'no graded regions'} not passing yet)"
            )
            continue
        if verify:  # the file as it is now, which is what its checks just ran
            source = _load(module, impl, verify)
        chosen[part] = getattr(source, attribute)
        whose = "reference answers" if impl == "solutions" else "yours"
        origin[part] = f"{whose} ({impl}/{module}.py: {attribute})"
    return Parts(**chosen), origin


def origins(parts: Parts) -> dict[str, str]:
    """``{part: "module.name"}``: where each part of ``parts`` comes from (a learner's or the reference;
    ``"by device"`` for an attention left to ``Parts.attention``)."""
    return {
        f.name: (f"{value.__module__}.{value.__qualname__}" if value is not None else "by device")
        for f in fields(parts)
        for value in [getattr(parts, f.name)]
    }


def _load(module: str, impl: str, verify: bool):
    """The learner's module afresh; with ``verify`` a file that does not import is ``None`` (the part falls
    back), without it the import error is raised."""
    if verify:
        return exercise_module(module, impl)
    sys.modules.pop(f"{impl}.{module}", None)
    return importlib.import_module(f"{impl}.{module}")


def origin_table(origin: dict[str, str]) -> str:
    """One line per part: whose it is."""
    return "\n".join(f"  {part:<17} {where}" for part, where in origin.items())
