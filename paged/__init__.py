"""paged: PagedAttention (the vLLM paper, Kwon et al., SOSP 2023) built from scratch, one readable module per idea.

Public names are imported lazily so that ``import paged.core.allocator`` stays light (no transformers).
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "paged.engine",
    "LLMEngine": "paged.engine",
    "SamplingParams": "paged.core.sequence",
    "RequestOutput": "paged.core.sequence",
    "CompletionOutput": "paged.core.sequence",
    "Sequence": "paged.core.sequence",
    "SequenceStatus": "paged.core.sequence",
    "BlockAllocator": "paged.core.allocator",
    "NoFreeBlocksError": "paged.core.allocator",
    "BlockTable": "paged.core.block_table",
    "BlockSpaceManager": "paged.core.block_manager",
    "AllocStatus": "paged.core.block_manager",
    "KVCache": "paged.worker.kv_cache",
    "Scheduler": "paged.core.scheduler",
    "SchedulerOutputs": "paged.core.scheduler",
    "SchedulerConfig": "paged.config",
    "CacheConfig": "paged.config",
    "ModelConfig": "paged.config",
    "EngineConfig": "paged.config",
    "Parts": "paged.engine.parts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'paged' has no attribute {name!r}")
