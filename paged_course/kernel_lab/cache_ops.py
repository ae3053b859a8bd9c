r"""Write the new tokens' keys and values into the paged KV cache pool (vLLM's ``reshape_and_cache``).

Math. Token ``i`` has a slot ``slot_mapping[i] = block_table[p // B] * B + p % B`` (its position ``p``
in its sequence, block size ``B``), computed by the block manager. The kernel stores

    key_cache[slot // B, slot % B, :, :] = key[i]        value_cache[slot // B, slot % B, :, :] = value[i]

and skips tokens whose slot is ``-1`` (padding tokens that own no slot). One program per token copies
all its KV heads. Shapes: ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]``; caches
``[num_blocks, block_size, num_kv_heads, head_dim]`` (the KV pool layout of ``paged.worker.kv_cache``);
``slot_mapping`` int32/int64 ``[num_tokens]``.

Source: vLLM ``csrc/cache_kernels.cu`` (``reshape_and_cache`` / ``reshape_and_cache_flash``) and the
paper's fused "reshape and block write" (Kwon et al. 2023, section 5.1).
"""

from __future__ import annotations

import torch

from paged.kernels._triton import jit, kernel_device, require_triton, tl, triton
from paged.kernels.decode_inputs import FLOAT_DTYPES, INDEX_DTYPES


@jit
def _reshape_and_cache_kernel(
    KEY,
    VALUE,
    K_CACHE,
    V_CACHE,
    SLOTS,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_kc_block,
    stride_kc_tok,
    stride_kc_head,
    stride_vc_block,
    stride_vc_tok,
    stride_vc_head,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(SLOTS + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HEADS_P2)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    slot_ok = (
        offs_h[:, None] * 0 + slot
    ) >= 0  # slot -1: skip (as a tile: the interpreter wants tile masks)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM) & slot_ok
    k = tl.load(
        KEY + token * stride_key_tok + offs_h[:, None] * stride_key_head + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    v = tl.load(
        VALUE + token * stride_value_tok + offs_h[:, None] * stride_value_head + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    tl.store(
        K_CACHE
        + block * stride_kc_block
        + offset * stride_kc_tok
        + offs_h[:, None] * stride_kc_head
        + offs_d[None, :],
        k,
        mask=mask,
    )
    tl.store(
        V_CACHE
        + block * stride_vc_block
        + offset * stride_vc_tok
        + offs_h[:, None] * stride_vc_head
        + offs_d[None, :],
        v,
        mask=mask,
    )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key[i]``, ``value[i]`` at slot ``slot_mapping[i]`` of the caches, in place; slot -1 is skipped.

    Raises ValueError (with the numbers) for mismatched shapes or dtypes (keys must already have the
    cache's dtype), a slot outside ``[-1, num_blocks * block_size)``, or two tokens mapped to one slot;
    the caches are untouched when it raises. Raises TritonUnavailableError without Triton.
    """
    require_triton()
    if key.dim() != 3 or value.shape != key.shape:
        raise ValueError(
            f"key and value must both be [num_tokens, num_kv_heads, head_dim], got "
            f"{tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    num_tokens, num_kv_heads, head_dim = key.shape
    num_blocks, block_size, cache_heads, cache_dim = key_cache.shape
    if (num_kv_heads, head_dim) != (cache_heads, cache_dim):
        raise ValueError(
            f"key has {num_kv_heads} KV heads x head_dim {head_dim}, the cache {cache_heads} x "
            f"{cache_dim}"
        )
    if (
        key.dtype not in FLOAT_DTYPES
        or not key.dtype == value.dtype == key_cache.dtype == value_cache.dtype
    ):
        raise ValueError(
            f"key/value/key_cache/value_cache dtypes must be one float dtype, got {key.dtype}, "
            f"{value.dtype}, {key_cache.dtype}, {value_cache.dtype}"
        )
    if (
        slot_mapping.dim() != 1
        or slot_mapping.dtype not in INDEX_DTYPES
        or slot_mapping.shape[0] != num_tokens
    ):
        raise ValueError(
            f"slot_mapping must be int32/int64 [num_tokens={num_tokens}], got {slot_mapping.dtype} "
            f"of shape {tuple(slot_mapping.shape)}"
        )
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache must be contiguous in head_dim (stride 1)")
    kernel_device(key, value, key_cache, value_cache, slot_mapping)
    if num_tokens == 0:
        return
    capacity = num_blocks * block_size
    slots = slot_mapping.long()
    lo, hi = int(slots.min()), int(slots.max())
    if lo < -1 or hi >= capacity:
        raise ValueError(
            f"slot_mapping values must be in [-1, {capacity}) ({num_blocks} blocks x {block_size}), "
            f"got min {lo}, max {hi}"
        )
    valid = slots[slots >= 0]
    if valid.unique().numel() != valid.numel():
        raise ValueError(
            f"slot_mapping maps {valid.numel()} tokens to only {valid.unique().numel()} distinct slots"
        )
    key, value, slot_mapping = key.contiguous(), value.contiguous(), slot_mapping.contiguous()
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        BLOCK_SIZE=block_size,
        NUM_KV_HEADS=num_kv_heads,
        HEADS_P2=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=triton.next_power_of_2(head_dim),
    )
