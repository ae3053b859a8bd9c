r"""Exercise 04, part 3: make the paged decode kernel fast (ch04.ex3, graded on what runs without a GPU).

The marked region holds your kernel ``_learner_kernel`` and its launch config ``CONFIG``. It starts as
chapter 04's teaching kernel: the frame of ``_decode_kernel`` around a call of your ``walk_blocks``
(``ex04_online_softmax.py``, region ch04.ex2), so it is correct once ch04.ex2 passes its checks, and it
reads about a tenth of a GPU's memory bandwidth (the teaching kernel's 11.5% of peak on the H200 run of
``docs/gpu/h200-2026-11-30/``). Decode reads every cached K and V byte once and computes about 4 flops per
byte per query head, so a good kernel runs at the speed of memory. Replace the call by a loop of your own.

Contract (what the graded tests check; the launcher below passes the arguments):

- the result equals softmax(scale * q . k) @ v over each sequence's context, for any ``BLOCK_N`` that is a
  power of two >= 16 and any block size: a tile of ``BLOCK_N`` tokens may span several blocks or part of
  one, each token at ``BT[t // BLOCK_SIZE]``, slot ``t % BLOCK_SIZE``; a context of 0 gives 0;
- entries of the block table past a context and every slot past it hold garbage (NaN, -1, stale ids):
  masked loads name ``other=`` and scores past the context are ``-inf``; accumulation in fp32; the output
  has the query's dtype; the inputs are left unmodified;
- the GQA group (``GROUP`` query heads of one KV head) is the M dimension of ``tl.dot``, padded to
  ``BLOCK_M`` >= 16 rows (masked on load and store), so ``Q K^T`` and ``P V`` compile to tensor-core
  instructions; every ``tl.dot`` dimension >= 16 (the interpreter accepts less, a GPU does not);
- built for an A100 (sm_80) at the engine's decode step (fp16, head dim 128), it compiles, does not
  spill, and loads every K/V row 16 bytes at a time.

The chapter's performance lab walks the ideas: the group in ``tl.dot``'s rows, tiles across blocks,
software pipelining (``CONFIG["num_stages"]`` 2 or 3 on a GPU; split-K is the launcher's business).
``self_check()`` compares :func:`learner_decode` with ``paged_course.reference`` on small inputs;
``python -m paged bench kernel --impl exercises`` also times it on a GPU against the teaching and the tuned
kernels (not on a CPU: the interpreter's times say nothing about a GPU).
"""

# ruff: noqa: E741 -- `l` is the running denominator of the online-softmax literature
from __future__ import annotations

import math

import torch

from paged.kernels import validate_decode_inputs
from paged.kernels._triton import INTERPRET, jit, require_triton, tl, triton

