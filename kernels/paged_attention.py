r"""Paged-attention decode in Triton, tuned for bandwidth: one query token per sequence, K/V through a block table.

Math. For query head :math:`h` of sequence :math:`s` with context length :math:`L` and scale :math:`c`
(default :math:`1/\sqrt{d}`), with :math:`B` the block size, ``bt`` the sequence's block table and
:math:`g(h) = h // (H/H_{kv})` the KV head that query head :math:`h` reads (GQA),

.. math:: o_h = \sum_{t<L} \frac{e^{c\,q_h\cdot k_t}}{\sum_{u<L} e^{c\,q_h\cdot k_u}}\, v_t,
   \qquad k_t = K[\mathrm{bt}[t \,//\, B],\ t \bmod B,\ g(h)].

Decode reads every cached K and V byte once and does about 4 flops per byte per query head of the group:
far below what a GPU can compute per byte it loads, so the kernel's speed is the speed at which it
streams K and V from memory. Four ideas get it there (chapter 04's performance lab, one step each):

1. **The GQA group in ``tl.dot``'s M dimension.** One program per (sequence, KV head[, split]) serves the
   ``G = H / H_kv`` query heads that share the KV head: their queries are the rows of a ``[BLOCK_M, D]``
   tile (``BLOCK_M = max(16, next_pow2(G))``, padded rows masked), so scores ``S = Q K^T`` and the update
   ``P V`` are two tensor-core matrix products, and each K/V byte is read once per KV head.
2. **KV tiles of ``BLOCK_N`` tokens, independent of the block size.** Tile ``j`` covers token positions
   ``t = j*BLOCK_N + n``; each position gathers its own physical block ``bt[t // B]`` and slot ``t % B``,
   so a tile spans several blocks (``BLOCK_N > B``) or part of one (``BLOCK_N < B``).
3. **Software pipelining** (``num_stages`` on the GPU): the loads of the next tiles are issued while the
   current one is computed.
4. **Split-K with a chosen split count.** ``num_splits=None`` applies :func:`choose_num_splits` (the rule of
   FlashAttention-3's ``num_splits_heuristic``): each sequence's tiles are cut into that many contiguous
   ranges, one program each, which write a partial output and its log-sum-exp; ``_merge_splits_kernel``
   combines them (:math:`w_i = e^{\mathrm{lse}_i - \max\mathrm{lse}}`, :math:`o = \sum w_i o_i / \sum w_i`).
   A split with no token has :math:`\mathrm{lse} = -\infty`, weight 0: it merges as a no-op.

Online softmax per tile, in base 2 (:math:`e^x = 2^{x \log_2 e}`, the scale folded in): with scores
:math:`s` of the tile, :math:`m' = \max(m, \max s)`, :math:`\alpha = 2^{m-m'}`, :math:`p = 2^{s-m'}`,
:math:`\ell' = \alpha\ell + \sum p`, :math:`a' = \alpha a + p V`; at the end :math:`o = a/\ell`.

Precision. ``tl.dot`` takes fp16/bf16 operands with fp32 accumulation (the scores
never overflow fp16); ``p`` is cast to the value dtype for the second product, as FlashAttention does. fp32 inputs use
``input_precision="ieee"`` (no TF32). In Triton's interpreter (CPU) bf16 ``tl.dot`` multiplies raw bit
patterns (Triton issue 11584), so there :func:`launch_decode` upcasts bf16 inputs to fp32 first (and the
output back); bf16 is tested on a GPU only. Every masked load names its fill (``other=``): what sits past a
context (NaN, inf, stale data) never reaches the output. Every ``tl.dot`` dimension is >= 16 in the launches
below (the GPU needs it; the interpreter would accept less).

Sources: vLLM ``vllm/v1/attention/ops/triton_unified_attention.py`` (tiles independent of the page size,
each key position looking up its block; the group in the M rows); SGLang's grouped decode
(``decode_attention.py``: head group in ``tl.dot``, split stages, log-sum-exp merge); Dao et al.,
"Flash-Decoding for long-context inference" (2023); FlashAttention-3's split heuristic. Written from the
math above, not copied.
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature (and O the output)
from __future__ import annotations

import functools
import math

import torch

from ._triton import INTERPRET, jit, kernel_device, require_triton, tl, triton

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256
MAX_SPLITS = 32  # the heuristic never picks more (an int num_splits may)
INTERPRETER_SLOTS = (
    4  # the interpreter has no SMs: the heuristic pretends 4 (a fixed, small choice)
)


@jit
def _decode_kernel(
    Q,
    K,
    V,
    BT,
    CL,
    O,
    LSE,
    qk_scale,
    num_splits,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    stride_o_split,
    stride_lse_seq,
    stride_lse_head,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
    PRECISION: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = tl.arange(
        0, BLOCK_M
    )  # rows: the query heads of this KV head's group (padded to >= 16)
    offs_n = tl.arange(0, BLOCK_N)  # token positions inside one KV tile
    offs_d = tl.arange(0, HEAD_DIM_P2)
    m_mask, d_mask = offs_m < GROUP, offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_m
    q = tl.load(
        Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    context_len = tl.load(CL + seq).to(tl.int32)
    num_tiles = tl.cdiv(context_len, BLOCK_N)
    per_split = tl.cdiv(num_tiles, num_splits)  # this sequence's tiles, cut into num_splits ranges
    first, last = split * per_split, tl.minimum((split + 1) * per_split, num_tiles)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], tl.float32)
    for tile in range(first, last):
        tokens = tile * BLOCK_N + offs_n
        t_mask = tokens < context_len
        # each position gathers its own physical block: a tile may span several blocks
        physical = tl.load(
            BT + seq * stride_bt_seq + tokens // BLOCK_SIZE, mask=t_mask, other=0
        ).to(tl.int64)
        slot = tokens % BLOCK_SIZE
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(
            K
            + physical[:, None] * stride_k_block
            + slot[:, None] * stride_k_tok
            + kv_head * stride_k_head
            + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [BLOCK_N, HEAD_DIM_P2]
        v = tl.load(
            V
            + physical[:, None] * stride_v_block
            + slot[:, None] * stride_v_tok
            + kv_head * stride_v_head
            + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = (
            tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        )  # [BLOCK_M, BLOCK_N], fp32, base 2
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: the tile's first position is real
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])  # masked positions: exp2(-inf) = 0
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    has_tokens = l > 0  # False for an empty split (or context_len 0)
    safe_l = tl.where(has_tokens, l, 1.0)
    tl.store(
        O
        + seq * stride_o_seq
        + heads[:, None] * stride_o_head
        + split * stride_o_split
        + offs_d[None, :],
        (acc / safe_l[:, None]).to(O.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )
    if WRITE_LSE:  # natural-log log-sum-exp: (m + log2 l) * ln 2
        lse = tl.where(has_tokens, (m + tl.log2(safe_l)) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + seq * stride_lse_seq + heads * stride_lse_head + split, lse, mask=m_mask)


@jit
def _merge_splits_kernel(
    O_PART,
    LSE,
    O,
    num_splits,
    stride_p_seq,
    stride_p_head,
    stride_p_split,
    stride_lse_seq,
    stride_lse_head,
    stride_o_seq,
    stride_o_head,
    SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    seq, head = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    s_mask = offs_s < num_splits
    lse = tl.load(
        LSE + seq * stride_lse_seq + head * stride_lse_head + offs_s,
        mask=s_mask,
        other=float("-inf"),
    )
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(
        lse_max == float("-inf"), 0.0, lse_max
    )  # all splits empty: avoid -inf - -inf
    w = tl.exp(lse - lse_max)  # empty split: exp(-inf) = 0, a no-op in both sums
    part = tl.load(
        O_PART
        + seq * stride_p_seq
        + head * stride_p_head
        + offs_s[:, None] * stride_p_split
        + offs_d[None, :],
        mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    w_sum = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.where(w_sum > 0, w_sum, 1.0)
    tl.store(
        O + seq * stride_o_seq + head * stride_o_head + offs_d,
        out.to(O.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def validate_decode_inputs(
    query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
) -> None:
    """Raise ValueError (with the numbers) unless the inputs satisfy the contract of
    :func:`paged_attention_decode`. Reads ``context_lens`` and ``block_tables`` (one device sync; callers
    that build the inputs themselves and need none can use :func:`launch_decode`)."""
    if query.dim() != 3:
        raise ValueError(
            f"query must be [num_seqs, num_heads, head_dim], got shape {tuple(query.shape)}"
        )
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} != key_cache shape {tuple(key_cache.shape)}"
        )
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not query.dtype == key_cache.dtype == value_cache.dtype:
        raise ValueError(
            f"dtypes differ: query {query.dtype}, key_cache {key_cache.dtype}, "
            f"value_cache {value_cache.dtype}"
        )
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, kv_head_dim = key_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"head_dim differs: query {head_dim}, key/value cache {kv_head_dim}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    if block_size < 2 or block_size & (block_size - 1) or block_size > 256:
        raise ValueError(f"block_size must be a power of two in [2, 256], got {block_size}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"GQA needs num_heads % num_kv_heads == 0, got {num_heads} % {num_kv_heads}"
        )
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("key_cache and value_cache must be contiguous in head_dim (stride 1)")
    if block_tables.dim() != 2 or block_tables.dtype not in INDEX_DTYPES:
        raise ValueError(
            "block_tables must be a 2-D int32 (or int64) tensor [num_seqs, max_blocks_per_seq], "
            f"got {block_tables.dtype} of shape {tuple(block_tables.shape)}"
        )
    if context_lens.dim() != 1 or context_lens.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"context_lens must be a 1-D int32 (or int64) tensor [num_seqs], got {context_lens.dtype} "
            f"of shape {tuple(context_lens.shape)}"
        )
    if block_tables.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise ValueError(
            f"num_seqs differs: query {num_seqs}, block_tables {block_tables.shape[0]}, "
            f"context_lens {context_lens.shape[0]}"
        )
    if num_splits is not None and (
        isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1
    ):
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits!r}")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    kernel_device(query, key_cache, value_cache, block_tables, context_lens)
    if num_seqs == 0:
        return
    width = block_tables.shape[1]
    lens = context_lens.long()
    used = (
        torch.arange(width, device=lens.device)[None, :]
        < (lens[:, None] + block_size - 1) // block_size
    )
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    lo, hi, num_bad = torch.stack([lens.min(), lens.max(), bad.sum()]).tolist()  # one device sync
    if lo < 0:
        raise ValueError(f"context_lens must be >= 0, got minimum {lo}")
    if hi > width * block_size:
        raise ValueError(
            f"context_len {hi} exceeds the block table's capacity: {width} blocks x "
            f"{block_size} tokens = {width * block_size}"
        )
    if num_bad:
        seq, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_tables[{seq}, {col}] = {int(block_tables[seq, col])} is outside the pool of "
            f"{num_blocks} blocks (it holds tokens of a context of {int(lens[seq])})"
        )


def choose_num_splits(
    num_programs: int, num_tiles: int, slots: int, max_splits: int = MAX_SPLITS
) -> int:
    """Split count for ``num_programs = num_seqs x num_kv_heads`` programs of ``num_tiles`` KV tiles each.

    FlashAttention-3's rule: no split once the programs fill 80% of the ``slots`` (programs the GPU runs
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


