"""Launch configurations of the engine's Triton kernels, chosen per GPU from one table.

Every launch asks :func:`device_spec` what it runs on and takes its tile sizes, ``num_warps`` and
``num_stages`` from :func:`decode_config` / :func:`prefill_config`, and its split count from
:func:`choose_num_splits` with :func:`decode_slots`. The compile report (``python -m paged bench kernel
--compile``) runs the same launches with :data:`compile_target` set to each GPU of :data:`GPUS`, so what it
compiles for an A100 or an H200 is what those GPUs would run.

The table holds what the configs depend on: the SM count and shared memory per SM and per program
(opt-in), registers per SM and the most warps one SM holds. Sources: NVIDIA's A100 and H100 architecture
whitepapers (108 SMs on A100, 132 on H100 SXM5; H200 is the same GH100 chip with 132 SMs) and the CUDA
C++ Programming Guide's table of technical specifications per compute capability (8.0: 164 KB of shared
memory per SM, 163 KB per block; 9.0: 228 KB and 227 KB; both 64 K 32-bit registers and 64 warps per SM).
A GPU not in the table is described by ``torch.cuda.get_device_properties``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from ._triton import INTERPRET, triton

MAX_SPLITS = 32  # the heuristic never picks more (an int num_splits may)
# the interpreter has no SMs: the split rule pretends 4 (a fixed, small choice)
INTERPRETER_SLOTS = 4
KB = 1024


@dataclass(frozen=True)
class GpuSpec:
    """What a launch config needs to know about a GPU (bytes, counts; ``arch`` 80 for sm_80)."""

    name: str
    arch: int
    sms: int
    smem_per_sm: int
    smem_optin: int
    regs_per_sm: int = 64 * KB
    max_warps_per_sm: int = 64


GPUS = {
    "A100": GpuSpec("A100", 80, 108, 164 * KB, 163 * KB),
    "H100": GpuSpec("H100", 90, 132, 228 * KB, 227 * KB),
    "H200": GpuSpec("H200", 90, 132, 228 * KB, 227 * KB),
}
# the GPU every launch configures itself for in a compile-only process (the compile report's
# ``paged_course.bench.kernel_compile.compiling_for`` sets it); None: the tensors' own device
compile_target: GpuSpec | None = None


def device_spec(device: torch.device) -> GpuSpec | None:
    """The :class:`GpuSpec` of ``device``: the table's entry for a GPU it names (with the device's own SM
    count: an H100 PCIe has 114), the device's properties for another GPU, ``None`` in the interpreter."""
    if compile_target is not None:
        return compile_target
    if INTERPRET or device.type != "cuda":
        return None
    return _cuda_spec(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_spec(index: int) -> GpuSpec:
    props = torch.cuda.get_device_properties(index)
    arch = 10 * props.major + props.minor
    for key, spec in GPUS.items():
        if key in props.name and spec.arch == arch:
            return replace(spec, sms=props.multi_processor_count)
    return GpuSpec(
        props.name,
        arch,
        props.multi_processor_count,
        getattr(props, "shared_memory_per_multiprocessor", 100 * KB),
        getattr(props, "shared_memory_per_block_optin", 48 * KB),
        getattr(props, "regs_per_multiprocessor", 64 * KB),
        getattr(props, "max_threads_per_multi_processor", 2048) // 32,
    )


def decode_slots(spec: GpuSpec | None) -> int:
    """Decode programs the GPU runs at once, for the split rule: two per SM (4 warps each, at most
    about 96 KB of shared memory); :data:`INTERPRETER_SLOTS` in the interpreter."""
    return INTERPRETER_SLOTS if spec is None else 2 * spec.sms


def decode_config(head_dim: int, dtype: torch.dtype, spec: GpuSpec | None) -> dict:
    """Decode launch config (no autotuning): ``BLOCK_N`` so that one K+V tile stage is 32 KB (16..64
    tokens), 4 warps, 3 pipeline stages where the program's shared memory holds them (else 2); in the
    interpreter (``spec`` None) a fixed 64-token tile, 1 stage (pipelining and warps mean nothing there)."""
    if spec is None:
        return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    stage = 2 * triton.next_power_of_2(head_dim) * dtype.itemsize  # bytes of K + V per token
    block_n = max(16, min(64, 32768 // stage))
    return {
        "BLOCK_N": block_n,
        "num_warps": 4,
        "num_stages": 3 if spec.smem_optin >= 3 * block_n * stage + 32768 else 2,
    }


def prefill_config(head_dim: int, dtype: torch.dtype, spec: GpuSpec | None) -> dict:
    """Prefill launch config: tiles of ``BLOCK_M`` query by ``BLOCK_N`` KV tokens, 64 x 64 while a row of
    K is at most 256 bytes, else 32 x 32; 4 warps, 2 stages. Before sm_90 the tensor-core instruction
    (``mma.sync``) takes both operands from registers: at rows of 256 bytes (head dim 128 in fp16 / bf16)
    a 64 x 64 tile needs more than the 255 registers a thread has and spills (the compile report: 255
    registers and 16 bytes of stack on an A100), so there the KV tile is 32 tokens (188 registers, no
    spill); sm_90's ``wgmma`` reads them from shared memory (191 registers at 64 x 64). The interpreter
    pays per program and per tile whatever their size: 16, 1 stage, for tiny tests."""
    if spec is None:
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    row = max(16, triton.next_power_of_2(head_dim)) * dtype.itemsize  # bytes of one K row
    block = 64 if row <= 256 else 32
    block_n = 32 if spec.arch < 90 and row >= 256 else block
    return {"BLOCK_M": block, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2}


def choose_num_splits(
    num_programs: int, num_tiles: int, slots: int, max_splits: int = MAX_SPLITS
) -> int:
    """Split count for ``num_programs = num_seqs x num_kv_heads`` programs of ``num_tiles`` KV tiles each.

    FlashAttention 2's rule (``num_splits_heuristic`` in ``csrc/flash_attn/flash_api.cpp``, v2.8.3): no
    split once the programs fill 80% of the ``slots`` (programs the GPU runs
    at once); otherwise, among the split counts that shorten the longest split (``ceil(tiles / s)`` drops),
    the smallest whose wave efficiency ``w / ceil(w)``, ``w = num_programs * s / slots``, is within 85%
    of the best.
    """
    if num_programs >= 0.8 * slots or num_tiles <= 1:
        return 1
    counts = [
        s
        for s in range(1, min(max_splits, slots, num_tiles) + 1)
        if s == 1 or -(-num_tiles // s) < -(-num_tiles // (s - 1))
    ]
    efficiency = {s: num_programs * s / slots / math.ceil(num_programs * s / slots) for s in counts}
    return next(s for s in counts if efficiency[s] >= 0.85 * max(efficiency.values()))
