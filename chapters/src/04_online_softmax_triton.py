# ---
# jupyter:
#   jupytext:
#     formats: ipynb,src//py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Online softmax and a Triton paged-attention kernel
#
# Chapter 03 computed decode attention over the paged pool by *gathering* each sequence's keys and values
# into a padded contiguous tensor, then running ordinary attention. The gather costs a full copy of the
# context every step. vLLM's kernel never makes that copy: it walks a sequence's blocks through the block
# table and folds each block into the result as it goes. What makes that possible is the **online softmax**.
#
# **You will learn to**
#
# 1. derive the online softmax: a running max `m`, a running denominator `l` and a running weighted sum `acc`,
#    rescaled by `exp(m_old - m_new)` whenever the max grows, and write its update (build step 1);
# 2. find the two bugs in a widely copied sketch of it (ledger row E1, from the fragmentation article,
#    `docs/sources.md`);
# 3. write the loop of a Triton paged-attention decode kernel (build step 2): one program per (sequence, KV head),
#    grouped-query attention (GQA), masking of the last block, fp32 accumulation;
# 4. run it on this CPU with Triton's interpreter and check it against the PyTorch reference and your chapter-03
#    decode;
# 5. split a long context over several programs (split-K, "flash-decoding") and merge the pieces exactly with
#    their log-sum-exp (build step 3);
# 6. (part 2, the performance lab) count the bytes a decode step must read, and take the kernel from about a tenth
#    of a GPU's memory bandwidth towards all of it, one idea per step: the GQA group in tensor cores, KV tiles that
#    span blocks, software pipelining, and a split count chosen from the machine;
# 7. say what the paging overhead really is at the roofline, and what the paper measured (ledger row E2);
# 8. read what the compiler made of a kernel for an A100 and an H200, on a machine without a GPU: registers,
#    spills, shared memory, load widths, and how many programs fit on one multiprocessor.
#
# Part 1 (sections 1-8) has you build the *teaching* kernel, written to be read, in
# **`exercises/ex04_online_softmax.py`** (three marked regions: `ch04.ex1`, `ch04.ex2`, `ch04.ex4`). Wherever yours
# does not pass its checks yet, the chapter uses a reference: `paged_course.kernel_lab` for the online-softmax
# update and the split merge, and the engine's tuned kernel for the decode. Part 2 (sections 9-18) builds the *tuned* kernel that the engine runs,
# and has you make a kernel of your own fast in **`exercises/ex04_fast_decode.py`** (`ch04.ex3`):
# `paged.kernels.paged_attention_decode` (the folder `kernels/`). The PyTorch references are in
# `paged_course.reference`. After each build step a cell `check("ch04.exK")` runs that step's graded tests on your
# file and prints the first failing case in words; `hint("ch04.exK")` gives a nudge, a second call a stronger one.

# %%
import inspect
import math
import re
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "paged_course").is_dir())
if str(ROOT) not in sys.path:  # the notebook runs in chapters/; the exercises live at the root
    sys.path.insert(0, str(ROOT))

from paged.kernels import HAS_TRITON, MODE, REASON
from paged_course.check import (
    check,
    exercise_module,
    hint,
    impl_package,
    learner_or_reference,
    solution,
)
from paged_course.kernel_lab.softmax_state import merge_splits as reference_merge
from paged_course.kernel_lab.softmax_state import online_softmax_update as reference_update
from paged_course.predict import reveal
from paged_course.reference import paged_attention_blockwise, paged_attention_gather
from paged_course.viz.kernels import (
    online_softmax_trace,
    plot_lab_steps,
    plot_online_softmax,
    plot_program_reads,
    plot_split_weights,
    plot_tile_gather,
    program_reads_explorer,
)

torch.manual_seed(0)
torch.set_num_threads(2)
print("Triton:", MODE if HAS_TRITON else f"unavailable ({REASON})")


def show_source(fn, first: str | None = None, last: str | None = None) -> None:
    """Print a function's source with line numbers, optionally only from line `first` to line `last`."""
    lines = inspect.getsource(getattr(fn, "fn", fn)).splitlines()
    start = next((i for i, line in enumerate(lines) if first and first in line), 0)
    stop = next(
        (i for i, line in enumerate(lines) if last and last in line and i >= start), len(lines) - 1
    )
    for i in range(start, stop + 1):
        print(f"{i + 1:3d}  {lines[i]}")


def yours(exercises, module: str, name: str, reference):
    """`name` from your exercise module when the regions `exercises` pass their checks, else `reference`
    (one line says so). The module is imported afresh, so your last saved edit is what runs."""
    found = exercise_module(module)
    if found is None:
        print(f"using the reference for {name}")
        return reference
    return learner_or_reference(exercises, getattr(found, name, reference), reference)


# %% [markdown]
# ## 1. Softmax needs the maximum
#
# For scores $x_1, \dots, x_N$, $\;\mathrm{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$. Computed literally it
# overflows as soon as a score passes about 88 in float32 (11 in float16). Subtracting the maximum
# $m = \max_j x_j$ from every score changes nothing mathematically (the factor $e^{-m}$ cancels) and keeps every
# exponent at most 0:
#
# $$\mathrm{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}.$$
#
# The textbook recipe therefore reads the scores three times: once for $m$, once for the sum, once to write
# the result. Attention scores are $q \cdot k_t / \sqrt{d}$ and easily reach the hundreds.

# %%
x = torch.tensor([3.0, 120.0, 95.0])
print("exp(x) / sum exp(x)     :", (x.exp() / x.exp().sum()).tolist())
print("exp(x - m) / sum exp(..):", ((x - x.max()).exp() / (x - x.max()).exp().sum()).tolist())

# %% [markdown]
# ## 2. The online softmax, derived
#
# Now read the scores in blocks $B_1, B_2, \dots$ (for paged attention: one KV block at a time) and keep, after
# block $j$, the max and the denominator of everything seen so far:
#
# $$m_j = \max(m_{j-1},\ \max_{i \in B_j} x_i), \qquad l_j = \sum_{i \in B_1 \cup \dots \cup B_j} e^{x_i - m_j}.$$
#
# Split $l_j$ into the old blocks and the new one. For the old ones, $e^{x_i - m_j} = e^{x_i - m_{j-1}}\,
# e^{m_{j-1} - m_j}$, and the sum of the first factor over the old blocks is $l_{j-1}$. So
#
# $$\boxed{\,l_j = l_{j-1}\, e^{m_{j-1} - m_j} + \sum_{i \in B_j} e^{x_i - m_j}\,}$$
#
# with $m_0 = -\infty$, $l_0 = 0$ (and $e^{-\infty} = 0$ makes the first step right). After the last block
# $m$ and $l$ are exactly the max and the denominator of the whole row: one pass instead of two
# (Milakov & Gimelshein, *Online normalizer calculation for softmax*, 2018).
#
# Attention needs the softmax-weighted sum of values, $o = \sum_i \mathrm{softmax}(x)_i\, v_i$. Keep the
# un-normalized sum $a_j = \sum_{i \le B_j} e^{x_i - m_j} v_i$; it changes reference point exactly like $l$:
#
# $$a_j = a_{j-1}\, e^{m_{j-1} - m_j} + \sum_{i \in B_j} e^{x_i - m_j} v_i,$$
#
# and after the last block $J$ the output is $o = a_J / l_J$.
#
# The exponents are all $\le 0$, nothing of the row's length is ever stored, and blocks can arrive in any
# order. This is the heart of FlashAttention (Dao et al. 2022) and of vLLM's paged kernel.
#
# A row of 20 scores in blocks of 4, step by step:

# %%
scores = (torch.randn(20, generator=torch.Generator().manual_seed(1)) * 3).tolist()
trace = online_softmax_trace(scores, block=4)
for seen, m, den in zip(trace["seen"], trace["m"], trace["l"]):
    print(f"after {seen:2d} scores: m = {m:7.4f}   l = {den:8.4f}")
fig = plot_online_softmax(scores, block=4)
plt.show()

# %% [markdown]
# **Predict, then run.** One row, two blocks: the scores `[1, 3]`, then `[5, 2]`. The second block raises the max
# from 3 to 5. By what factor is the `l` of the first block multiplied? Put a number in `prediction`.

# %%
prediction = None  # your guess, e.g. prediction = 0.5

# %%
m1, l1, acc1 = reference_update(
    torch.full((1,), float("-inf")),
    torch.zeros(1),
    torch.zeros(1, 1),
    torch.tensor([[1.0, 3.0]]),
    torch.ones(2, 1),
)
m2, l2, _ = reference_update(m1, l1, acc1, torch.tensor([[5.0, 2.0]]), torch.ones(2, 1))
alpha = math.exp(m1.item() - m2.item())
reveal(
    prediction,
    round(alpha, 4),
    "the first block's l is multiplied by exp(3 - 5)",
    why=f"l after block 1 is {l1.item():.4f} relative to m = 3; relative to m = 5 it is {l1.item() * alpha:.4f}, "
    f"and block 2 adds its own terms: l = {l2.item():.4f}",
    tolerance=1e-3,
)

# %% [markdown]
# When a block raises the max (left), the stored `l` drops: it is re-expressed relative to the new max (right,
# red). Rescaled to the final max (orange), it only grows, and ends on the denominator of the whole row:

# %% tags=["nbval-check-output"]
row = torch.tensor(scores, dtype=torch.float64)
print(f"online: m = {trace['m'][-1]:.6f}, l = {trace['l'][-1]:.6f}")
print(f"direct: m = {row.max().item():.6f}, l = {(row - row.max()).exp().sum().item():.6f}")

# %% [markdown]
# ## 3. Find the bugs (ledger row E1)
#
# The fragmentation article (§3.4) sketches the paged kernel's loop like this (translated; one head, so `query` is
# `[head_dim]` and a block of keys is `[block_size, head_dim]`):
#
# ```python
# output = torch.zeros_like(query)
# max_score = float("-inf")
# for block_idx in range(num_blocks):
#     keys, values = key_cache[block_table[block_idx]], value_cache[block_table[block_idx]]
#     scores = keys @ query / math.sqrt(head_dim)
#     scores[valid_tokens:] = float("-inf")              # mask the padding of the last block
#     block_max = scores.max()
#     max_score = max(max_score, block_max)
#     exp_scores = torch.exp(scores - max_score)
#     output = output * torch.exp(prev_max - max_score)
#     output += exp_scores @ values
# output = output / output.sum(dim=-1, keepdim=True)     # final normalization
# ```
#
# **Before you read on**, compare it with the derivation above. What is wrong? Run it:


# %%
def seed_sketch(query, key_cache, value_cache, block_table, seq_len, fix_name_error=False):
    """The seed's loop, kept as written (plus an optional one-line fix of the first bug)."""
    block_size, head_dim = key_cache.shape[1], query.shape[0]
    output = torch.zeros_like(query)
    max_score = torch.tensor(float("-inf"))
    for block_idx in range(-(-seq_len // block_size)):
        keys, values = key_cache[block_table[block_idx]], value_cache[block_table[block_idx]]
        scores = keys @ query / math.sqrt(head_dim)
        scores[min(block_size, seq_len - block_idx * block_size) :] = float("-inf")
        if fix_name_error:
            prev_max = max_score
        max_score = torch.maximum(max_score, scores.max())
        exp_scores = torch.exp(scores - max_score)
        output = output * torch.exp(prev_max - max_score)  # noqa: F821 -- prev_max is never defined
        output += exp_scores @ values
    return output / output.sum(dim=-1, keepdim=True)


gen = torch.Generator().manual_seed(2)
k_pool, v_pool = (
    torch.randn(6, 4, 8, generator=gen),
    torch.randn(6, 4, 8, generator=gen),
)  # 6 blocks of 4 tokens
q1 = torch.randn(8, generator=gen)
table1, n1 = [4, 1, 3], 10
try:
    seed_sketch(q1, k_pool, v_pool, table1, n1)
except NameError as err:
    print("as written:", type(err).__name__, "-", err)

# %% [markdown]
# The first bug is that error (`UnboundLocalError` is Python's `NameError` for a local variable): `prev_max`,
# the max *before* this block, is never kept. Define it and the code runs, but compare the result with the
# reference:

# %% tags=["nbval-check-output"]
slots = [table1[p // 4] * 4 + p % 4 for p in range(n1)]
k_seq, v_seq = k_pool.reshape(-1, 8)[slots], v_pool.reshape(-1, 8)[slots]
reference = torch.softmax(k_seq @ q1 / math.sqrt(8), 0) @ v_seq
patched = seed_sketch(q1, k_pool, v_pool, table1, n1, fix_name_error=True)
print("reference      :", [round(v, 3) for v in reference.tolist()[:4]], "...")
print("sketch, patched:", [round(v, 3) for v in patched.tolist()[:4]], "...")
print(
    f"patched output sums to {patched.sum().item():.3f}; "
    f"max |error| = {(patched - reference).abs().max().item():.3f}"
)

# %% [markdown]
# Still wrong. The second bug is the last line: dividing the output vector by the sum of *its own entries*
# makes its `head_dim` numbers add up to 1, which means nothing. The softmax denominator is the sum of the
# exponentiated *scores*, `l`, which the sketch never accumulates. The fix is the derivation: carry `m`, carry
# `l` and rescale it together with the output, divide by `l` at the end. (The seed's own formula block states
# the `l` update correctly; the code just drops it.)

# %% [markdown]
# ### Build step 1 · the update (`ch04.ex1`)
#
# Open `exercises/ex04_online_softmax.py` and write region `ch04.ex1` in
# `online_softmax_update(m, l, acc, scores, values) -> (m, l, acc)`: the state of `N` query rows (`m`, `l`
# `[N]`, `acc` `[N, D]`), one block of their scores `[N, B]` and the block's values `[B, D]`, all float32. It is
# section 2's derivation, for `N` rows at once, with two traps the sketch never meets:
#
# - the scores may be in the hundreds, so never take `exp` of a score that is not shifted by the running max;
# - a masked slot has score `-inf`, and a row can meet a block that is *entirely* masked (the tail of a short
#   sequence, a whole block past its context) while its state is still empty: `m` is `-inf` before and after,
#   and `exp(-inf - (-inf))` is NaN. Such a row must come out unchanged.
#
# The check feeds your update rows of signed scores large enough to overflow `exp`, with the max arriving in the
# last block, ragged blocks and fully masked ones, and compares `acc / l` with one softmax over the whole row:

# %%
_ = check("ch04.ex1")

# %% [markdown]
# With your update carrying the state, the seed's loop is right: the same loop, `m`, `l` and `acc` folded in
# block by block, divided by `l` at the end.

# %%
update = yours("ch04.ex1", "ex04_online_softmax", "online_softmax_update", reference_update)


def seed_loop_with_state(query, key_cache, value_cache, block_table, seq_len):
    """The seed's loop over the blocks, with the state of section 2 carried by `update` (one query row)."""
    block_size, head_dim = key_cache.shape[1], query.shape[0]
    m, l, acc = torch.full((1,), float("-inf")), torch.zeros(1), torch.zeros(1, head_dim)  # noqa: E741
    for block_idx in range(-(-seq_len // block_size)):
        keys, values = key_cache[block_table[block_idx]], value_cache[block_table[block_idx]]
        scores = keys @ query / math.sqrt(head_dim)
        scores[min(block_size, seq_len - block_idx * block_size) :] = float("-inf")
        m, l, acc = update(m, l, acc, scores[None], values)  # noqa: E741
    return acc[0] / l[0]


fixed = seed_loop_with_state(q1, k_pool, v_pool, table1, n1)
print(
    f"the seed's loop with the state carried: max |error| = {(fixed - reference).abs().max().item():.6f}"
)

# %% [markdown]
# `paged_course.reference.paged_attention_blockwise` is this loop for a whole batch at once (all sequences, all heads,
# GQA), in PyTorch; it agrees with chapter 03's gather reference:


# %% tags=["nbval-check-output"]
def paged_batch(
    context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype=torch.float32, seed=0
):
    """Random q/K/V in a pool with shuffled block tables; NaN in every slot past a context."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(context_lens), max(need), dtype=torch.int32)
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    value_cache = key_cache.clone()
    for s, n in enumerate(context_lens):
        tables[s, : need[s]] = torch.tensor(perm[: need[s]], dtype=torch.int32)
        perm = perm[need[s] :]
        for p in range(n):
            key_cache[tables[s, p // block_size], p % block_size] = torch.randn(
                num_kv_heads, head_dim, generator=gen
            )
            value_cache[tables[s, p // block_size], p % block_size] = torch.randn(
                num_kv_heads, head_dim, generator=gen
            )
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=gen)
    return (
        query.to(dtype),
        key_cache.to(dtype),
        value_cache.to(dtype),
        tables,
        torch.tensor(context_lens, dtype=torch.int32),
    )


batch = paged_batch([1, 8, 9, 21], num_heads=6, num_kv_heads=2, head_dim=16, block_size=8)
err = (paged_attention_blockwise(*batch) - paged_attention_gather(*batch)).abs().max().item()
print(f"blockwise online softmax vs gather reference: max |error| = {err:.6f}")

# %% [markdown]
# ## 4. Warm-up in Triton: a row softmax
#
# A Triton kernel is a Python function decorated with `@triton.jit` that describes what **one program**
# does; a launch `kernel[grid](...)` runs one program per grid point, on the GPU in parallel. Inside, a
# program works on *tiles*: `tl.arange(0, BLOCK)` is a vector of offsets, `tl.load(ptr + offsets, mask=...,
# other=...)` reads a tile (masked lanes get `other`), `tl.store` writes one. Without a GPU the package sets
# `TRITON_INTERPRET=1` before any kernel is defined, and the same source runs program after program in
# NumPy: slow, but exact enough to check.
#
# The online softmax as a kernel, one program per row (`paged_course/kernel_lab/row_softmax.py`): the first loop
# computes `(m, l)` in one sweep, the second writes the result.

# %%
if HAS_TRITON:
    from paged_course.kernel_lab import row_softmax as softmax_kernels

    show_source(softmax_kernels._online_softmax_kernel)
else:
    print("skipped:", REASON)

# %% tags=["nbval-check-output"]
if HAS_TRITON:
    rows = torch.randn(3, 300, generator=torch.Generator().manual_seed(3)) * 40
    for name, fn in (
        ("softmax (row in one tile)", softmax_kernels.softmax),
        ("online_softmax (tiles of 64)", lambda t: softmax_kernels.online_softmax(t, block=64)),
    ):
        err = (fn(rows) - torch.softmax(rows, -1)).abs().max().item()
        print(f"{name:30s} max |error| vs torch.softmax = {err:.6f}")
else:
    print("skipped:", REASON)

# %% [markdown]
# ## 5. The paged decode kernel: the skeleton, and your loop
#
# The teaching kernel `paged_course.kernel_lab.teaching_decode(query, key_cache, value_cache, block_tables,
# context_lens, scale=None, num_splits=1)` has the signature of the reference (and of the engine's tuned kernel,
# part 2): `query` `[num_seqs, num_heads, head_dim]`, the pool `[num_blocks, block_size, num_kv_heads, head_dim]`,
# int32 block tables and context lengths. The grid has **one program per (sequence, KV head)** (and per split,
# section 7). With GQA, `group = num_heads // num_kv_heads` query heads share one KV head; the program serves all
# of them, so each K/V block is read from memory once per group rather than once per query head.
#
# That kernel is the one you complete now: `_decode_kernel` in `exercises/ex04_online_softmax.py` (launched by
# `paged_decode` in the same file). Everything but the loop over the blocks is written for you; the loop is the
# function it calls, `walk_blocks`, and `teaching_decode` runs the same kernel (from the reference answers where
# your copy of the course has them, else from your file). The skeleton, from your file: the beginning,

# %%
if HAS_TRITON:
    from paged_course.kernel_lab import decode_teaching

    skeleton = exercise_module("ex04_online_softmax") or decode_teaching.kernel_module()
    show_source(skeleton._decode_kernel, first="seq = tl.program_id(0)", last="acc = tl.zeros")
else:
    print("skipped:", REASON)

# %% [markdown]
# then the call of your loop, then the end:

# %%
if HAS_TRITON:
    show_source(skeleton._decode_kernel, first="m, l, acc = walk_blocks(")

# %% [markdown]
# Reading the skeleton (line numbers as printed):
#
# - **Program ids.** `seq`, `kv_head` and `split` say which piece of work this program owns.
# - **Tiles.** `offs_g` enumerates the group's query heads, padded to a power of two (`tl.arange` needs one;
#   a group of 7 becomes 8, the 8th lane masked by `g_mask`); `offs_t` the `block_size` slots of a block;
#   `offs_d` the head dimension, padded the same way (head dim 80 becomes 128, masked by `d_mask`).
# - **The query tile** `q` is `[GROUP_P2, HEAD_DIM_P2]`: rows `kv_head * GROUP + g`. Masked lanes load
#   `other=0.0`, and the load is cast to float32 at once: fp16/bf16 only exist in memory, all arithmetic is
#   fp32 (section 6 shows what fp16 arithmetic would do). The scale is folded into `q` once.
# - **State.** `m` (`-inf`), `l` (0) and `acc` (0) per query head, exactly the derivation's $m_0, l_0, a_0$.
# - **The end.** `out = acc / l` (guarded: a program that saw no token writes 0), stored in the output's dtype;
#   with split-K the program also writes its log-sum-exp (section 7).
#
# ### Build step 2 · the loop (`ch04.ex2`)
#
# Region `ch04.ex2`, the body of `walk_blocks`, walks this program's blocks, folds each into `m`, `l`, `acc`,
# and returns the three (its docstring lists what it receives):
#
# - **Which blocks.** A sequence uses its first `cdiv(context_len, BLOCK_SIZE)` logical blocks. Split `split` owns
#   `blocks_per_split` consecutive logical blocks starting at `split * blocks_per_split`, but only those the context
#   uses: a split past the end owns none, and then its loop must not run at all (its state stays empty, and the end
#   writes 0 and `-inf` for it). With one split, the program owns every block of the context.
# - **The lookup.** The physical block of logical block `b` is entry `b` of the sequence's row of `BT`: the only
#   line that makes this kernel *paged*. Widen it to int64 before it multiplies a stride, because a large pool has
#   more than $2^{31}$ elements.
# - **Masking the last block.** Only the slots of tokens before `context_len` are real. Load the block's K and V
#   tiles, `[BLOCK_SIZE, HEAD_DIM_P2]` at KV head `kv_head`, with a mask and `other=0.0`, so that whatever sits past
#   the context (stale keys, NaN, inf) is never even read (a GPU leaves masked lanes undefined without `other=`),
#   cast them to float32, and give the scores of the other slots `-inf`, so their weight is exactly 0.
# - **Scores** are a `[group, block]` matrix product of `q` and the block's keys, written as a broadcast and a sum
#   over the head dimension: the product is first built as a `[group, block, head_dim]` tile in registers, then
#   summed. `tl.dot` would run it on tensor cores, but it needs tiles of at least 16 x 16 (groups are often 1 to 8);
#   this kernel stays with the plainest form. It is tempting to say that decode is limited by memory bandwidth, so
#   the arithmetic costs little. The GPU measurement in part 2 says otherwise: the teaching kernel reaches about a
#   tenth of the bandwidth, and section 10 points at that three-dimensional tile.
# - **The update** is your step 1 for the whole group: `m`, `l` `[GROUP_P2]` and `acc` `[GROUP_P2, HEAD_DIM_P2]`,
#   with `tl.maximum`, `tl.max`, `tl.exp` and `tl.sum`. Every block the loop visits holds a real token (its first
#   slot), so the new max is finite here and needs no guard.
#
# `raise` cannot live inside `@triton.jit`, so the stub's region is empty: `walk_blocks` returns the empty state,
# and the kernel writes zeros.
# The check runs your kernel in the interpreter on tiny inputs and writes into outputs filled with NaN first; the
# tables are shuffled, their unused entries hold `-1` and ids of blocks beyond the pool, every unused slot holds
# NaN, and it compares with a float64 reference for GQA groups 1, 2, 4 and 7, two block sizes, fp16 and bf16, and
# split by split for 2, 3 and 8 splits:

# %%
_ = check("ch04.ex2")

# %% [markdown]
# Which pool slots does each program read? One row per program, one column per slot of the pool; light cells
# are loaded with the last block but masked. Move the slider (in Jupyter) to split the sequences (section 7).

# %%
tables_demo = [[5, 2, 7], [0, -1, -1], [1, 4, 3]]  # -1: padding past the context, never read
lens_demo = [9, 4, 12]
program_reads_explorer(tables_demo, lens_demo, block_size=4, num_blocks=8)

# %%
fig = plot_program_reads(tables_demo, lens_demo, block_size=4, num_blocks=8)
plt.show()

# %% [markdown]
# ## 6. Run it (Triton interpreter on this CPU) and check it
#
# Your kernel (or, until yours passes, the engine's tuned kernel `paged.kernels.paged_attention_decode`, which has
# the same contract), on cases with shuffled block tables, NaN in every
# unused slot, context lengths 1, `block_size`, `block_size + 1` and more; compared with `paged_attention_gather`
# (chapter 03) computed in fp32 on the same inputs, so for fp16/bf16 the error is the rounding of the output to 16
# bits.

# %%
cases = [  # (dtype, num_heads, num_kv_heads, head_dim, block_size)
    (torch.float32, 4, 4, 16, 8),
    (torch.float32, 14, 2, 24, 8),  # GQA group 7, head dim not a power of two
    (torch.float16, 8, 2, 32, 16),
    (torch.bfloat16, 6, 3, 16, 8),
]
interp_seconds = []
if HAS_TRITON:
    from paged.kernels import paged_attention_decode

    decode_kernel = yours("ch04.ex2", "ex04_online_softmax", "paged_decode", paged_attention_decode)
    report = []  # printed at the end, in one piece
    for dtype, heads, kv_heads, head_dim, bs in cases:
        inputs = paged_batch(
            [1, bs, bs + 1, 2 * bs + 3], heads, kv_heads, head_dim, bs, dtype=dtype, seed=heads
        )
        start = time.perf_counter()
        out = decode_kernel(*inputs)
        interp_seconds.append(time.perf_counter() - start)
        exact = paged_attention_gather(
            *(t.float() if t.is_floating_point() else t for t in inputs)
        )  # fp32 math
        err = (out.float() - exact).abs().max().item()  # fp16/bf16: the output's own rounding
        tol, digits = {
            torch.float32: (1e-5, 5),
            torch.float16: (2e-3, 2),
            torch.bfloat16: (2e-2, 2),
        }[dtype]
        report.append(
            f"{str(dtype):15s} heads {heads:2d}/{kv_heads} dim {head_dim:2d} bs {bs:2d}: finite "
            f"{bool(torch.isfinite(out).all())}, max |error| = {err:.{digits}f} (< {tol:g}: {err < tol})"
        )
    print("\n".join(report))
else:
    print("skipped:", REASON)

# %%
if interp_seconds:
    print(
        f"{MODE}: {', '.join(f'{s:.2f} s' for s in interp_seconds)} per call (in the interpreter, Python "
        "executes every program one after another; a GPU runs them in parallel, in microseconds)"
    )

# %% [markdown]
# **fp16 scores must not overflow.** With `q` and every key all 32.0 and head dim 64, the raw dot
# product is $32 \cdot 32 \cdot 64 = 65536$, above fp16's largest value 65504. Accumulated in fp16 it becomes
# `inf` and the output NaN; the kernel upcasts at load, so all three scores are equal and the output is the
# mean of the value rows 1, 2 and 3: exactly 2.0.

# %%
if HAS_TRITON:
    kc = torch.full((2, 4, 1, 64), 32.0, dtype=torch.float16)
    vc = torch.zeros(2, 4, 1, 64, dtype=torch.float16)
    vc[0, :3] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)[:, None, None]
    q16 = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
    print("fp16 dot product in fp16:", (q16[0, 0] * kc[0, 0, 0]).sum(dtype=torch.float16).item())
    out16 = decode_kernel(
        q16, kc, vc, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    )
    print("kernel output (all 64 lanes):", sorted(set(out16.flatten().tolist())))
else:
    print("skipped:", REASON)

# %% [markdown]
# ## 7. Split-K: several programs per sequence (flash-decoding)
#
# One program per (sequence, KV head) means `num_seqs x num_kv_heads` programs. At batch 1 with 8 KV heads
# that is 8 programs on a GPU with over 100 multiprocessors, each looping over thousands of blocks: most of the
# chip idles. **Split-K** (Dao et al., *Flash-Decoding for long-context inference*, 2023; vLLM's
# `paged_attention_v2`) cuts each sequence's blocks into `num_splits` ranges, one program each. Program $i$
# ends with its own $(m_i, l_i, a_i)$ and writes its normalized partial output and its **log-sum-exp**:
#
# $$o_i = a_i / l_i, \qquad \mathrm{lse}_i = m_i + \log l_i = \log \sum_{t \in \text{split } i} e^{x_t}.$$
#
# A second pass merges them. The full denominator is $\sum_i e^{\mathrm{lse}_i}$, so with
# $M = \max_i \mathrm{lse}_i$ and weights $w_i = e^{\mathrm{lse}_i - M}$,
#
# $$o = \frac{\sum_i w_i\, o_i}{\sum_i w_i}, \qquad \mathrm{lse} = M + \log \sum_i w_i.$$
#
# A split that holds no token (a short sequence in a wide table) has $l_i = 0$ and $\mathrm{lse}_i = -\infty$,
# so $w_i = 0$: it **merges as a no-op**. One case needs care: all splits empty ($M = -\infty$, and
# $-\infty - (-\infty)$ is NaN).
#
# ### Build step 3 · the merge (`ch04.ex4`)
#
# Region `ch04.ex4` is `merge_splits(partial, lse) -> (out, lse_total)`: `partial` float32 `[..., P, D]` holds the
# `P` splits' normalized outputs $o_i$ and `lse` `[..., P]` their log-sum-exps; return the merged output `[..., D]`
# and the log-sum-exp of all the tokens `[...]` (so that a merged result can be merged again). The traps:
# log-sum-exps in the hundreds (never `exp` one unshifted); a split with no token, whose partial output may hold
# anything, NaN included (nothing of it may reach the output: `0 × NaN` is NaN); a row whose splits are all empty (a
# context of 0), which merges to 0 and `-inf`. With `num_splits > 1`, `paged_decode` in your file runs your kernel
# for the partials (`decode_splits`), then your merge. (`ch04.ex3`, in part 2, makes the kernel fast.)
#
# **Spot the bug.** This step is already written in your file: `merge_splits` runs, looks right, and merges
# splits that all hold tokens exactly. One case of the contract goes wrong. The symptom: two splits of one head,
# the second empty (`lse = -inf`, its partial output NaN, as a kernel may leave it). The contract says the merge
# is the first split's output, `[0.5, -1.0]`; as handed out, your merge returns `[nan, nan]`. The cell below runs
# your `merge_splits` on that case. Find the bug, fix it, and run the cell and the check again. This region
# scores only when all of its checks pass.


# %%
def merge_symptom(merge_fn) -> str:
    """The merge of a split holding tokens with an empty one whose partial output is NaN."""
    partial = torch.tensor([[0.5, -1.0], [float("nan"), float("nan")]])
    lse = torch.tensor([2.0, float("-inf")])
    try:
        out, lse_total = merge_fn(partial, lse)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return f"out {[round(v, 4) for v in out.tolist()]}, lse {float(lse_total):.4f}"


your_module = exercise_module("ex04_online_softmax")
your_merge = getattr(your_module, "merge_splits", None)
print("the contract: out [0.5, -1.0], lse 2.0000")
print("your merge:  ", merge_symptom(your_merge) if your_merge else "(your file does not import)")

# %%
_ = check("ch04.ex4")

# %% [markdown]
# First the merge for one head, on partial results computed directly in PyTorch; the last split is empty and its
# partial output is NaN:

# %%
merge = yours("ch04.ex4", "ex04_online_softmax", "merge_splits", reference_merge)
x_row = torch.randn(40, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 4
v_rows = torch.randn(40, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
ranges = [(0, 16), (16, 32), (32, 40), (40, 40)]  # the last split is empty
lse, parts = [], []
for a, b in ranges:
    if a == b:
        lse.append(float("-inf"))
        parts.append(
            torch.full((3,), float("nan"), dtype=torch.float64)
        )  # whatever an empty split left there
        continue
    lse.append(torch.logsumexp(x_row[a:b], 0).item())
    parts.append(torch.softmax(x_row[a:b], 0) @ v_rows[a:b])
merged, lse_all = merge(torch.stack(parts), torch.tensor(lse, dtype=torch.float64))
print("lse per split:", [f"{v:.4f}" for v in lse])
print(
    f"merged vs one softmax over all 40: max |error| = {(merged - torch.softmax(x_row, 0) @ v_rows).abs().max():.2e}"
)
print(
    f"merged lse {float(lse_all):.4f}, log-sum-exp of all 40 scores {torch.logsumexp(x_row, 0).item():.4f}"
)

# %%
fig = plot_split_weights(lse)
plt.show()

# %% [markdown]
# The kernel cuts the block-table width into `num_splits` equal ranges of logical blocks. With the three
# sequences of section 5 and 3 splits, the short sequence's second and third splits hold no token:

# %%
fig = plot_program_reads(tables_demo, lens_demo, block_size=4, num_blocks=8, num_splits=3)
plt.show()

# %% [markdown]
# Split-K must give the single-pass result, whatever the number of splits, including splits with no token
# (8 splits over a table 4 blocks wide) and a sequence of context 0 (all splits empty: output 0, not NaN). Your
# kernel and your merge (or the engine's kernel and its merge kernel, until both of yours pass):

# %%
if HAS_TRITON:
    split_decode = yours(
        ["ch04.ex2", "ch04.ex4"], "ex04_online_softmax", "paged_decode", paged_attention_decode
    )
    inputs = paged_batch(
        [3, 16, 29], num_heads=4, num_kv_heads=2, head_dim=16, block_size=8, seed=7
    )
    single = split_decode(*inputs)
    diffs = {
        s: (split_decode(*inputs, num_splits=s) - single).abs().max().item() for s in (2, 3, 8)
    }
    empty = split_decode(*inputs[:4], torch.tensor([0, 16, 29], dtype=torch.int32), num_splits=4)
    print(
        "\n".join(
            f"num_splits={s}: max |split - single| < 1e-6: {d < 1e-6}" for s, d in diffs.items()
        )
    )
    print("context 0 with 4 empty splits -> output all zero:", bool((empty[0] == 0).all()))
else:
    print("skipped:", REASON)

# %% [markdown]
# ## 8. Your kernel against your chapter-03 decode
#
# The engine on a CPU runs the PyTorch decode (your chapter-03 `decode_attention`, in chapter 03's last section);
# on a GPU it runs a Triton kernel. Yours is the teaching kernel's twin: it does not run inside the CPU engine
# (the interpreter takes milliseconds per program), but it must agree with both PyTorch decodes on the same
# inputs, with a scale of the model's choosing, one pass or split:

# %%
if HAS_TRITON:
    ch03_decode = yours(
        ["ch03.ex3", "ch03.ex4"], "ex03_block_tables", "decode_attention", paged_attention_gather
    )
    inputs = paged_batch(
        [1, 8, 9, 30], num_heads=8, num_kv_heads=2, head_dim=16, block_size=8, seed=3
    )
    scale = 0.2
    reference_out = paged_attention_gather(*inputs, scale)
    ch03_out = ch03_decode(*inputs, scale)
    lines = []
    for num_splits in (1, 3):
        out = split_decode(*inputs, scale, num_splits)
        lines.append(
            f"kernel, {num_splits} split{'s' if num_splits > 1 else ' '}: max |kernel - reference| = "
            f"{(out - reference_out).abs().max().item():.1e}, max |kernel - chapter-03 decode| = "
            f"{(out - ch03_out).abs().max().item():.1e}"
        )
    print("\n".join(lines))
else:
    print("skipped:", REASON)

# %% [markdown]
# Grade the three build steps from a terminal (the score the course records):
#
# ```bash
# python -m paged grade ch04
# ```
#
# The graded tests compare with a plain softmax on signed inputs large enough that skipping the max
# subtraction overflows, with ragged and fully masked blocks; the kernel writes into outputs pre-filled with
# NaN, through shuffled block tables of two block sizes with NaN in every unused slot, one pass and split; the
# merge meets empty splits holding NaN and rows with no token at all.

# %% [markdown]
# ---
#
# # Part 2 · The performance lab: from the teaching kernel to the tuned one
#
# The teaching kernel is correct. Is it fast? For decode attention on a GPU "fast" has a precise meaning, and we
# compute it first (section 9). Then four steps, one idea each, lead from the teaching kernel to the kernel the
# engine runs, `paged.kernels.paged_attention_decode` (`kernels/paged_attention.py`): the GQA group in tensor
# cores (10), KV tiles that span blocks (11), software pipelining (12) and a split count chosen from the machine
# (13). Each step gives the math, then the lines of code, then what a GPU measured, read from the newest committed
# run (`docs/gpu/*/kernel.json`, written by `scripts/gpu_check.sh`). This notebook runs on a CPU and measures
# nothing on a GPU itself: where no committed run has measured a step, it says so.
#
# ## 9. How fast can decode attention be?
#
# One decode step for $B$ sequences of context $L$, with $H$ query heads over $H_{kv}$ KV heads of dimension
# $D$, stored in $e$ bytes per number, must read every cached key and value once, plus the query and the output:
#
# $$\text{bytes} = \underbrace{2\,B\,L\,H_{kv}\,D\,e}_{K \text{ and } V} + \underbrace{2\,B\,H\,D\,e}_{q \text{ in, } o \text{ out}}.$$
#
# For every query head and token it computes $q \cdot k_t$ and adds $p_t\, v_t$: two multiply-adds per element of
# $D$, so $\text{flops} = 4\,B\,H\,L\,D$. Their ratio, the **arithmetic intensity**, is
#
# $$I = \frac{\text{flops}}{\text{bytes}} \approx \frac{4\,B\,H\,L\,D}{2\,B\,L\,H_{kv}\,D\,e} = \frac{2G}{e},
# \qquad G = \frac{H}{H_{kv}},$$
#
# about $G$ flops per byte in fp16: 4 for a Llama-3-8B layer (32 query heads over 8 KV heads). A GPU's tensor cores
# do far more flops in the time its memory (HBM) delivers one byte, so decode waits on memory whatever the kernel
# does with the numbers: its time is at least bytes / bandwidth. That floor is decode's **roofline**, and a
# kernel's quality is how close it gets to it: **achieved bandwidth = bytes / time**, as a % of the spec-sheet peak.
# The floor for the three shapes of this lab, on an H200's spec sheet (arithmetic, not a measurement):

# %% tags=["nbval-check-output"]
from paged_course.bench import kernel as kbench

peak_h200 = kbench.peak_bandwidth_gbps("NVIDIA H200")
print(kbench.BYTE_FORMULA)
for batch, context in kbench.TARGET_SHAPES:
    moved = kbench.bytes_moved(batch, context, 32, 8, 128, 2)
    print(
        f"batch {batch:2d}, context {context:5d}: {moved / 1e9:5.3f} GB; at {peak_h200:.0f} GB/s at least "
        f"{moved / peak_h200 / 1e3:5.1f} us; intensity {kbench.flops(batch, context, 32, 128) / moved:.2f} flops/byte"
    )

# %% [markdown]
# The same floor at every shape of the benchmark's sweep, on three GPUs at their datasheet bandwidths (2,039 GB/s
# for the A100 80 GB SXM, 3.35 TB/s for the H100 SXM, 4.8 TB/s for the H200): a **model, not measured**. Where a
# committed GPU run measured kernels at a shape, they stand beside it, as a multiple of that GPU's floor
# (`python -m paged bench kernel --roofline`, `paged_course/bench/kernel_roofline.py`):

# %%
from IPython.display import Markdown, display

from paged_course.bench import kernel_roofline

display(Markdown(kernel_roofline.markdown(kernel_roofline.roofline())))

# %% [markdown]
# What did the teaching kernel achieve? The newest committed GPU run (the cell prints its source):

# %%
lab_run = kbench.committed_kernel_runs()
lab_steps = [(step, label) for step, label, *_ in kbench.STEPS]


def show_step(step: str) -> None:
    """One lab step at the three target shapes: measured on a committed GPU run, or said not to be."""
    for batch, context in kbench.TARGET_SHAPES:
        row = (lab_run or {}).get("steps", {}).get((step, batch, context))
        where = f"batch {batch:2d}, context {context:5d}"
        if row is None:
            print(f"{where}: not measured yet: run scripts/gpu_check.sh on a GPU")
        else:
            pct = f" = {row['pct_peak']:.1f}% of peak" if row.get("pct_peak") is not None else ""
            print(f"{where}: {row['us']:7.1f} us, {row['gbps']:6.0f} GB/s{pct}")


if lab_run is None:
    print("no GPU run is committed under docs/gpu/: run scripts/gpu_check.sh on a GPU")
else:
    print(
        f"{lab_run['device']}, {lab_run['time']} ({lab_run['path']}); peak {lab_run['peak_hbm_gbps']:.0f} GB/s"
    )
    print("teaching kernel:")
    show_step("teaching")
    for (batch, context), sdpa in sorted(lab_run["sdpa"].items()):
        if (batch, context) in kbench.TARGET_SHAPES:
            print(
                f"SDPA on contiguous K/V, batch {batch:2d}, context {context:5d}: {sdpa['us']:7.1f} us, "
                f"{sdpa['pct_peak']:.1f}% of peak"
            )
    sizes = {
        bs: us
        for (b, c, bs), us in lab_run["teaching_by_block_size"].items()
        if (b, c) == (64, 4096)
    }
    print(
        "teaching kernel at batch 64, context 4096 by block size:",
        ", ".join(f"{bs}: {us:.0f} us" for bs, us in sorted(sizes.items())),
    )

# %% [markdown]
# In the first committed run (H200, 2026-11-30) the teaching kernel took 1,948 µs at batch 64, context 4,096,
# where the bytes alone need 224 µs: **11.5% of the bandwidth**, and PyTorch's SDPA on contiguous K/V took
# 250 µs. At batch 1, context 8,192 it used under 1% (8 programs for the whole GPU; split-K helps, section 13).
# Look at the block sizes too: block 32, which gives each loop step twice the bytes of block 16, was *slower*
# (2,873 µs against 1,948 µs). A kernel limited by memory would not slow down when it asks for more bytes at
# once; this one is limited by something else, the work it does around each byte. The broadcast-and-sum is not
# free just because decode reads many bytes: this kernel never got close enough to the memory limit for its
# arithmetic to hide behind the loads. The next four steps remove that work, one idea at a time.
#
# ## 10. Step 1 · The GQA group as the rows of a matrix product (`tl.dot`)
#
# Fix a sequence and a KV head $g$. Its $G$ query heads form a matrix $Q_g \in \mathbb{R}^{G \times D}$, and a
# tile of $N$ cached tokens gives $K, V \in \mathbb{R}^{N \times D}$. The loop body is two matrix products:
#
# $$S = c\; Q_g K^\top \in \mathbb{R}^{G \times N}, \qquad A \leftarrow \alpha \odot A + P\,V, \quad P = e^{S - m}.$$
#
# The teaching kernel forms $S$ as `sum(q[:, None, :] * k[None, :, :], axis=2)`, which first materializes all
# $G \times N \times D$ products: with $G = 4$, $D = 128$ that is 8,192 fp32 numbers per program for a block of 16 and
# 16,384 for a block of 32, work and register traffic that grow with the tile while the bytes it serves do not
# (and the run above found block 32 slower than 16). `tl.dot(q, tl.trans(k))` hands the product to the tensor
# cores, which accumulate in fp32 and never materialize anything of size $G \times N \times D$.
#
# Tensor cores multiply tiles of at least 16 rows, and a group has 1 to 8 heads. So the tile's **M dimension is the
# group, padded to 16 rows**: `BLOCK_M = max(16, next_pow2(G))`; the padded rows load zeros (`other=0.0`) and are
# never stored. At $G = 4$, 12 of the 16 rows compute nothing useful; that is free, because decode has arithmetic
# to spare ($I \approx G$). What matters is that each K/V tile is read from memory **once per KV head** and serves
# the whole group; reading it once per query head would multiply the bytes by $G$. The scores stay fp32 (`tl.dot`
# accumulates in fp32, so fp16 scores cannot overflow: the all-32.0 case of section 6), and $P$ is rounded to the values'
# dtype for the second product, as FlashAttention does. In the tuned kernel:


# %%
def show_lines(fn, *needles: str) -> None:
    """Print the lines of a function's source that contain any of `needles`, with their line numbers."""
    lines = inspect.getsource(getattr(fn, "fn", fn)).splitlines()
    for i, line in enumerate(lines):
        if any(n in line for n in needles):
            print(f"{i + 1:3d}  {line}")


if HAS_TRITON:
    from paged.kernels import paged_attention as tuned

    show_lines(
        tuned._decode_kernel,
        "offs_m =",
        "m_mask, d_mask",
        "heads =",
        "q = tl.load",
        "mask=m_mask[:, None]",
        "s = tl.dot",
        "acc = acc * alpha",
    )
    print("\nmeasured (+ group in tl.dot, tile = one block of 16, no pipelining, one split):")
    show_step("dot")
else:
    print("skipped:", REASON)

# %% [markdown]
# ## 11. Step 2 · KV tiles that span blocks
#
# With one block per loop step, the *block size* decides how much each iteration reads: 16 tokens, then a
# block-table lookup, then the next 16. But the block size is a memory-management choice (chapter 01: internal
# fragmentation against table size); the kernel should choose its own tile. Let a tile be $N$ consecutive
# positions $t = jN + n$, $n = 0 \dots N-1$. Each position finds its own block and slot:
#
# $$\text{block}(t) = \mathrm{bt}\big[\lfloor t / B \rfloor\big], \qquad \text{slot}(t) = t \bmod B, \qquad
# \text{address}(t) = \text{block}(t)\, s_{\text{block}} + \text{slot}(t)\, s_{\text{token}} + g\, s_{\text{head}}.$$
#
# A tile of $N = 64$ positions gathers 4 blocks of 16, 2 blocks of 32, or half a block of 128. The loop runs
# $\lceil L/N \rceil$ times instead of $\lceil L/B \rceil$, and each iteration asks memory for $2NDe$ bytes at once (32 KB
# at $N = 64$, $D = 128$, fp16, against 8 KB for one block of 16). Positions past the context are masked: they
# look up no block and load no K/V (`other=0`), and their scores are $-\infty$. vLLM's Triton attention
# (`vllm/v1/attention/ops/triton_unified_attention.py`) tiles the same way: its tile is independent of the page
# size. One sequence of context 19 in blocks of 4, tiles of 8:

# %%
fig = plot_tile_gather([5, 2, 7, 0, 3], context_len=19, block_size=4, block_n=8, num_blocks=8)
plt.show()

# %%
if HAS_TRITON:
    show_lines(
        tuned._decode_kernel,
        "for tile in",
        "tokens = tile",
        "t_mask = tokens",
        "physical = tl.load",
        "slot = tokens",
        "k = tl.load",
        "v = tl.load",
    )
    print("\nmeasured (+ tiles of 64 tokens across blocks, no pipelining, one split):")
    show_step("tiles")

# %% [markdown]
# ## 12. Step 3 · Keep several tiles in flight: software pipelining
#
# A load from HBM takes long to come back compared with the arithmetic on it. If a program issues a tile's loads,
# waits, computes, and only then issues the next loads, memory idles while it computes and the multiprocessor
# idles while it waits. Little's law says how much must be on its way to sustain a bandwidth:
#
# $$\text{bytes in flight} = \text{bandwidth} \times \text{latency}.$$
#
# With `num_stages = s`, Triton's compiler rewrites the loop so that the loads of the next $s - 1$ tiles are issued
# into shared-memory buffers while the current tile is computed: software pipelining. The kernel's source does
# not change; `num_stages` is a launch parameter. Each stage holds one K and one V tile, $2NDe$ bytes, so the tile
# size and the number of stages share the multiprocessor's shared memory. `decode_config` picks
# $N = 32768 / (2De)$ tokens (a 32 KB stage), clamped to 16..64, with 3 stages where the GPU's shared memory per
# program holds them, else 2 (the interpreter runs the loop as written; stages mean nothing there):

# %% tags=["nbval-check-output"]
for head_dim in (64, 128, 256):
    for name, elem in (("fp16/bf16", 2), ("fp32", 4)):
        n = max(16, min(64, 32768 // (2 * head_dim * elem)))
        print(
            f"head dim {head_dim:3d} {name:9s}: BLOCK_N = {n:2d} tokens, one stage = {2 * n * head_dim * elem // 1024:2d} KB"
        )

# %%
if HAS_TRITON:
    show_lines(tuned.decode_config, "return {", "stage =", "block_n =")
    print("\nmeasured (+ num_stages from decode_config, one split):")
    show_step("pipeline")

# %% [markdown]
# ## 13. Step 4 · How many splits? Fill the machine, no more
#
# Section 7 split a sequence's tiles over several programs. How many? A GPU runs a fixed number of programs at
# once, $S$ slots (its multiprocessors times the programs each one holds). A launch of $P$ programs runs in
# $\lceil P/S \rceil$ **waves**, and the last wave may be mostly empty. With $s$ splits there are $P = s\,B\,H_{kv}$
# programs, and the fraction of slot-time doing work, the wave efficiency, is
#
# $$\eta(s) = \frac{w}{\lceil w \rceil}, \qquad w = \frac{s\,B\,H_{kv}}{S}.$$
#
# Splits are not free either: each writes a partial output and its log-sum-exp, and the merge kernel reads them
# back. `paged.kernels.choose_num_splits` follows FlashAttention 2's rule (`num_splits_heuristic` in
# `csrc/flash_attn/flash_api.cpp`, read at FlashAttention v2.8.3): no split once the $B\,H_{kv}$ programs already
# fill 80% of the slots; otherwise, among the split counts that shorten the longest split ($\lceil T/s \rceil$ must
# drop, for $T$ tiles per sequence), the smallest whose efficiency is within 85% of the best. FlashAttention 2 counts
# two programs per SM (128 threads each) as its slots, and so does this kernel. FlashAttention 3's version
# (`hopper/heuristics.h`, same release) keeps the 80% and 85% thresholds, counts one slot per SM, drops the
# "must shorten the longest split" filter and adds two rules: never split a sequence of at most 4 KV tiles, and
# split even a full grid when one KV head is larger than the L2 cache it assumes (50 MB), for long non-causal
# attention with many query tiles. `num_splits=None` applies FlashAttention 2's rule with $S$ = 2 x the SM count
# (`torch.cuda.get_device_properties(...).multi_processor_count`) and $T$ from the block table's width, so the
# launch needs no device sync; the interpreter pretends $S = 4$. For a GPU with 132 SMs, like an H200 (264 slots), 8 KV heads and tiles of 64:

# %% tags=["nbval-check-output"]
from paged.kernels import choose_num_splits

print("batch \\ context " + "".join(f"{c:>8d}" for c in (1024, 8192, 32768)))
for batch in (1, 4, 16, 64):
    print(
        f"{batch:14d}  "
        + "".join(f"{choose_num_splits(batch * 8, c // 64, 264):8d}" for c in (1024, 8192, 32768))
    )

# %%
if lab_run is not None and lab_run["split_k"]:
    for r in lab_run["split_k"]:
        times = {int(s): ms for s, ms in r["ms_by_splits"].items()}
        line = f"batch {r['batch']}, context {r['context']:5d}: best forced count {r['best_splits']:2d}"
        if "heuristic_splits" in r:
            line += f"; the heuristic picks {r['heuristic_splits']} ({r['heuristic_over_best']:.2f}x the best time)"
        else:
            line += f" ({times[1] / times[int(r['best_splits'])]:.1f}x faster than one pass; teaching kernel)"
        print(line)
print("measured (+ num_splits=None, the heuristic):")
show_step("splits")

# %% [markdown]
# ## 14. The tuned kernel, whole, and checked on this CPU
#
# All four steps together, `paged.kernels.paged_attention._decode_kernel` (the exponentials are base 2: $e^x =
# 2^{x \log_2 e}$, with $\log_2 e$ folded into the scale on the host; the log-sum-exp is converted back to base $e$
# for the merge kernel of section 7, which is reused unchanged):

# %%
if HAS_TRITON:
    show_source(tuned._decode_kernel, first="seq, kv_head, split =", last="tl.store(LSE")

# %% [markdown]
# The same checks as section 6, on the tuned kernel: shuffled tables, NaN in every unused slot, contexts that end
# inside a tile or span two, group 7, forced and chosen split counts. (bf16 runs on a GPU only: the interpreter's
# bf16 `tl.dot` multiplies raw bit patterns, Triton issue 11584, so there the kernel's launcher upcasts to fp32.)

# %% tags=["nbval-check-output"]
if HAS_TRITON:
    from paged.kernels import paged_attention_decode

    report = []
    for dtype, heads, kv_heads, head_dim, bs in cases[:3]:
        inputs = paged_batch(
            [1, bs, bs + 1, 2 * bs + 3, 70], heads, kv_heads, head_dim, bs, dtype=dtype, seed=heads
        )
        exact = paged_attention_gather(*(t.float() if t.is_floating_point() else t for t in inputs))
        for num_splits in (1, 3, None):
            err = (
                (paged_attention_decode(*inputs, num_splits=num_splits).float() - exact)
                .abs()
                .max()
                .item()
            )
            tol, digits = {torch.float32: (1e-5, 5), torch.float16: (2e-3, 2)}[dtype]
            report.append(
                f"{str(dtype):13s} heads {heads:2d}/{kv_heads} dim {head_dim:2d} bs {bs:2d} splits "
                f"{str(num_splits):4s}: max |error| = {err:.{digits}f} (< {tol:g}: {err < tol})"
            )
    print("\n".join(report))
else:
    print("skipped:", REASON)

# %% [markdown]
# ## 15. The lab on a GPU, step by step
#
# `python -m paged bench kernel` (run by `scripts/gpu_check.sh` on a GPU) measures every step above at the three
# shapes, for fp16 with 32 query heads over 8 KV heads of dim 128, each side timed as the best of several calls
# after untimed warm-up calls, with the L2 cache flushed before each call (a buffer larger than L2 is written), so
# that no call finds K/V left over from the last one. It also times the tuned kernel against the same kernel on a
# contiguous pool (section 16), against PyTorch's SDPA on contiguous K/V and against flash-attn and FlashInfer when
# they are installed; sweeps batch x context x block size; forces split counts against the heuristic's pick; and
# plots a roofline (achieved bandwidth against arithmetic intensity for GQA groups 1 to 32). The committed run:

# %%
fig = plot_lab_steps(lab_run, lab_steps, kbench.TARGET_SHAPES)
plt.show()
if lab_run is not None:
    print(
        f"what the run of {lab_run['time'][:10]} measured, for the {lab_run['sweep_kernel']} kernel:"
    )
    for name, verdict in lab_run["targets"].items():
        value = verdict.rsplit(" (", 1)[0]  # the measured value, without the benchmark's threshold
        shape = re.match(r"B=(\d+) ctx=(\d+) >=.*peak HBM", name)
        if shape:
            print(f"  HBM bandwidth at batch {shape[1]}, context {shape[2]}: {value} of peak")
        elif name.startswith("paged <="):
            print(f"  paged / contiguous kernel time: {value}")
        else:
            print(f"  {name.split(' >= ')[0].split(' <= ')[0]}: {value}")
if lab_run is None or lab_run["sweep_kernel"] == "teaching":
    print(
        "the tuned kernel on a GPU: not measured yet (the committed run timed the teaching kernel); "
        "run scripts/gpu_check.sh on a GPU"
    )

# %% [markdown]
# On this CPU the same benchmark runs the kernels in Triton's interpreter on tiny shapes: correctness columns,
# and interpreter seconds that say nothing about a GPU:

# %%
if HAS_TRITON:
    for r in kbench.cpu_check(shapes=[(2, 70, 8, None)]):
        print(
            f"batch {r['batch']} context {r['context']} bs {r['block_size']} {r['dtype']}: max |error| tuned "
            f"{r['tuned_max_err']:.1e}, teaching {r['teaching_max_err']:.1e}; paged == contiguous "
            f"{r['paged_equals_contiguous']}; interpreter {r['tuned_interpreter_s']:.2f} s / "
            f"{r['teaching_interpreter_s']:.2f} s per call (CPU, not kernel speed)"
        )

# %% [markdown]
# ## 16. What paging costs at the roofline (ledger row E2)
#
# The implementation article (§3.1) says the paged kernel is "only 2-5% slower than contiguous attention". The first committed
# H200 run seems to agree: the teaching kernel took 0.995-1.024x the time of the same kernel on a contiguous pool
# holding the same values (an identity block table). But that kernel ran at about a tenth of the bandwidth,
# limited by the work it does around each byte rather than by memory: a block-table lookup per block disappears
# in the time it spends on everything else. So those 2.4% say little about what paging costs a kernel that runs at the memory's
# speed.
#
# The paper measured something else: vLLM's paged kernel had **20-26% higher latency than FasterTransformer's**
# attention kernel (Kwon et al. 2023, §7.1, Fig. 18a), and names the causes: block-table lookups (a dependent
# load before a block's K/V can be requested), extra branches (masking, the partial last block) and variable
# sequence lengths in one batch (programs of one launch finishing at different times). In a kernel that streams
# memory at full speed none of that is hidden: every cycle not spent moving bytes adds to the time. It also
# compares two different kernels, not one kernel on two layouts; end to end the paper saw a small cost, because
# attention is one operator among many.
#
# The benchmark re-measures it where it matters, on the tuned kernel: shuffled block tables against an identity
# table over a contiguous pool at batch 64, context 4,096, block sizes 8, 16 and 32 (the article's "2-5%" is the claim under test),
# next to SDPA and flash-attn / FlashInfer on contiguous memory. The committed numbers and the kernel they were
# measured on:

# %%
if lab_run is None:
    print("paged / contiguous: not measured yet: run scripts/gpu_check.sh on a GPU")
else:
    at_roofline = {bs: r for (b, c, bs), r in lab_run["paging"].items() if (b, c) == (64, 4096)}
    print(
        f"{lab_run['sweep_kernel']} kernel ({lab_run['device']}): paged / contiguous over the whole sweep "
        f"{min(lab_run['paging'].values()):.3f}-{max(lab_run['paging'].values()):.3f}; at batch 64, context 4096: "
        + ", ".join(f"block {bs}: {r:.3f}" for bs, r in sorted(at_roofline.items()))
    )
    if lab_run["sweep_kernel"] == "teaching":
        print("tuned kernel at the roofline: not measured yet: run scripts/gpu_check.sh on a GPU")

# %% [markdown]
# ## 17. Make it faster (ch04.ex3)
#
# **`exercises/ex04_fast_decode.py`** holds a kernel of your own, `_learner_kernel`, and its launch config
# `CONFIG`, in one marked region (ch04.ex3). It starts as the teaching kernel: the frame of `_decode_kernel` around
# a call of your `walk_blocks`, so it is correct once your ch04.ex2 is (until then it reports every case wrong),
# and slow. Replace the call by a loop of your own, built from the ideas of this lab: the GQA group as the rows of
# `tl.dot`, tiles of `BLOCK_N` tokens gathered across blocks, `num_stages`. The file's docstring states the
# contract. What is graded runs on any machine: the kernel's results in the interpreter, for tiles of 16 to 64
# tokens over blocks of 8 to 32, and how it compiles for an A100 (next section): tensor-core instructions, no
# spill, 16-byte K/V loads. The starter is correct but fails the second half, so the region is all or nothing.
# Its speed on a GPU is yours to measure:
#
# ```bash
# python -c "from exercises.ex04_fast_decode import self_check; self_check()"
# python -m paged bench kernel --impl exercises   # on a GPU: GB/s and % of peak against the teaching and tuned kernels
# ```
#
# The self-check of the file as it is now (small cases, in the interpreter on a CPU):

# %%
if HAS_TRITON and (ex04_fast := exercise_module("ex04_fast_decode")) is not None:
    try:
        ex04_fast.self_check()
    except Exception as exc:  # a learner's work in progress must not stop the chapter
        print(
            f"{impl_package()}/ex04_fast_decode.py does not pass yet: {type(exc).__name__}: {exc}"
        )

# %% [markdown]
# ## 18. What the compiler made of your kernel
#
# The source is half of a kernel. On a GPU the first launch compiles it, and the compiler decides how many
# registers each thread gets, whether values that do not fit **spill** to local memory (a per-thread region of
# slow device memory), how much shared memory a program takes, how wide each load from memory is, whether the
# loads of the next tiles go out early (`cp.async`, the instruction behind `num_stages`), and which tensor-core
# instruction a `tl.dot` becomes. The interpreter shows none of it. Triton compiles for a GPU without one, though:
# `triton.compile` turns a kernel into the GPU's assembly (PTX) and binary (a cubin), and `cuobjdump`, shipped
# inside the Triton wheel, reads the registers, the stack and the static shared memory from the binary.
#
# `paged_course.bench.kernel_compile.compile_lab` does that for the teaching kernel, the tuned kernel (also without
# its hints, below) and your `_learner_kernel` of `ex04_fast_decode.py`, at the engine's decode step of batch 64,
# context 4,096 (fp16, 32 query heads over 8 KV heads of dim 128, block size 16), for an A100 (`sm_80`) and an H200
# (`sm_90`). It compiles in a separate process, because this one decorated the kernels for the interpreter; the
# first run takes 10-30 s, later ones come from Triton's cache. Triton has wheels for Linux only: on macOS or
# Windows the cell says so and skips. The same tool, `python -m paged bench kernel --compile`, compiles every
# kernel the engine launches at every configuration, and the course's CI fails on a spill or a narrow K/V load.

# %%
from paged.kernels import GPUS
from paged_course.bench import kernel_compile
from paged_course.bench.kernel_compile_report import text_table

compiled = []
if not HAS_TRITON:
    print("skipped:", REASON)
else:
    try:
        compiled = kernel_compile.compile_lab(impl_package())
    except (RuntimeError, OSError) as exc:  # e.g. no cuobjdump in this Triton build
        print(f"could not compile for a GPU here: {type(exc).__name__}: {exc}")
    print(text_table([r for r in compiled if not r["kernel"].startswith("prefill")]))

# %% [markdown]
# Your row is *yours*. The check of ch04.ex3 runs its results in the interpreter, then builds your kernel for an
# A100 once more (from Triton's cache when nothing changed) and asks for `mma` instructions, no stack and no K/V
# load narrower than 16 bytes:

# %%
_ = check("ch04.ex3")

# %% [markdown]
# Reading a row: *registers* per thread (at most 255); *stack B*, bytes of local memory per thread, nonzero when
# registers ran out; *shared KB* per program; *K/V loads*, the PTX's load instructions for K and V tiles counted
# by width (16 bytes, the widest a thread can load, or narrower; counted in the program text, not executed);
# *cp.async*, asynchronous copies from memory into shared memory (software pipelining); *mma / wgmma*, Ampere's
# and Hopper's tensor-core instructions (the decode tile has 16 rows, too few for Hopper's 64-row `wgmma`, so it
# runs `mma` on both); *programs per SM*, below.
#
# ### The hints a launch passes: 16-byte loads or 2-byte loads
#
# At every launch Triton's JIT looks at the arguments before it compiles: a pointer whose address is a multiple of
# 16 bytes, and an integer divisible by 16 (a stride of 1,024 elements), are marked `tt.divisibility = 16` in the
# kernel's signature (an integer equal to 1 even becomes a constant). With those marks the compiler can prove that
# a row of K, `head_dim` contiguous fp16 values starting at `block * stride_k_block + slot * stride_k_tok + ...`,
# begins on a 16-byte boundary, and load 8 values with one instruction. The pool's layout makes every stride a
# multiple of `head_dim` and PyTorch aligns its allocations, so the engine's launches always carry the marks. The
# row *tuned, no hints* is the same source compiled without them:

# %%
if compiled:
    for gpu in kernel_compile.TARGETS:
        hinted, blind = (
            next(r for r in compiled if r["kernel"] == name and r["gpu"] == gpu)
            for name in ("tuned", "tuned, no hints")
        )
        for label, r in (("with hints", hinted), ("without", blind)):
            widths = ", ".join(f"{n} of {w} B" for w, n in sorted(r["loads"]["K"].items()))
            print(
                f"{gpu} {label:10s}: {r['registers']:3d} registers, {r['stack_bytes']:3d} B of stack, "
                f"K tile loads: {widths}; {r['cp_async']} cp.async"
            )

# %% [markdown]
# With Triton 3.9 the A100 build goes from 116 registers, no stack and 35 `cp.async` to 255 registers, a 568-byte
# stack and no `cp.async` at all (the H200 build: 120 registers against 255 and a 256-byte stack). Each thread
# reads its 128 bytes of a K tile with 8 loads of 16 bytes in the first build (16 in the program text: the
# pipelined loop has a prologue) and with 64 loads of 2 bytes in the second. Without the proof of alignment
# every fp16 value is its own load with its own 64-bit address, the addresses take a large share of the
# registers, the rest spills to local memory (which is device memory), and the pipelining is gone: the kernel
# would add memory traffic to a step that already waits on memory. The lesson for your kernel: pass strides as
# integer arguments (the JIT sees their values) and build addresses from them; where the JIT cannot see a
# property, `tl.multiple_of(x, 16)` states it in the source.
#
# ### Occupancy: how many programs one multiprocessor holds
#
# An SM (streaming multiprocessor) keeps several programs resident and switches between them while their loads
# are in flight. It holds as many as each of three budgets allows, and the smallest wins:
#
# - **registers**: 65,536 per SM, given to each warp (32 threads) in units of 256: a program of $W$ warps at $R$
#   registers per thread costs $W \lceil 32R/256 \rceil \cdot 256$;
# - **shared memory**: 164 KB per SM on an A100, 228 KB on an H100 or H200 (the CUDA programming guide's table
#   per compute capability), each program taking what it allocates plus 1 KB the driver reserves;
# - **warps**: 64 per SM, $64 / W$ programs.
#
# The tuned kernel's numbers, worked out:

# %%
for r in [r for r in compiled if r["kernel"] in ("teaching", "tuned")]:
    spec, warps = GPUS[r["gpu"]], r["num_warps"]
    per_warp = -(-32 * r["registers"] // 256) * 256
    occ = kernel_compile.occupancy(spec, r["registers"], r["shared_bytes"], warps)["limits"]
    print(
        f"{r['kernel']:8s} on {r['gpu']}: registers {spec.regs_per_sm} // ({warps} x {per_warp}) = "
        f"{occ['registers']}; shared {spec.smem_per_sm // 1024} KB // ({r['shared_bytes'] / 1024:.1f} + 1) KB = "
        f"{occ['shared memory']}; warps 64 // {warps} = {occ['warps']}"
    )

# %% [markdown]
# Four tuned programs fit per SM at head dim 128, by registers on both GPUs and by shared memory too on the A100.
# Occupancy matters to decode through Little's law (section 12): the bytes an SM has in flight are its resident
# programs times the tiles each one has requested, so fewer programs per SM means fewer bytes on their way. It
# also explains a choice in section 13: the split rule counts two programs per SM, while the compiler's numbers
# say four fit (seven or eight at head dim 64: `docs/gpu/static/kernels.md` has every kernel at every
# configuration). Whether counting four would pick better split counts is a question for a GPU measurement;
# until one is committed, that is a model, not measured.
#
# ### The prefill kernel on an A100: a tile that does not fit
#
# The chunked-prefill kernel (`kernels/prefill_attention.py`) computes a tile of 64 query tokens against tiles of
# KV tokens with the same online softmax. At head dim 128 in fp16, the same cell's compile also built it with the
# engine's tiles and with 64 x 64 tiles:

# %%
if compiled:
    print(text_table([r for r in compiled if r["kernel"].startswith("prefill")]))
    for r in compiled:
        if r["kernel"].startswith("prefill") and "error" not in r:
            tile = f"{r['launch']['BLOCK_M']} x {r['launch']['BLOCK_N']}"
            print(f"{r['kernel']:16s} on {r['gpu']}: tile {tile}, {r['num_warps']} warps")

# %% [markdown]
# At 64 x 64 the A100 build needs every one of the 255 registers a thread has and spills 16 bytes per thread;
# the H200 build of the same source fits in about 190. Ampere's `mma` takes both operands from registers: a
# program of 4 warps holds the fp32 accumulator $64 \times 128$ (64 registers per thread), the fp16 query tile
# (32), the fp32 scores $64 \times 64$ (32) and their fp16 probabilities (16), 144 of the 255 before a single K or
# V fragment or address. Hopper's `wgmma` reads its operands from shared memory instead. So the engine's launch
# config is chosen per GPU (`kernels/launch_config.py`, `prefill_config`): KV tiles of 32 tokens before `sm_90`,
# which halves the scores and the probabilities and leaves 188 registers and no stack. Eight warps, the other
# obvious cure, compile to 128 registers and still spill. None of this needed a GPU, and none of it says how fast
# either kernel runs: that is a measurement.

# %% [markdown]
# ## Summary
#
# - The online softmax keeps a running max `m`, denominator `l` and weighted sum `acc`; when the max grows,
#   `l` and `acc` are rescaled by `exp(m_old - m_new)`; the output is `acc / l`. One pass, exponents <= 0.
# - The fragmentation article's sketch (E1) never keeps the previous max and divides by the output's own sum; the fix is to
#   carry `m` and `l` and divide by `l`.
# - The teaching kernel runs one program per (sequence, KV head) serving the whole GQA group, looks up each block
#   in the block table, masks the last block with explicit `other=` fills, and accumulates in fp32.
# - Split-K gives several programs per sequence; partial results merge exactly through their log-sum-exp, and
#   an empty split has weight 0.
# - Decode reads every K/V byte once and does about $G$ flops per byte: its floor is bytes / bandwidth. The
#   teaching kernel reached 11.5% of an H200's bandwidth in the committed run, slower, not faster, with bigger
#   blocks: not limited by memory.
# - The tuned kernel puts the group in `tl.dot`'s rows (padded to 16), reads tiles of 64 tokens gathered across
#   blocks, pipelines the loads, and picks its split count from the SM count, the batch and the context. Its GPU
#   numbers come from `scripts/gpu_check.sh`; until a run is committed, this chapter says they are not measured.
# - Triton compiles for a GPU without one. What the compiler made of a kernel (registers, spills, shared memory,
#   16-byte or 2-byte loads, `cp.async`) decides its speed as much as its source; the alignment hints of a launch
#   turn 2-byte loads into 16-byte ones, and registers and shared memory decide how many programs an SM holds.
# - Paging's cost (E2) must be measured at the roofline: the 2.4% of the teaching kernel was hidden by its slowness;
#   the paper's 20-26% compares vLLM's kernel with FasterTransformer's, from lookups, branches and ragged lengths.
# - Next, chapter 05 shares blocks between sequences: prefix caching and copy-on-write.
#
# ## Further reading
#
# - Milakov & Gimelshein, *Online normalizer calculation for softmax* (2018): the one-pass recurrence for `m` and `l`.
# - Dao et al., *FlashAttention* (NeurIPS 2022), §3.1: tiling attention with the online softmax; Dao, Haziza,
#   Massa, Sizov, *Flash-Decoding for long-context inference* (2023): split-K for decode, merged by log-sum-exp.
# - NVIDIA, *CUDA C++ Programming Guide*: the technical specifications per compute capability (registers, shared
#   memory and warps per SM) and the occupancy discussion in its performance guidelines.
# - Kwon et al., *PagedAttention* (SOSP 2023), §4.1 (attention block by block through the block table) and §5.1
#   (the fused kernel), §7.1 (its measured cost).
# - vLLM v0's CUDA kernels: `csrc/attention/paged_attention_v1.cu` (one pass) and `csrc/attention/paged_attention_v2.cu`
#   (partitions plus a reduce kernel: split-K), both built on `csrc/attention/attention_kernels.cuh` (in older
#   versions all in `csrc/attention/attention_kernels.cu`).
# - vLLM's Triton kernels (paths of 0.10.2; by 0.34.0 they moved to `vllm/v1/attention/ops/`):
#   `vllm/attention/ops/triton_decode_attention.py` (grouped decode with split stages),
#   `vllm/attention/ops/triton_unified_attention.py` (tiles independent of the page size; not yet in 0.8.5),
#   `vllm/attention/ops/merge_attn_states.py` and `csrc/attention/merge_attn_states.cu` (merging partial attention
#   results by their log-sum-exp).
