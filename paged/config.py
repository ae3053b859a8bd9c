"""The engine's settings, checked once when they are built: one ``EngineConfig`` passed whole.

``EngineConfig`` has three sections, as vLLM's ``VllmConfig`` (v1, ``vllm/config/vllm.py``, 0.11.1):
``ModelConfig`` (device, dtype, the model's positions, the sampler's seed, CUDA graphs or eager),
``CacheConfig`` (block size, pool sizes or the memory budget they are sized from, watermark, prefix
caching) and ``SchedulerConfig`` (how many sequences and tokens one step holds, chunked prefill, the
preemption mode). ``LLM`` builds it from its keyword arguments; the engine, the scheduler and the worker
read it and check nothing again. Names and defaults follow vLLM v1's (``vllm/config/model.py``,
``vllm/config/cache.py``, ``vllm/config/scheduler.py``, 0.11.1).

The engine and the model runner receive the whole ``EngineConfig``; the ``Scheduler`` receives only its
two sections (``Scheduler(scheduler_config, cache_config, ...)``), the signature chapter 06's learners
subclass and its graded tests build.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

PREEMPTION_MODES = ("recompute", "swap")


def check_int(name: str, value, minimum: int = 1) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int (not a bool) ``>= minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def section(cls, settings: dict):
    """The config section ``cls`` built from the entries of ``settings`` named as its fields: how
    ``LLM(...)``'s keyword arguments reach ``CacheConfig`` and ``SchedulerConfig``, routed once."""
    return cls(**{f.name: settings[f.name] for f in fields(cls) if f.name in settings})


@dataclass
class SchedulerConfig:
    """Limits of one scheduling step.

    Args:
        max_num_seqs: most sequences running at once (a request with ``n`` samples counts ``n``).
        max_num_batched_tokens: the step's token budget: prefill-chunk tokens + one per decode. Default
            2048 with chunked prefill, else ``max(max_model_len, 2048)`` (vLLM v0's default,
            ``SchedulerConfig`` in ``vllm/config/scheduler.py``, 0.10.2).
        max_model_len: most tokens (prompt + generated) a sequence may hold; longer prompts are ignored.
        preemption_mode: ``"recompute"`` (free the victim's blocks, recompute its tokens later) or
            ``"swap"`` (move its blocks to the CPU pool; needs ``CacheConfig.num_cpu_blocks > 0``).
        enable_chunked_prefill: cut prompts into chunks that fit the token budget (vLLM v1, on by
            default: ``vllm/engine/arg_utils.py``, 0.10.2). Off: a whole prompt must fit in one step, so the
            budget must be ``>= max_model_len``.
        long_prefill_token_threshold: when > 0, the most tokens one prompt computes in one step, so that a
            long prompt leaves budget to others (vLLM v1's ``long_prefill_token_threshold``, 0.10.2); 0 = no
            cap. It cuts prompts, so it needs ``enable_chunked_prefill``.

    Raises:
        ValueError: a non-positive size, a budget below ``max_num_seqs`` (each running sequence needs one
            token per step: vLLM v0 and v1, ``vllm/config/scheduler.py``, 0.10.2) or, without chunking, below
            ``max_model_len``, a negative threshold or one without chunking, or an unknown ``preemption_mode``
            (the message names the parameter and values).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 2048
    preemption_mode: str = "recompute"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        check_int("max_num_seqs", self.max_num_seqs)
        check_int("max_model_len", self.max_model_len)
        check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, minimum=0)
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (
                2048 if self.enable_chunked_prefill else max(self.max_model_len, 2048)
            )
        check_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) when prefills are not chunked: a whole prompt must fit in one step "
                "(or set enable_chunked_prefill=True)"
            )
        if not self.enable_chunked_prefill and self.long_prefill_token_threshold:
            raise ValueError(
                f"long_prefill_token_threshold={self.long_prefill_token_threshold} cuts prompts into "
                "chunks, so it needs enable_chunked_prefill=True (without chunking a prompt is never cut)"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): a step decoding every running sequence needs one token each"
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )


@dataclass
class CacheConfig:
    """Size and policy of the KV cache pool.

    Args:
        block_size: tokens per KV block (vLLM's default 16 on CUDA, v0 and v1:
            ``vllm/platforms/cuda.py``, 0.10.2; PagedAttention paper §7.2).
        num_gpu_blocks: blocks in the device pool (``None`` until the engine has sized the pool; the
            scheduler refuses ``None``).
        num_cpu_blocks: blocks in the CPU swap pool (0: no swap space).
        watermark: fraction of the device pool that admission of new requests keeps free
            (``int(watermark * num_gpu_blocks)`` blocks), so a new prompt does not leave running requests
            without room to grow (vLLM v0 ``vllm/core/block_manager.py``, 0.10.2); in ``[0, 1)``.
        enable_prefix_caching: reuse cached full blocks of identical prefixes (chapter 05).
        kv_cache_memory_bytes: the KV budget in bytes the worker sizes the pool from when
            ``num_gpu_blocks`` is ``None`` (``paged/worker/worker.py``; CPU default 256 MiB).
        gpu_memory_utilization: CUDA, without a byte budget: the fraction of GPU memory for weights,
            activations and KV, in ``(0, 1]`` (vLLM v0 and v1 ``gpu_memory_utilization``,
            default 0.9: ``vllm/config/cache.py``, 0.10.2).

    Raises:
        ValueError: ``block_size <= 0``, ``num_gpu_blocks <= 0``, ``num_cpu_blocks < 0``, ``watermark``
            outside ``[0, 1)``, ``kv_cache_memory_bytes <= 0`` or ``gpu_memory_utilization`` outside
            ``(0, 1]``.
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int = 0
    watermark: float = 0.01
    enable_prefix_caching: bool = False
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size)
        if self.num_gpu_blocks is not None:
            check_int("num_gpu_blocks", self.num_gpu_blocks)
        check_int("num_cpu_blocks", self.num_cpu_blocks, minimum=0)
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
        if isinstance(self.kv_cache_memory_bytes, float):  # 0.5 * 2**30: whole bytes
            self.kv_cache_memory_bytes = int(self.kv_cache_memory_bytes)
        if self.kv_cache_memory_bytes is not None:
            check_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@dataclass
