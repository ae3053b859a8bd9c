# Generated from solutions/ex04_fast_decode.py by `python -m paged course sync`. Write only where a region raises
# NotImplementedError("chNN.exK: ...") or holds a starter; grade with `python -m paged grade`.

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

from .ex04_online_softmax import walk_blocks  # noqa: E402 -- your ch04.ex2, the teaching kernel's loop

CONFIG = {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}  # the teaching kernel ignores BLOCK_N


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
    """The teaching kernel: your ch04.ex2 walk, one block per step. Replace the call by your own loop."""
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    offs_g = tl.arange(0, GROUP_P2)
    offs_t = tl.arange(0, BLOCK_SIZE)
    offs_d = tl.arange(0, HEAD_DIM_P2)
    g_mask, d_mask = offs_g < GROUP, offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    context_len = tl.load(CL + seq).to(tl.int32)
    q = (
        tl.load(
            Q + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
            mask=g_mask[:, None] & d_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        * scale
    )
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)
    every_block = tl.cdiv(
        context_len, BLOCK_SIZE
    )  # one split, split 0, owning every block of the context
    m, l, acc = walk_blocks(
        q,
        m,
        l,
        acc,
        K,
        V,
        BT,
        seq,
        kv_head,
        0,
        context_len,
        every_block,
        stride_k_block,
        stride_k_tok,
        stride_k_head,
        stride_bt_seq,
        offs_t,
        offs_d,
        d_mask,
        BLOCK_SIZE,
    )
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(
        O + seq * stride_o_seq + heads[:, None] * stride_o_head + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=g_mask[:, None] & d_mask[None, :],
    )


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
