"""The KV cache pool: one preallocated tensor that holds every layer's keys and values, in blocks.

Layout of the device pool (``KVCache.kv``)::

    [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
                 ^ 0 = key, 1 = value

so that, per layer, ``key_cache[layer]`` and ``value_cache[layer]`` are views of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``: the "NHD" layout of vLLM v1's FlashAttention
backend (``vllm/v1/attention/backends/flash_attn.py``, 0.10.2, per layer ``[2, num_blocks, block_size,
num_kv_heads, head_dim]``), FlashAttention's ``flash_attn_with_kvcache`` and FlashInfer. Each token's
``head_dim`` vector per head is contiguous, and one block of one layer is one contiguous chunk of
``block_size * num_kv_heads * head_dim`` elements. A physical block id means the same slots in every
layer: one block table per sequence serves all layers (seed error E6).

The pool is the tensor side only; which block belongs to whom is the block manager's business
(``paged/core/block_manager.py``). The operations mirror vLLM's (0.10.2):

- writing this step's K/V to their slots (``slot = block_id * block_size + offset``) is the attention
  backend's job (``paged/worker/attention.py``, ``write_kv``; vLLM v1's ``reshape_and_cache_flash``);
- ``copy_blocks``: copy-on-write copies, all pairs and all layers in one batched op (vLLM v0
  ``CacheEngine.copy``, ``vllm/worker/cache_engine.py``).
- ``swap_out`` / ``swap_in``: move blocks to and from a CPU pool in pinned memory (vLLM v0
  ``CacheEngine.swap_out`` / ``swap_in``, one copy per block).

Sizing from a memory budget: ``budget // block_bytes(...)`` whole blocks (vLLM profiles free GPU memory
and divides by the bytes of one block: v0 ``CacheEngine.get_cache_block_size``, ``vllm/worker/cache_engine.py``;
v1 ``get_num_blocks``, ``vllm/v1/core/kv_cache_utils.py``; both 0.10.2).
"""

from __future__ import annotations

import torch

from paged.config import check_int


def block_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> int:
    """Bytes of one KV block over all layers, K and V: ``2 x layers x kv_heads x head_dim x block_size x
    dtype bytes`` (vLLM v0 ``CacheEngine.get_cache_block_size``, ``vllm/worker/cache_engine.py``, 0.10.2;
    seed error E8 corrected)."""
    return 2 * num_layers * num_kv_heads * head_dim * block_size * dtype.itemsize


class KVCache:
    """Preallocated paged K/V storage for all layers, plus an optional CPU pool for swapping.

    Args:
        num_layers: decoder layers, > 0.
        num_blocks: blocks in the device pool, > 0.
        block_size: tokens per block, > 0.
        num_kv_heads: key/value heads per layer (GQA: fewer than query heads), > 0.
        head_dim: elements per head vector, > 0.
        dtype: element type (``torch.float32``, ``float16``, ``bfloat16``).
        device: where the pool lives (``"cpu"`` or ``"cuda"``).
        num_cpu_blocks: blocks in the CPU swap pool, >= 0 (pinned memory when ``device`` is CUDA).

    Attributes:
        kv: the device pool ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``, zeroed.
        cpu_kv: the CPU pool ``[num_layers, 2, num_cpu_blocks, block_size, num_kv_heads, head_dim]``.
        key_cache, value_cache: lists with one view per layer, ``[num_blocks, block_size, kv_heads, D]``.

    Raises:
        ValueError: a size that is not a positive integer (``num_cpu_blocks`` may be 0).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        num_cpu_blocks: int = 0,
    ):
        for name, value in (
            ("num_layers", num_layers),
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            check_int(name, value)
        check_int("num_cpu_blocks", num_cpu_blocks, minimum=0)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.device = torch.device(device)
        self.num_cpu_blocks = num_cpu_blocks
        block = (block_size, num_kv_heads, head_dim)
        self.kv = torch.zeros((num_layers, 2, num_blocks, *block), dtype=dtype, device=self.device)
        pin = self.device.type == "cuda"  # pinned host memory: DMA transfers, async with the GPU
        self.cpu_kv = torch.zeros(
            (num_layers, 2, num_cpu_blocks, *block), dtype=dtype, pin_memory=pin
        )
        self.key_cache = [self.kv[layer, 0] for layer in range(num_layers)]
        self.value_cache = [self.kv[layer, 1] for layer in range(num_layers)]

    @property
    def bytes(self) -> int:
        """Bytes of the device pool (``num_blocks`` x ``block_bytes(...)``)."""
        return self.kv.numel() * self.kv.element_size()

    # ---- block copies -----------------------------------------------------------------------------
    def _check_pairs(
        self, pairs, num_src: int, num_dst: int, what: str
    ) -> tuple[list[int], list[int]]:
        src = [int(s) for s, _ in pairs]
        dst = [int(d) for _, d in pairs]
        for ids, n, side in ((src, num_src, "source"), (dst, num_dst, "destination")):
            bad = [b for b in ids if not 0 <= b < n]
            if bad:
                raise ValueError(f"{what}: {side} block {bad[0]} outside [0, {n})")
        if len(set(dst)) != len(dst):
            raise ValueError(f"{what}: a destination block appears twice in {list(zip(src, dst))}")
        return src, dst

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: for each ``(src, dst)``, copy block ``src`` to block ``dst``, in every layer, K and V.

        One gather + scatter over the whole ``[layers, 2, blocks, ...]`` pool for all pairs at once
        (vLLM v0 fuses this into one ``copy_blocks`` kernel launch: ``CacheEngine.copy``,
        ``vllm/worker/cache_engine.py``, and ``vllm/attention/backends/flash_attn.py``, 0.10.2).

        Raises:
            ValueError: a block id outside ``[0, num_blocks)``, a repeated destination, or a block that is
                both a source and a destination (the result would depend on the order). Pool unchanged.
        """
        src, dst = self._check_pairs(pairs, self.num_blocks, self.num_blocks, "copy_blocks")
        if set(src) & set(dst):
            raise ValueError(
                f"copy_blocks: blocks {sorted(set(src) & set(dst))} are both source and destination"
            )
        if not src:
            return
        src_t = torch.tensor(src, device=self.device)
        dst_t = torch.tensor(dst, device=self.device)
        self.kv[:, :, dst_t] = self.kv[:, :, src_t]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to the CPU pool: ``(device_block, cpu_block)`` pairs, all layers, K and V.

        One copy per block (as vLLM v0's ``swap_blocks``, ``vllm/attention/backends/flash_attn.py``, 0.10.2):
        on CUDA each is an async DMA into pinned memory, and the call waits for them before returning. Raises
        ``ValueError`` for an id out of range or a repeated destination (pools unchanged).
        """
        src, dst = self._check_pairs(pairs, self.num_blocks, self.num_cpu_blocks, "swap_out")
        self._copy_each(self.kv, self.cpu_kv, src, dst)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy CPU-pool blocks back to the device: ``(cpu_block, device_block)`` pairs. Errors as ``swap_out``."""
        src, dst = self._check_pairs(pairs, self.num_cpu_blocks, self.num_blocks, "swap_in")
        self._copy_each(self.cpu_kv, self.kv, src, dst)

    def _copy_each(
        self, source: torch.Tensor, target: torch.Tensor, src: list[int], dst: list[int]
    ) -> None:
        non_blocking = self.device.type == "cuda"
        for s, d in zip(src, dst):
            target[:, :, d].copy_(source[:, :, s], non_blocking=non_blocking)
        if non_blocking:
            torch.cuda.current_stream(self.device).synchronize()