# BEGIN SOLUTION ch04.ex3 -- correct for any tile and block size, on tensor cores, no spill, 16-byte loads
# HINT: Profile first: how many KV bytes does one program load per loop step, and is its tl.dot tall
# HINT+ enough for tensor cores? The lab's ideas are in the module docstring: try them one at a time.
# HINT: Pad the GQA group to BLOCK_M >= 16 rows (masked), load BLOCK_N tokens per step, each gathering its
# HINT+ own physical block BT[t // BLOCK_SIZE] and slot t % BLOCK_SIZE, keep the online update in fp32,
# HINT+ and raise CONFIG["num_stages"] on a GPU.
# STUB: from .ex04_online_softmax import walk_blocks  # noqa: E402 -- your ch04.ex2, the teaching kernel's loop
# STUB:
# STUB: CONFIG = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}  # the teaching kernel ignores BLOCK_N
# STUB:
# STUB:
# STUB: @jit
# STUB: def _learner_kernel(Q, K, V, BT, CL, O, scale, stride_q_seq, stride_q_head, stride_k_block, stride_k_tok,
# STUB:                     stride_k_head, stride_bt_seq, stride_o_seq, stride_o_head, GROUP: tl.constexpr,
# STUB:                     GROUP_P2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
# STUB:                     BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P2: tl.constexpr):
# STUB:     """The teaching kernel: your ch04.ex2 walk, one block per step. Replace the call by your own loop."""
# STUB:     seq, kv_head = tl.program_id(0), tl.program_id(1)
# STUB:     offs_g = tl.arange(0, GROUP_P2)
# STUB:     offs_t = tl.arange(0, BLOCK_SIZE)
# STUB:     offs_d = tl.arange(0, HEAD_DIM_P2)
# STUB:     g_mask, d_mask = offs_g < GROUP, offs_d < HEAD_DIM
# STUB:     heads = kv_head * GROUP + offs_g
# STUB:     context_len = tl.load(CL + seq).to(tl.int32)
# STUB:     q = tl.load(Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
# STUB:                 mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32) * scale
# STUB:     m = tl.full([GROUP_P2], float("-inf"), tl.float32)
# STUB:     l = tl.zeros([GROUP_P2], tl.float32)
# STUB:     acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)
# STUB:     every_block = tl.cdiv(context_len, BLOCK_SIZE)  # one split, split 0, owning every block of the context
# STUB:     m, l, acc = walk_blocks(q, m, l, acc, K, V, BT, seq, kv_head, 0, context_len, every_block, stride_k_block,
# STUB:                             stride_k_tok, stride_k_head, stride_bt_seq, offs_t, offs_d, d_mask, BLOCK_SIZE)
# STUB:     out = acc / tl.where(l > 0, l, 1.0)[:, None]
# STUB:     tl.store(O + seq * stride_o_seq + heads[:, None] * stride_o_head + offs_d[None, :],
# STUB:              out.to(O.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
CONFIG = {
    "BLOCK_N": 64,
    "num_warps": 4,
    "num_stages": 3,
}  # num_stages is ignored by the interpreter


