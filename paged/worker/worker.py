"""The worker's side of start-up: how many KV blocks the pool gets, and the pool itself.

``init_kv_cache(model, config)`` sizes the device pool once and builds the ``KVCache``
(vLLM v1 ``Worker.determine_available_memory`` then ``initialize_from_config``, ``vllm/v1/worker/
gpu_worker.py``, 0.11.1; nano-vllm ``ModelRunner.allocate_kv_cache``). The number of blocks is, in order:

- ``cache.num_gpu_blocks`` when the user gave it;
- on CUDA without a byte budget, ``profile_num_blocks``: run the largest step the scheduler may issue
  through a scratch pool, read the peak of GPU memory, and give the pool
  ``total x gpu_memory_utilization - peak`` bytes;
- else a byte budget, ``kv_cache_memory_bytes`` (CPU default 256 MiB, then capped at what ``max_num_seqs``
  sequences of ``max_model_len`` tokens could use), divided by the bytes of one block.

The result is written into ``config.cache.num_gpu_blocks`` (the scheduler's pool size) and described in
one line (``LLM.sizing``, printed when ``verbose``).
"""

from __future__ import annotations

import torch

from paged.config import EngineConfig
from paged.core.block_table import blocks_needed
from paged.worker.attention import (
    AttentionBackend,
    AttentionMetadata,
    decode_attention,
    prefill_attention,
    use_paged_attention,
    write_kv,
)
from paged.worker.kv_cache import KVCache, block_bytes
from paged.worker.model_runner import forward_logits

DEFAULT_CPU_KV_BYTES = 256 * 2**20


def init_kv_cache(model, config: EngineConfig) -> tuple[KVCache, str]:
    """The device pool for ``model`` and a one-line description of its sizing; sets
    ``config.cache.num_gpu_blocks`` when it was ``None``. With CUDA graphs the pool holds one block more
    than the block manager owns: the padding rows' block.

    Raises:
        ValueError: a budget that holds no block, or (CUDA) no block fits beside the model's peak memory.
    """
    cache, sched, device = config.cache, config.scheduler, config.model.device
    dtype = config.model.dtype
    layers, kv_heads, head_dim = kv_shape(model)
    bytes_per_block = block_bytes(layers, kv_heads, head_dim, cache.block_size, dtype)
    how = "num_gpu_blocks"
    profile = device.type == "cuda" and cache.kv_cache_memory_bytes is None  # no byte budget given
    if cache.num_gpu_blocks is None and profile:
        cache.num_gpu_blocks, how = profile_num_blocks(model, config, bytes_per_block)
    elif cache.num_gpu_blocks is None:
        budget = cache.kv_cache_memory_bytes or DEFAULT_CPU_KV_BYTES
        num_gpu_blocks = budget // bytes_per_block
        if num_gpu_blocks <= 0:
            raise ValueError(
                f"kv_cache_memory_bytes={budget} holds no KV block of {bytes_per_block} bytes"
            )
        cap = sched.max_num_seqs * blocks_needed(sched.max_model_len, cache.block_size)
        how = f"budget {budget / 2**20:.4g} MiB"
        if cache.kv_cache_memory_bytes is None and num_gpu_blocks > cap:
            num_gpu_blocks = cap
            how += f", capped at {sched.max_num_seqs} seqs x {sched.max_model_len} tokens"
        cache.num_gpu_blocks = num_gpu_blocks
    num_blocks = cache.num_gpu_blocks
    kv_cache = KVCache(
        layers,
        num_blocks + (1 if config.model.cuda_graphs else 0),
        cache.block_size,
        kv_heads,
        head_dim,
        dtype,
        device,
        cache.num_cpu_blocks,
    )
    sizing = (
        f"KV cache: {num_blocks} blocks x {cache.block_size} tokens = {num_blocks * cache.block_size} "
        f"slots, {kv_cache.bytes / 2**20:.1f} MiB on {device} ({bytes_per_block} B/block: 2 x {layers} "
        f"layers x {kv_heads} KV heads x {head_dim} x {cache.block_size} x {dtype}; {how})"
        + (f"; CPU swap {cache.num_cpu_blocks} blocks" if cache.num_cpu_blocks else "")
    )
    return kv_cache, sizing


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
def profile_num_blocks(model, config: EngineConfig, bytes_per_block: int) -> tuple[int, str]:
    """GPU blocks of ``bytes_per_block`` (``init_kv_cache``'s, its one caller) that fit beside the
    model's peak activation memory (CUDA only).

    Runs one dummy forward of the scheduler's ``max_num_batched_tokens`` tokens split over up to
    ``max_num_seqs`` sequences through a 1-table-per-sequence scratch pool (the PyTorch attention), then
    returns ``(total x gpu_memory_utilization - peak bytes) // bytes_per_block`` and a one-line report.

    Raises:
        ValueError: no block fits (the message gives the numbers).
    """
    cache, tokens = config.cache, config.scheduler.max_num_batched_tokens
    device, block_size = config.model.device, cache.block_size
    layers, kv_heads, head_dim = kv_shape(model)
    num_seqs = max(1, min(config.scheduler.max_num_seqs, tokens))
    per_seq = max(2, tokens // num_seqs)  # >= 2 tokens: every sequence is a chunk
    blocks_per_seq = -(-per_seq // block_size)
    scratch = KVCache(
        layers,
        num_seqs * blocks_per_seq,
        block_size,
        kv_heads,
        head_dim,
        config.model.dtype,
        device,
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(num_seqs)]
    lens = [per_seq] * num_seqs
    meta = AttentionMetadata.build(
        tables, lens, lens, block_size, device, token_ids=[0] * sum(lens)
    )
    attention = AttentionBackend(scratch, write_kv, prefill_attention, decode_attention)
    use_paged_attention(model)
    forward_logits(model, meta, attention)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - scratch.bytes
    del scratch, meta
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    available = int(total * cache.gpu_memory_utilization) - peak
    num_blocks = available // bytes_per_block
    report = (
        f"GPU {total / 2**30:.1f} GiB x {cache.gpu_memory_utilization:.2f} - peak {peak / 2**30:.2f} GiB "
        f"(weights + activations) = {available / 2**30:.2f} GiB for KV -> {num_blocks} blocks of "
        f"{bytes_per_block / 2**10:.0f} KiB"
    )
    if num_blocks <= 0:
        raise ValueError(f"no KV block fits: {report}")
    return num_blocks, report