@functools.cache
def _gpu_slots(device_index: int) -> tuple[int, int]:
    """(programs the GPU runs at once, shared memory per program in bytes) for this kernel: two programs
    per SM (4 warps, <= 96 KB of K/V stages each), from ``torch.cuda.get_device_properties``."""
    props = torch.cuda.get_device_properties(device_index)
    return 2 * props.multi_processor_count, getattr(props, "shared_memory_per_block_optin", 0)


def decode_config(head_dim: int, dtype: torch.dtype, device: torch.device) -> dict:
    """Launch config (no autotuning): ``BLOCK_N`` so that one K+V tile stage is 32 KB (16..64 tokens),
    4 warps, 3 pipeline stages where the GPU's shared memory holds them (else 2); in the interpreter a
    fixed 64-token tile, 1 stage (pipelining and warps mean nothing there)."""
    if INTERPRET or device.type != "cuda":
        return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    stage = 2 * triton.next_power_of_2(head_dim) * dtype.itemsize  # bytes of K + V per token
    block_n = max(16, min(64, 32768 // stage))
    smem = _gpu_slots(device.index or 0)[1]
    return {
        "BLOCK_N": block_n,
        "num_warps": 4,
        "num_stages": 3 if smem >= 3 * block_n * stage + 32768 else 2,
    }


def launch_decode(
    query,
    key_cache,
    value_cache,
    block_tables,
    context_lens,
    scale=None,
    num_splits=None,
    config: dict | None = None,
) -> torch.Tensor:
    """:func:`paged_attention_decode` without input validation: no checks and no host sync.

    For callers that built the inputs themselves (the engine's step loop, the benchmark's timed region).
    Wrong inputs here give wrong results or an illegal memory access, never an error message. ``config``
    overrides :func:`decode_config` (keys ``BLOCK_N`` (>= 16 on a GPU), ``num_warps``, ``num_stages``).
    """
    if (
        INTERPRET and query.dtype == torch.bfloat16
    ):  # Triton issue 11584: bf16 tl.dot is wrong in the interpreter
        return launch_decode(
            query.float(),
            key_cache.float(),
            value_cache.float(),
            block_tables,
            context_lens,
            scale,
            num_splits,
            config,
        ).to(torch.bfloat16)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    query, block_tables, context_lens = (
        query.contiguous(),
        block_tables.contiguous(),
        context_lens.contiguous(),
    )
    qk_scale = (
        1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    ) * 1.4426950408889634  # x log2(e)
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    cfg = {**decode_config(head_dim, query.dtype, query.device), **(config or {})}
    if num_splits is None:
        slots = INTERPRETER_SLOTS if INTERPRET else _gpu_slots(query.device.index or 0)[0]
        num_splits = choose_num_splits(
            num_seqs * num_kv_heads,
            triton.cdiv(block_tables.shape[1] * block_size, cfg["BLOCK_N"]),
            slots,
        )
    d_p2 = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dimension >= 16 on a GPU
    meta = dict(
        GROUP=group,
        BLOCK_M=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=d_p2,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        **cfg,
    )
    strides = (
        query.stride(0),
        query.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        block_tables.stride(0),
    )
    grid = (num_seqs, num_kv_heads, num_splits)
    if num_splits == 1:
        _decode_kernel[grid](
            query,
            key_cache,
            value_cache,
            block_tables,
            context_lens,
            out,
            out,
            qk_scale,
            1,
            *strides,
            out.stride(0),
            out.stride(1),
            0,
            0,
            0,
            WRITE_LSE=False,
            **meta,
        )
        return out
    part = torch.empty(
        num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device
    )
    lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    _decode_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        part,
        lse,
        qk_scale,
        num_splits,
        *strides,
        *part.stride()[:3],
        lse.stride(0),
        lse.stride(1),
        WRITE_LSE=True,
        **meta,
    )
    _merge_splits_kernel[(num_seqs, num_heads)](
        part,
        lse,
        out,
        num_splits,
        *part.stride()[:3],
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        SPLITS_P2=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=d_p2,
    )
    return out


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    num_splits: int | None = 1,
) -> torch.Tensor:
    """Decode attention over a paged KV cache (Triton; the interpreter on CPU).

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` float16 / bfloat16 / float32, one new token per sequence.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype as
            ``query``; ``block_size`` a power of two (8, 16, 32 typical), ``head_dim`` 1..256.
        block_tables: int32 ``[num_seqs, max_blocks_per_seq]``; row ``s`` lists the physical blocks of
            sequence ``s`` in logical order; entries past the context are never read.
        context_lens: int32 ``[num_seqs]``, tokens to attend per sequence (0 gives a zero output).
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        num_splits: 1 = single pass; an int > 1 = split-K (flash-decoding) over that many tile ranges of
            each sequence + a merge kernel; ``None`` = :func:`choose_num_splits` from the SM count, the
            programs (``num_seqs x num_kv_heads``) and the table's capacity (width x block size; no sync).

    Returns ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype, accumulated in float32. Query head
    ``h`` reads KV head ``h // (num_heads // num_kv_heads)``. bf16 is upcast to fp32 in the interpreter.

    Raises :class:`~paged.kernels.TritonUnavailableError` without Triton; ValueError (with the numbers)
    for bad shapes, dtypes, devices, GQA ratios, a context longer than its table row or a used table
    entry outside the pool.
    """
    require_triton()
    validate_decode_inputs(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
    return launch_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale, num_splits
    )