@jit
def _learner_kernel(
    Q,
    K,
    V,
    BT,
    CL,
    O,
    scale,
    stride_q_seq,
    stride_q_head,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    """The group in tl.dot's rows, tiles of BLOCK_N tokens gathered across blocks, exp2 with the scale folded in."""
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)  # the group's query heads, padded to >= 16 rows for tl.dot
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    m_mask, d_mask = offs_m < GROUP, offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_m
    context_len = tl.load(CL + seq).to(tl.int32)
    q = tl.load(
        Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # stays fp16/bf16 for the tensor cores
    qk_scale = scale * 1.4426950408889634  # exp(x) = exp2(x * log2 e)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P2], tl.float32)
    for tile in range(0, tl.cdiv(context_len, BLOCK_N)):
        tokens = tile * BLOCK_N + offs_n
        t_mask = tokens < context_len
        physical = tl.load(
            BT + seq * stride_bt_seq + tokens // BLOCK_SIZE, mask=t_mask, other=0
        ).to(tl.int64)
        offsets = (
            physical[:, None] * stride_k_block
            + (tokens % BLOCK_SIZE)[:, None] * stride_k_tok
            + kv_head * stride_k_head
            + offs_d[None, :]
        )
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(K + offsets, mask=kv_mask, other=0.0)  # [BLOCK_N, HEAD_DIM_P2]
        v = tl.load(V + offsets, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N] in fp32
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(
        O + seq * stride_o_seq + heads[:, None] * stride_o_head + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


# END SOLUTION


def launch_learner_decode(
    query, key_cache, value_cache, block_tables, context_lens, scale=None
) -> torch.Tensor:
    """Launch ``_learner_kernel`` without checks (the benchmark's timed region): grid (num_seqs, num_kv_heads).

    In the interpreter bf16 inputs run as fp32 (its bf16 ``tl.dot`` is wrong, Triton issue 11584).
    """
    if INTERPRET and query.dtype == torch.bfloat16:
        return launch_learner_decode(
            query.float(), key_cache.float(), value_cache.float(), block_tables, context_lens, scale
        ).to(query.dtype)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    query, block_tables, context_lens = (
        query.contiguous(),
        block_tables.contiguous(),
        context_lens.contiguous(),
    )
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    _learner_kernel[(num_seqs, num_kv_heads)](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        out,
        scale,
        query.stride(0),
        query.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_P2=triton.next_power_of_2(group),
        BLOCK_M=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        HEAD_DIM_P2=max(16, triton.next_power_of_2(head_dim)),
        **CONFIG,
    )
    return out


def learner_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention with your kernel; the contract and errors of ``paged.kernels.paged_attention_decode``
    (single pass). Raises ValueError for bad inputs, TritonUnavailableError without Triton."""
    require_triton()
    validate_decode_inputs(query, key_cache, value_cache, block_tables, context_lens, scale, 1)
    if key_cache.stride() != value_cache.stride():
        raise ValueError(
            "key_cache and value_cache must have the same strides (the kernel shares them)"
        )
    return launch_learner_decode(query, key_cache, value_cache, block_tables, context_lens, scale)


def self_check(verbose: bool = True) -> list[dict]:
    """Your kernel against ``paged_course.reference.paged_attention_gather`` (fp32 math) on small inputs:
    ragged contexts (0 included), shuffled block tables, NaN past every context, GQA groups 1, 4 and 7.

    Returns one row per case (``max_err``, ``ok``); prints them when ``verbose``. Runs on CPU (interpreter)
    or a GPU (then also fp16 and bf16 at larger sizes).
    """
    from paged_course.reference import paged_attention_gather

    device = "cpu" if INTERPRET else "cuda"
    cases = [
        (torch.float32, 4, 4, 16, 8, [1, 8, 9, 70]),
        (torch.float32, 14, 2, 24, 16, [0, 33, 100]),
        (torch.float16, 8, 2, 32, 16, [5, 64, 129]),
    ]
    if device == "cuda":
        cases += [
            (torch.float16, 32, 8, 128, 16, [1, 1000, 4096]),
            (torch.bfloat16, 32, 8, 128, 16, [17, 2049]),
        ]
    rows = []
    for i, (dtype, heads, kv_heads, head_dim, block_size, lens) in enumerate(cases):
        gen = torch.Generator().manual_seed(i)
        need = [-(-n // block_size) for n in lens]
        num_blocks = sum(need) + 1
        perm = torch.randperm(num_blocks, generator=gen)
        tables = torch.zeros(len(lens), max(need), dtype=torch.int32)
        key_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
        value_cache = key_cache.clone()
        start = 0
        for s, (n, k) in enumerate(zip(lens, need)):
            tables[s, :k] = perm[start : start + k].int()
            start += k
            for p in range(n):  # real tokens only: every slot past a context stays NaN
                block, slot = int(tables[s, p // block_size]), p % block_size
                key_cache[block, slot] = torch.randn(kv_heads, head_dim, generator=gen)
                value_cache[block, slot] = torch.randn(kv_heads, head_dim, generator=gen)
        query = torch.randn(len(lens), heads, head_dim, generator=gen)
        args = [
            t.to(device)
            for t in (
                query.to(dtype),
                key_cache.to(dtype),
                value_cache.to(dtype),
                tables,
                torch.tensor(lens, dtype=torch.int32),
            )
        ]
        out = learner_decode(*args)
        ref = paged_attention_gather(*[t.float() if t.is_floating_point() else t for t in args])
        err = (out.float() - ref).abs().max().item() if torch.isfinite(out).all() else float("inf")
        tol = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 3e-2}[dtype]
        rows.append(
            {
                "dtype": str(dtype).replace("torch.", ""),
                "heads": heads,
                "kv_heads": kv_heads,
                "head_dim": head_dim,
                "block_size": block_size,
                "context_lens": lens,
                "max_err": err,
                "ok": err < tol,
            }
        )
        if verbose:
            r = rows[-1]
            print(
                f"{r['dtype']:8s} heads {heads:2d}/{kv_heads} dim {head_dim:3d} bs {block_size:2d} contexts {lens}: "
                f"max |error| {err:.1e} -> {'OK' if r['ok'] else 'WRONG'}"
            )
    return rows