class ModelConfig:
    """Where and how the model runs.

    Args:
        device: the resolved device (``paged.engine.model_loader.resolve_device``).
        dtype: model and KV cache dtype.
        max_position_embeddings: the model's position limit; ``max_model_len`` may not exceed it.
        seed: seed of the sampler's shared generator (requests without a ``seed`` of their own).
        enforce_eager: CUDA only: ``False`` captures decode steps as CUDA graphs, ``True`` runs eagerly.
        cuda_graphs: ``None`` (default): on CUDA unless ``enforce_eager``; ``True`` forces the padded
            decode path (on CPU it runs eagerly: the tests' way to check it without a GPU).
    """

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    max_position_embeddings: int = 2048
    seed: int | None = 0
    enforce_eager: bool = False
    cuda_graphs: bool | None = None

    def __post_init__(self) -> None:
        check_int("max_position_embeddings", self.max_position_embeddings)
        if self.cuda_graphs is None:
            self.cuda_graphs = self.device.type == "cuda" and not self.enforce_eager


@dataclass
class EngineConfig:
    """Every setting of one engine, in three sections (vLLM v1's ``VllmConfig``, 0.11.1), checked together once.

    Args:
        model, cache, scheduler: the sections above.
        profile: time each step phase (the device synced after each) and keep a per-step history.

    Raises:
        ValueError: ``max_model_len`` over the model's positions, or swap preemption without CPU blocks.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    profile: bool = False

    def __post_init__(self) -> None:
        positions = self.model.max_position_embeddings
        if self.scheduler.max_model_len > positions:
            raise ValueError(
                f"max_model_len={self.scheduler.max_model_len} exceeds the model's {positions} positions"
            )
        if self.scheduler.preemption_mode == "swap" and self.cache.num_cpu_blocks <= 0:
            raise ValueError(
                "preemption_mode='swap' needs num_cpu_blocks > 0, "
                f"got {self.cache.num_cpu_blocks}; use 'recompute' or give CPU blocks"
            )
