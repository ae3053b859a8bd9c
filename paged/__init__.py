"""paged: PagedAttention (the vLLM paper, Kwon et al., SOSP 2023) built from scratch, one readable module per idea.

Public names are imported lazily so that ``import paged.core.allocator`` stays light (no transformers).
"""

from importlib import import_module

__version__ = "0.1.0"

# the public names, by the module each is imported from on first use
_EXPORTS = {
    "paged.engine": ("LLM", "LLMEngine"),
    "paged.core.sequence": (
        "SamplingParams",
        "RequestOutput",
        "CompletionOutput",
        "Sequence",
        "SequenceStatus",
    ),
    "paged.core.allocator": ("BlockAllocator", "NoFreeBlocksError"),
    "paged.core.block_table": ("BlockTable",),
    "paged.core.block_manager": ("BlockSpaceManager", "AllocStatus"),
    "paged.worker.kv_cache": ("KVCache",),
    "paged.core.scheduler": ("Scheduler", "SchedulerOutputs"),
    "paged.config": ("SchedulerConfig", "CacheConfig", "ModelConfig", "EngineConfig"),
    "paged.engine.parts": ("Parts",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'paged' has no attribute {name!r}")
