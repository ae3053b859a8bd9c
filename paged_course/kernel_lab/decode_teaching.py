r"""The teaching paged-attention decode kernel (chapter 04, first half): one block per loop step, no ``tl.dot``.

This is the kernel written to be read, and it is the one a learner completes in chapter 04: the kernel is
``_decode_kernel`` of ``ex04_online_softmax.py``, and its loop, ``walk_blocks``, is the region ch04.ex2. So that
the answer sits in one place only, this module holds no copy of it. It launches the kernel from the course's
reference answers (``solutions/``) where the course has them, and from the learner's own file
(``exercises/``) in a student release, which ships no answers: there the teaching kernel is the learner's,
correct once ch04.ex2 passes its checks (before that its loop is empty and it returns zeros). It is correct and
slow: on an H200 it reached 11.5% of the HBM bandwidth at batch 64, context 4,096 (the committed run of
``docs/gpu/h200-2026-11-30/kernel.json``). The engine runs the tuned kernel
:func:`paged.kernels.paged_attention_decode`; chapter 04's second half goes from this one to that one.

Math. For query head :math:`h` of sequence :math:`s` with context length :math:`L` and scale :math:`c`
(default :math:`1/\sqrt{d}`),

.. math:: o_h = \sum_{t<L} \frac{e^{c\,q_h\cdot k_t - m}}{\sum_{u<L} e^{c\,q_h\cdot k_u - m}}\, v_t,
   \qquad k_t = K[\mathrm{bt}[t \,//\, B],\ t \bmod B,\ g(h)],

where :math:`B` is the block size, ``bt`` the sequence's block table and :math:`g(h) = h // (H/H_{kv})`
the KV head that query head :math:`h` reads (GQA). The kernel walks the blocks in order with the online
softmax (a running max, denominator and weighted sum of values; chapter 04, section 2) and divides at the
end; nothing of size :math:`L` is ever stored. One program per (sequence, KV head[, split]) serves every
query head of that KV head's group, so each K/V block is read from memory once per group.

Split-K (flash-decoding, ``num_splits > 1``): the table's width is cut into ``num_splits`` ranges of blocks,
one program each, which writes its partial output and its log-sum-exp; the engine's merge kernel
(``paged.kernels.split_merge.launch_merge_splits``) combines them, a split holding no token weighing 0.

Sources: vLLM ``csrc/attention/attention_kernels.cu`` (``paged_attention_v1`` / ``paged_attention_v2``:
the same per-block walk, v2 being the split version with a reduce kernel); Dao et al., "Flash-Decoding
for long-context inference" (2023).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch

from paged.kernels._triton import require_triton, triton
from paged.kernels.decode_inputs import validate_decode_inputs
from paged.kernels.split_merge import launch_merge_splits

#: Where the teaching kernel comes from, in order: the reference answers, else the learner's file.
PACKAGES = ("solutions", "exercises")


@functools.cache
def kernel_module() -> ModuleType:
    """``ex04_online_softmax`` of the first package of :data:`PACKAGES` that this copy of the course has.

    Raises ModuleNotFoundError when neither is importable (run from outside the course's root).
    """
    for package in PACKAGES:
        try:
            return importlib.import_module(f"{package}.ex04_online_softmax")
        except ModuleNotFoundError as err:
            if err.name != package:
                raise
    raise ModuleNotFoundError(
        "the teaching kernel lives in ex04_online_softmax.py of solutions/ or exercises/; neither "
        "package is importable here (run from the course's root)"
    )


def _num_warps(tile_elements: int) -> int:
    """Fixed launch config (no autotuning): more warps for bigger [group, block, head_dim] tiles."""
    return 4 if tile_elements <= 8192 else 8


def launch_teaching_decode(
    query, key_cache, value_cache, block_tables, context_lens, scale=None, num_splits=1
) -> torch.Tensor:
    """:func:`teaching_decode` without input validation (no checks, no host sync), for timed loops.

    ``num_splits=None`` means 1 here (this kernel has no split heuristic).
    """
    kernel = kernel_module()
    num_splits = num_splits or 1
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    warps = _num_warps(
        triton.next_power_of_2(num_heads // num_kv_heads)
        * block_size
        * triton.next_power_of_2(head_dim)
    )
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    if num_splits == 1:
        kernel._launch(
            query, key_cache, value_cache, block_tables, context_lens, scale, 1, out, None, warps
        )
        return out
    part = torch.empty(
        num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
    )
    lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    kernel._launch(
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        scale,
        num_splits,
        part,
        lse,
        warps,
    )
    return launch_merge_splits(
        part, lse, out
    )  # the engine's merge kernel, shared with the tuned one


def teaching_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int = 1,
) -> torch.Tensor:
    """Decode attention over a paged KV cache with the teaching kernel (Triton; the interpreter on CPU).

    Same arguments, result and errors as :func:`paged.kernels.paged_attention_decode` (whose
    ``validate_decode_inputs`` it calls): ``query`` ``[num_seqs, num_heads, head_dim]`` fp16 / bf16 / fp32,
    pools ``[num_blocks, block_size, num_kv_heads, head_dim]`` with the same strides, int32 ``block_tables``
    ``[num_seqs, max_blocks_per_seq]`` and ``context_lens`` ``[num_seqs]``; returns
    ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype, accumulated in fp32. ``num_splits > 1`` cuts
    the table width into that many ranges of blocks (split-K). Raises ValueError (with the numbers) for
    bad inputs, including pools of different strides, and :class:`~paged.kernels.TritonUnavailableError`
    without Triton.
    """
    require_triton()
    validate_decode_inputs(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    if key_cache.stride() != value_cache.stride():
        raise ValueError(
            f"key_cache and value_cache must have the same strides, got {key_cache.stride()} and "
            f"{value_cache.stride()}"
        )
    return launch_teaching_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )


__all__ = ["PACKAGES", "kernel_module", "launch_teaching_decode", "teaching_decode"]
