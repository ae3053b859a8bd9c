"""Scheduler and KV-cache settings, checked once when they are built.

``SchedulerConfig`` bounds one step (how many sequences, how many tokens), turns chunked prefill on or
off and names the preemption mode; ``CacheConfig`` sizes the KV cache pool in blocks. The names and
defaults follow vLLM's ``SchedulerConfig`` and ``CacheConfig`` (``vllm/config/scheduler.py``,
``vllm/config/cache.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "swap")


def _positive_int(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


@dataclass
class SchedulerConfig:
    """Limits of one scheduling step.

    Args:
        max_num_seqs: most sequences running at once (a request with ``n`` samples counts ``n``).
        max_num_batched_tokens: the step's token budget: prefill-chunk tokens + one per decode. Default
            2048 with chunked prefill, else ``max(max_model_len, 2048)`` (vLLM v0's default).
        max_model_len: most tokens (prompt + generated) a sequence may hold; longer prompts are ignored.
        preemption_mode: ``"recompute"`` (free the victim's blocks, recompute its tokens later) or
            ``"swap"`` (move its blocks to the CPU pool; needs ``CacheConfig.num_cpu_blocks > 0``).
        enable_chunked_prefill: cut prompts into chunks that fit the token budget (vLLM v1, on by
            default). Off: a whole prompt must fit in one step, so the budget must be ``>= max_model_len``.
        long_prefill_token_threshold: when > 0, the most tokens one prompt computes in one step, so that a
            long prompt leaves budget to others (vLLM's ``long_prefill_token_threshold``); 0 = no cap. It cuts
            prompts, so it needs ``enable_chunked_prefill``.

    Raises:
        ValueError: a non-positive size, a budget below ``max_num_seqs`` (each running sequence needs one
            token per step: vLLM's rule) or, without chunking, below ``max_model_len``, a negative
            threshold or one without chunking, or an unknown ``preemption_mode`` (the message names the
            parameter and values).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 2048
    preemption_mode: str = "recompute"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_model_len", self.max_model_len)
        _positive_int("long_prefill_token_threshold", self.long_prefill_token_threshold, minimum=0)
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (
                2048 if self.enable_chunked_prefill else max(self.max_model_len, 2048)
            )
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
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
        block_size: tokens per KV block (vLLM's default 16, PagedAttention paper §7.2).
        num_gpu_blocks: blocks in the device pool (``None`` until the engine has sized the pool; the
            scheduler refuses ``None``).
        num_cpu_blocks: blocks in the CPU swap pool (0: no swap space).
        watermark: fraction of the device pool that admission of new requests keeps free
            (``int(watermark * num_gpu_blocks)`` blocks), so a new prompt does not leave running requests
            without room to grow (vLLM v0 ``vllm/core/block_manager.py``); in ``[0, 1)``.
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
        _positive_int("num_cpu_blocks", self.num_cpu_blocks, minimum=0)
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
