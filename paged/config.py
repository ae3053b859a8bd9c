"""Scheduler and KV-cache settings, checked once when they are built.

``SchedulerConfig`` bounds one step (how many sequences, how many tokens) and names the preemption
mode; ``CacheConfig`` sizes the KV cache pool in blocks. The names and defaults follow vLLM's
``SchedulerConfig`` and ``CacheConfig`` (``vllm/config.py``); prefills here are never chunked, so a
whole prompt of ``max_model_len`` tokens must fit in one step's token budget.
"""

from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "swap")


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass
class SchedulerConfig:
    """Limits of one scheduling step.

    Args:
        max_num_seqs: most sequences in one step (a request with ``n`` samples counts ``n``).
        max_num_batched_tokens: most tokens computed in one step (prefill tokens + one per decode).
            Default: ``max(max_model_len, 2048)`` as in vLLM v0. Must be ``>= max_model_len``: prefills
            are not chunked here, so a prompt of ``max_model_len`` tokens has to fit in a single step.
        max_model_len: most tokens (prompt + generated) a sequence may hold; longer prompts are ignored.
        preemption_mode: ``"recompute"`` (free the victim's blocks, recompute its tokens later) or
            ``"swap"`` (move its blocks to the CPU pool; needs ``CacheConfig.num_cpu_blocks > 0``).

    Raises:
        ValueError: a non-positive size, ``max_num_batched_tokens`` below ``max_model_len`` or
            ``max_num_seqs``, or an unknown
            ``preemption_mode`` (the message names the parameter and the valid values).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 2048
    preemption_mode: str = "recompute"

    def __post_init__(self) -> None:
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_model_len", self.max_model_len)
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(self.max_model_len, 2048)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}): prefills are not chunked, so a whole prompt must fit in one step")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs}): a step decoding every running sequence needs one token each")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")


@dataclass
class CacheConfig:
    """Size and policy of the KV cache pool.

    Args:
        block_size: tokens per KV block (vLLM's default 16, PagedAttention paper §7.2).
        num_gpu_blocks: blocks in the device pool (``None`` until the engine has sized the pool; the
            scheduler refuses ``None``).
        num_cpu_blocks: blocks in the CPU swap pool (0: no swap space).
        watermark: fraction of the device pool that admission of new prefills keeps free
            (``int(watermark * num_gpu_blocks)`` blocks), so a new prompt does not leave running requests
            without room to grow (vLLM ``vllm/core/block_manager.py``); in ``[0, 1)``.
        enable_prefix_caching: reuse cached full blocks of identical prefixes (chapter 05).

    Raises:
        ValueError: ``block_size <= 0``, ``num_gpu_blocks <= 0``, ``num_cpu_blocks < 0`` or ``watermark``
            outside ``[0, 1)``.
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int = 0
    watermark: float = 0.01
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        _positive_int("block_size", self.block_size)
        if self.num_gpu_blocks is not None:
            _positive_int("num_gpu_blocks", self.num_gpu_blocks)
        if not isinstance(self.num_cpu_blocks, int) or self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be an int >= 0, got {self.num_cpu_blocks!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
