"""paged: vLLM's PagedAttention built from scratch, one readable module per idea.

Public names are imported lazily so that ``import paged.allocator`` stays light (no transformers).
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "paged.engine",
    "LLMEngine": "paged.engine",
    "SamplingParams": "paged.sequence",
    "RequestOutput": "paged.sequence",
    "CompletionOutput": "paged.sequence",
    "Sequence": "paged.sequence",
    "SequenceStatus": "paged.sequence",
    "BlockAllocator": "paged.allocator",
    "NoFreeBlocksError": "paged.allocator",
    "BlockTable": "paged.block_table",
    "BlockSpaceManager": "paged.block_manager",
    "AllocStatus": "paged.block_manager",
    "KVCache": "paged.kv_cache",
    "Scheduler": "paged.scheduler",
    "SchedulerOutputs": "paged.scheduler",
    "SchedulerConfig": "paged.config",
    "CacheConfig": "paged.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'paged' has no attribute {name!r}")
