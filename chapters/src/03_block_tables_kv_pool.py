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
# # 03 · Block tables and the KV pool
#
# Chapter 02 handed out block *ids*. This chapter gives them memory: one preallocated tensor, the
# **KV cache pool**, where every layer keeps the keys and values of every token of every sequence, in
# blocks of `block_size` tokens. A sequence finds its tokens through its **block table**, and one
# decode step of attention reads them back through the same table.
#
# **You will build** three parts of the engine, with the exact interfaces the engine calls
# (`paged/engine/parts.py`), in four steps, all in **`exercises/ex03_block_tables.py`**:
#
# | step | region | engine part | what it does |
# |---|---|---|---|
# | 1 | `ch03.ex1` | `slot_mapping` | the pool slot of every token one engine step computes |
# | 2 | `ch03.ex2` | `write_kv` | store one layer's new keys and values at those slots |
# | 3 | `ch03.ex3` | `decode_attention`, first half: `gather_kv` | each sequence's K/V, gathered through its table |
# | 4 | `ch03.ex4` | `decode_attention`, second half | one query per sequence attends to its context (GQA, masked, fp32) |
#
# and at the end the engine runs a small model on **your** three parts, token for token against the
# reference engine.
#
# **You will learn to**
#
# 1. map a token position to its physical **slot** with the slot formula, for one sequence and for a packed batch;
# 2. write a step's keys and values into the pool by **slot mapping**, in place;
# 3. explain the pool's layout, `[num_blocks, block_size, num_kv_heads, head_dim]` per layer, and why
#    vLLM v1, FlashAttention and FlashInfer all use it ("NHD");
# 4. compute decode attention over the paged pool by **gathering** through the block tables, with grouped-query
#    attention (GQA), and check it against PyTorch's `scaled_dot_product_attention`;
# 5. correct a common misreading of vLLM (ledger row E6, from the implementation article, `docs/sources.md`): one
#    block table per sequence serves *every* layer.
#
# After each build step a cell `check("ch03.exK")` runs that step's graded tests on your file and prints the
# first failing case in words. The chapter then goes on with your piece when it passes, and with the
# reference (saying so in one line) when it does not, so every cell runs even before you write anything.
# Stuck? `hint("ch03.exK")` gives a nudge, a second call a stronger one; `solution("ch03.exK")` prints the
# reference answer, where your copy of the course ships it.

# %%
import statistics
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "paged_course").is_dir())
if str(ROOT) not in sys.path:  # the notebook runs in chapters/; the exercises live at the root
    sys.path.insert(0, str(ROOT))

from paged.core.allocator import BlockAllocator
from paged.core.block_table import BlockTable
from paged.core.block_table import slot_mapping as reference_slot_mapping
from paged.worker.attention import write_kv as reference_write_kv
from paged.worker.kv_cache import KVCache
from paged_course.check import check, exercise_module, hint, learner_or_reference, solution
from paged_course.engine_views import describe, slot
from paged_course.reference.memory import KVSpec, kv_spec
from paged_course.predict import reveal
from paged_course.reference import (
    contiguous_attention,
    gather_kv,
    kv_cache_from_budget,
    pad_block_tables,
    paged_attention_blockwise,
    paged_attention_gather,
    select_backend,
)
from paged_course.viz.kv_pool import plot_memory_order, plot_pool, plot_slot_mapping, slot_explorer


def yours(exercises, name, reference):
    """Your `name` when the regions `exercises` pass their checks, else `reference` (one line says so)."""
    module = exercise_module("ex03_block_tables")
    if module is None:
        print(f"using the reference for {name}")
        return reference
    chosen = learner_or_reference(exercises, getattr(module, name), reference)
    if chosen is not reference:
        where = Path(module.__file__).relative_to(Path(module.__file__).parents[1])
        ids = [exercises] if isinstance(exercises, str) else exercises
        print(
            f"using {name} from {where} ({' and '.join(ids)} pass{'es' if len(ids) == 1 else ''})"
        )
    return chosen


torch.manual_seed(0)
torch.set_num_threads(2)
print(
    "attention backend on this machine:",
    select_backend("cuda" if torch.cuda.is_available() else "cpu"),
)

# %% [markdown]
# ## 1. Logical blocks, physical blocks, slots
#
# A sequence sees its tokens as consecutive *logical* blocks: positions `0..bs-1` in logical block 0,
# `bs..2bs-1` in logical block 1, and so on. Its block table maps logical block `i` to the *physical*
# block `table[i]` that the allocator handed out, which can be anywhere in the pool: an operating
# system's page table, with blocks as pages and tokens as bytes (PagedAttention paper §4.1-4.2).
#
# Flatten the pool of one layer to `[num_blocks * block_size]` rows, one per token: the row of position
# `p` is its **slot**
#
# $$\text{slot}(p) = \text{table}[\,p \,/\!/\, \text{bs}\,] \cdot \text{bs} + p \bmod \text{bs}.$$
#
# Blocks are allocated one at a time as sequences grow, so when several sequences decode together their
# blocks interleave. Three sequences below grow round-robin through a `BlockAllocator` of 8 blocks; `B`
# finishes early and returns its blocks to the free queue, and the newcomer `D` gets one of them: a block
# needs no particular neighbour, so any free block serves.

# %%
BS, NUM_BLOCKS = 4, 8
allocator = BlockAllocator(NUM_BLOCKS)
tables = {name: BlockTable(BS) for name in "ABC"}
targets = {"A": 10, "B": 6, "C": 9}
for step in range(10):
    if step == 7:  # B finishes: its blocks go back to the free queue
        for b in tables["B"]:
            allocator.free(b)
        tables["B"] = BlockTable(BS)
        targets["B"] = 0
    for name, table in tables.items():
        if table.num_tokens < targets[name]:
            if table.num_tokens == len(table) * BS:  # the last block is full: take a new one
                table.block_ids.append(allocator.allocate())
            table.num_tokens += 1
tables["D"] = BlockTable(BS, [allocator.allocate()], num_tokens=3)  # a newcomer gets a freed block
for name, table in tables.items():
    print(f"{name}: {table.num_tokens:2d} tokens, block table {table.block_ids}")
print("free blocks:", allocator.num_free_blocks)
fig = plot_pool(
    {n: (t.block_ids, t.num_tokens) for n, t in tables.items() if t.num_tokens}, NUM_BLOCKS, BS
)
plt.show()

# %% [markdown]
# Hatched slots are reserved in a sequence's last block but not written yet: the only waste of a paged
# cache, at most `block_size - 1` slots per sequence (claim C3, measured in chapter 01).
#
# Follow one token to its slot. Move the slider (in Jupyter) to pick a position; the static picture below it
# shows the last token.

# %%
table_a = tables["A"]
slot_explorer(table_a.block_ids, table_a.num_tokens, BS, NUM_BLOCKS)

# %%
fig = plot_slot_mapping(
    table_a.block_ids, table_a.num_tokens, BS, NUM_BLOCKS, highlight=table_a.num_tokens - 1
)
plt.show()

# %% [markdown]
# **The block boundary.** With `bs = 4` and the table `[10, 11, 12]`, the last token of a
# sequence of length `L` is position `L - 1`. At `L = 8` it is offset 3 of logical block 1, so slot
# `11 * 4 + 3 = 47`; an off-by-one that uses `L // 4` instead of `(L - 1) // 4` would write into block 12.

# %% tags=["nbval-check-output"]
boundary = BlockTable(4, [10, 11, 12])
print("L :", " ".join(f"{L:3d}" for L in range(1, 10)))
print("slot:", " ".join(f"{slot(boundary, L - 1):3d}" for L in range(1, 10)))

# %% [markdown]
# ### Build step 1 · the slot mapping of a packed step (`ch03.ex1`)
#
# One engine step computes tokens of many sequences at once, packed into one batch: a whole prompt, or a
# *chunk* of a long prompt (chunked prefill, chapter 06) that starts wherever the computed part ends, maybe in the
# middle of a block; and one token for each sequence that is decoding, at position `len - 1`. Before the model
# runs, the engine needs the slot of every one of those tokens, in batch order.
#
# The engine calls your function as
# `slot_mapping(block_tables, start_positions, num_tokens, block_size) -> list[int]`: one table (a list of
# physical block ids) per sequence, the first position it computes this step and how many tokens. Example:
# tables `[[10, 11, 12]]`, start `[7]`, 2 tokens, block size 4 give `[47, 48]`.
#
# Open `exercises/ex03_block_tables.py`, write region `ch03.ex1` in `slot_mapping` (the checks of the inputs
# are written for you), save, and run the check. It feeds your function prompts, decodes and chunks, at two
# block sizes, and compares every slot with the formula:

# %%
_ = check("ch03.ex1")

# %% [markdown]
# **Predict, then run.** A sequence of 9 tokens, block size 4, table `[10, 11, 12]`, decodes its 10th token.
# Which slot does the token get, and does the sequence need a new block first? Put the slot in `prediction`.

# %%
prediction = None  # your guess, e.g. prediction = 48

# %%
decoding = BlockTable(4, [10, 11, 12])
reveal(
    prediction,
    slot(decoding, 9),
    "position 9 of table [10, 11, 12] (block size 4) is slot",
    why="position 9 is offset 1 of logical block 2, which lives in block 12: 12 * 4 + 1; the table's third "
    "block already holds position 8, so no new block is needed",
)

# %% [markdown]
# ## 2. Writing K/V by slot mapping
#
# With the slot mapping built once per step, each attention layer scatters its new keys and values to those
# slots with one vectorized copy: vLLM's `reshape_and_cache_flash` op (`csrc/cache_kernels.cu`, the op of v1's
# FlashAttention backend, read in 0.10.2). A slot of `-1` means "store nothing for this token": vLLM pads the
# slot mapping with it for tokens that only fill a fixed-size batch (v0: `PAD_SLOT_ID` in
# `vllm/attention/backends/utils.py`; v1: `slot_mapping[...].fill_(-1)` in `vllm/v1/worker/gpu_model_runner.py`;
# both 0.10.2).
#
# `KVCache` is one tensor `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`;
# `key_cache[layer]` and `value_cache[layer]` are views of it, `[num_blocks, block_size, num_kv_heads, head_dim]`.
#
# ### Build step 2 · `write_kv` (`ch03.ex2`)
#
# The engine calls `write_kv(key_cache, value_cache, key, value, slot_mapping) -> None` once per layer and step:
# one layer's caches, the new `key` / `value` `[T, num_kv_heads, head_dim]` of the step's `T` tokens, and their
# slots, int64 `[T]`. Three things decide whether it works:
#
# - **in place**: the engine keeps no return value; the caches passed in must change (and they are views of
#   the one pool tensor: a write into a copy is lost);
# - **a slot is a row**: that is why the engine hands over slots rather than (block, offset) pairs. Slot `x` is
#   block `x // block_size`, offset `x % block_size`, so the whole step is one vectorized copy per cache, with
#   no loop over tokens;
# - **padding**: a token with slot `-1` writes nowhere (vLLM pads a batch with such tokens).
#
# **Spot the bug.** This step is already written in your file: `write_kv` runs, writes in place, one vectorized
# copy per cache, and passes some of its checks, but one promise of its docstring does not hold. The symptom: a
# pool of 2 blocks of 2 slots filled with zeros, a step of 3 tokens whose keys are all ones, their slots
# `[0, -1, 2]`. Only slots 0 and 2 may change; as handed out, slot 3, which no token of the step was given and
# which belongs to whatever sequence holds block 1, changes too. The cell below runs your `write_kv` on that
# pool. Find the bug, fix it, and run the cell and the check again. This region scores only when all of its
# checks pass.


# %%
def write_kv_symptom(write) -> str:
    """The slots of a zeroed 2 x 2 pool that a step of slots ``[0, -1, 2]`` changes."""
    key_cache, value_cache = torch.zeros(2, 2, 1, 1), torch.zeros(2, 2, 1, 1)
    write(
        key_cache, value_cache, torch.ones(3, 1, 1), torch.ones(3, 1, 1), torch.tensor([0, -1, 2])
    )
    return f"slots changed {torch.nonzero(key_cache.view(-1)).flatten().tolist()}"


your_write_kv = getattr(exercise_module("ex03_block_tables"), "write_kv", None)
print("the contract:  slots changed [0, 2]")
print(
    "your write_kv:",
    write_kv_symptom(your_write_kv) if your_write_kv else "(your file does not import)",
)

# %%
_ = check("ch03.ex2")

# %% [markdown]
# Now a step of the three sequences above, with your two parts (or the reference, where yours does not pass
# yet): a prefill of `D`'s 3 prompt tokens and decodes of `A` and `C`, in one packed batch.

# %%
slot_mapping = yours("ch03.ex1", "slot_mapping", reference_slot_mapping)
write_kv = yours("ch03.ex2", "write_kv", reference_write_kv)
NUM_LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8
cache = KVCache(NUM_LAYERS, NUM_BLOCKS, BS, KV_HEADS, HEAD_DIM)
print(describe(cache))
step = [("D", 0, 3), ("A", 9, 1), ("C", 8, 1)]  # (sequence, first position, new tokens)
slots = torch.tensor(
    slot_mapping(
        [tables[name].block_ids for name, _, _ in step],
        [start for _, start, _ in step],
        [n for _, _, n in step],
        BS,
    )
)
print("slot mapping of the step:", slots.tolist())
new_k = torch.randn(len(slots), KV_HEADS, HEAD_DIM)
new_v = torch.randn(len(slots), KV_HEADS, HEAD_DIM)
write_kv(cache.key_cache[0], cache.value_cache[0], new_k, new_v, slots)
# position 9 of A lands in physical block 9 (its logical block 2), offset 1:
print(
    "A's token 9 is stored:",
    torch.equal(cache.key_cache[0][tables["A"][9 // BS], 9 % BS], new_k[3]),
)

# %% [markdown]
# Bad input is refused before anything is written: these checks sit outside your region, in the same file.

# %%
ex03 = exercise_module("ex03_block_tables")
if ex03 is not None:
    for bad_slots in (
        torch.tensor([1, 2, 3, 4, 48]),
        torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32),
    ):
        try:
            ex03.write_kv(cache.key_cache[0], cache.value_cache[0], new_k, new_v, bad_slots)
        except ValueError as err:
            print("ValueError:", err)

# %% [markdown]
# ## 3. The pool layout: why "NHD"
#
# Per layer the pool is `[num_blocks, block_size, num_kv_heads, head_dim]`: block, then token (N), then
# head (H), then the head's vector (D). This is the KV-cache layout of vLLM v1's FlashAttention backend
# (`vllm/v1/attention/backends/flash_attn.py`), of FlashAttention's `flash_attn_with_kvcache(..., block_table=...)`
# and of FlashInfer's "NHD" paged layout. Two properties make it the common choice:
#
# - **One token is one contiguous run** of `num_kv_heads * head_dim` elements, exactly the shape in which the
#   K/V projection produces it (`[tokens, heads, head_dim]`). Writing a step's tokens (section 2) is one
#   contiguous copy per token; no transpose.
# - **One block of one layer is one contiguous chunk** of `block_size * num_kv_heads * head_dim` elements, so
#   copy-on-write and swapping move whole chunks, and a kernel loads a block's keys for one head as
#   `block_size` rows of `head_dim` contiguous elements (strided by `num_kv_heads * head_dim`).
#
# vLLM v0's own CUDA kernel used the other order, heads before tokens ("HND", with an extra split of
# `head_dim` for vectorized loads: `[num_blocks, num_kv_heads, head_dim/x, block_size, x]` for keys), which
# makes one head's block contiguous but scatters a token's heads. The strides tell the story:

# %%
k0 = cache.key_cache[0]
print("key_cache[0] shape  :", tuple(k0.shape))
print(
    "strides (elements)  :",
    k0.stride(),
    " -> one token =",
    KV_HEADS * HEAD_DIM,
    "contiguous elements",
)
print("block 5 contiguous  :", k0[5].is_contiguous(), f"({k0[5].numel()} elements)")
fig = plot_memory_order(block_size=4, num_kv_heads=2, head_dim=4)
plt.show()

# %% [markdown]
# ### How many bytes is one block? (ledger row E8)
#
# One block holds `block_size` tokens of K *and* V in *every layer*, so
#
# bytes per block = 2 × layers × kv_heads × head_dim × block_size × dtype bytes.
#
# The fragmentation article's monitoring snippet (§7.3) computes `blocks × block_size × 2 × 4096 × 32 × 128 × 2`. For Llama-2-7B
# (32 layers, 32 KV heads, head_dim 128, fp16) the hidden size 4096 already *is* heads × head_dim, so
# multiplying by 128 again counts head_dim twice: every block comes out 128 times too large. The bytes of
# our pool's actual tensor agree with the formula:

# %% tags=["nbval-check-output"]
llama7b = kv_spec("llama-2-7b")
per_block = llama7b.bytes_per_block(16)
seed_formula = 16 * 2 * 4096 * 32 * 128 * 2
print(
    f"Llama-2-7B, block_size 16, fp16: {per_block:,} bytes per block ({per_block / 2**20:.1f} MiB)"
)
print(f"seed formula: {seed_formula:,} bytes, {seed_formula // per_block}x too large")
tiny = KVCache(NUM_LAYERS, NUM_BLOCKS, BS, KV_HEADS, HEAD_DIM, dtype=torch.float16)
print(
    "tiny pool: tensor bytes / blocks =",
    tiny.bytes // tiny.num_blocks,
    "| formula =",
    KVSpec(NUM_LAYERS, KV_HEADS, HEAD_DIM, torch.float16).bytes_per_block(BS),
)

# %% [markdown]
# `kv_cache_from_budget(budget_bytes, ...)` sizes the pool the way vLLM does: whole blocks that fit in the
# memory left after the model (vLLM measures that budget by profiling a forward pass: v0
# `Worker.determine_num_available_blocks` in `vllm/worker/worker.py`, v1 `Worker.determine_available_memory` in
# `vllm/v1/worker/gpu_worker.py`, both 0.10.2).

# %%
pool = kv_cache_from_budget(1_000_000, num_layers=2, block_size=16, num_kv_heads=2, head_dim=64)
print(describe(pool), "| bytes per block:", pool.bytes // pool.num_blocks)

# %% [markdown]
# ## 4. Attention over the paged pool: gather, then attend
#
# In a decode step each sequence has one new query token; it attends to all `context_len` tokens of
# its own sequence. With **GQA**, `num_heads` query heads share `num_kv_heads` KV heads: query head `h`
# reads KV head `h // (num_heads // num_kv_heads)`, so consecutive query heads form a *group* over one KV head.
# The scores are `scale * q · k`, with the `scale` the model passes in (usually `head_dim ** -0.5`, but not
# always: some models fold their own factor into it).
#
# The plainest paged attention **gathers** each sequence's K/V through its block table into a padded
# contiguous tensor (one indexing op for the whole batch), then runs the ordinary masked softmax. Three traps
# matter:
#
# - **Table entries past a context hold anything.** The engine pads the tables of a batch to one width; the
#   padding may be `-1`, or the id of a block that was freed and no longer exists (a *stale* id, even beyond the
#   pool). Indexed with the raw table, `-1` quietly wraps around to the last block, and a stale id beyond the pool
#   is an index error.
# - **Slots past `context_len` hold anything**: stale tokens of a previous owner, or never-written memory (NaN,
#   inf). Scores there must be `-inf` before the softmax *and* the values there must not enter the weighted sum:
#   multiplying by a zero weight is not enough, since `0 × NaN = NaN`.
# - **fp16 scores overflow** (a dot product of 64 elements of 32.0 is 65536 > 65504), so the math runs in fp32,
#   and the result goes back to the query's dtype.
#
# ### Build step 3 · `gather_kv` (`ch03.ex3`)
#
# `gather_kv(key_cache, value_cache, block_tables, context_lens) -> (key, value, valid)`: `block_tables` is int32
# `[num_seqs, W]`, `context_lens` int32 `[num_seqs]`. Return `key` / `value` `[num_seqs, L, num_kv_heads,
# head_dim]` with position `p` of sequence `s` at `[s, p]`, and `valid`, bool `[num_seqs, L]`, true exactly
# where `p < context_lens[s]`; any length `L >= max(context_lens)` is right (`W * block_size` is the simplest;
# the reference stops at the last block the longest context uses, so it prints fewer below). A sequence uses the first
# `ceil(context_len / block_size)` entries of its row, a count of its own; the others must never index the pool
# (the first trap). Vectorized: no Python loop over sequences; and the engine's table is not yours to change.
# Write region `ch03.ex3`:

# %%
_ = check("ch03.ex3")

# %% [markdown]
# ### Build step 4 · the attention (`ch03.ex4`)
#
# `decode_attention(query, key_cache, value_cache, block_tables, context_lens, scale) -> out` is the engine's
# part: it calls your `gather_kv` for you (outside the region), and region `ch03.ex4` does the rest. `query` is
# `[num_seqs, num_heads, head_dim]`; the output has its shape and dtype. What decides correctness is the GQA
# mapping and the three traps above; how you line the query heads up with their KV heads is yours to choose.
# The inputs stay as they came (a float32 query's `.float()` is the query itself). The check replaces your `gather_kv`
# by its own, whose padding holds NaN, so that this step is graded on its own (one last test runs the part with
# your gather):

# %%
_ = check("ch03.ex4")

# %% [markdown]
# We check the decode against `torch.nn.functional.scaled_dot_product_attention` with `enable_gqa=True` on the
# clean, un-paged K/V of each sequence. The pool is filled with NaN first and written with your `write_kv`;
# block tables are shuffled and their unused entries hold `-1` and stale ids beyond the pool; the context
# lengths are ragged. Beside yours, `paged_course.reference` holds three references with one signature,
# `(query, key_cache, value_cache, block_tables, context_lens, scale=None)`: `paged_attention_gather` (gather,
# then attend), `paged_attention_blockwise` (an online softmax block by block: the math of chapter 04's Triton
# kernel) and, for the unpaged picture, `contiguous_attention` on padded per-sequence K/V.


# %%
def random_paged_batch(context_lens, num_heads, num_kv_heads, head_dim, block_size, seed=0):
    """Signed random K/V in a NaN-filled pool through shuffled block tables; also the clean K/V per sequence.
    Unused table entries hold -1 and stale ids beyond the pool."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(need) + 4
    free = torch.randperm(num_blocks, generator=gen).tolist()
    kv = KVCache(1, num_blocks, block_size, num_kv_heads, head_dim)
    kv.kv.fill_(float("nan"))  # never-written slots hold garbage
    tables, clean = [], []
    for n, blocks in zip(context_lens, need):
        table = BlockTable(block_size, [free.pop() for _ in range(blocks)], num_tokens=n)
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        write_kv(
            kv.key_cache[0],
            kv.value_cache[0],
            k,
            v,
            torch.tensor(reference_slot_mapping([table.block_ids], [0], [n], block_size)),
        )
        tables.append(table.block_ids)
        clean.append((k, v))
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=gen)
    block_tables = pad_block_tables(tables, max(need) + 1, pad=-1)
    block_tables[1::2][block_tables[1::2] < 0] = (
        num_blocks + 1000
    )  # stale ids in every other row's padding
    return query, kv, block_tables, torch.tensor(context_lens, dtype=torch.int32), clean


def sdpa_per_sequence(query, clean, scale=None):
    """PyTorch's fused attention, one sequence at a time, on the clean K/V: the ground truth."""
    rows = []
    for s, (k, v) in enumerate(clean):
        q = query[s][None, :, None]  # [1, heads, 1 query token, head_dim]
        o = F.scaled_dot_product_attention(
            q, k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale=scale, enable_gqa=True
        )
        rows.append(o[0, :, 0])
    return torch.stack(rows)


decode = yours(["ch03.ex3", "ch03.ex4"], "decode_attention", paged_attention_gather)
lens = [1, 16, 17, 100, 333, 64]  # one token, exactly a block, one past a block, ragged
query, kv, block_tables, context_lens, clean = random_paged_batch(
    lens, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16
)
SCALE = 0.1  # an explicit scale (head_dim ** -0.5 would be 0.125)
print("block tables (padded with -1 and stale ids):", tuple(block_tables.shape))
print(block_tables[:3])
expected = sdpa_per_sequence(query, clean, scale=SCALE)
args = (query, kv.key_cache[0], kv.value_cache[0], block_tables, context_lens)
gathered_k, gathered_v, valid = gather_kv(*args[1:])
who = (
    "yours" if decode is not paged_attention_gather else "fallback"
)  # the reference, until yours passes
results = {
    who: decode(*args, SCALE),
    "gather": paged_attention_gather(*args, SCALE),
    "blockwise": paged_attention_blockwise(*args, SCALE),
    "contiguous": contiguous_attention(query, gathered_k, gathered_v, context_lens, SCALE),
}
errors = {name: (out - expected).abs().max().item() for name, out in results.items()}
for name, err in errors.items():
    print(
        f"{name:10s} max |out - SDPA| = {err:.2e}, NaN-free: {bool(torch.isfinite(results[name]).all())}"
    )

# %% tags=["nbval-check-output"]
for name in ("gather", "blockwise", "contiguous"):  # the references (yours is above)
    err = errors[name]
    print(
        f"{name:10s} max abs error vs SDPA = {err:.5f}  (< 1e-5: {err < 1e-5}, NaN-free: "
        f"{bool(torch.isfinite(results[name]).all())})"
    )

# %% [markdown]
# They agree with SDPA to float32 rounding (a few 1e-7 here), although every slot that no sequence uses
# holds NaN. The gathered tensor is padded to the longest context; its padding holds whatever the pool has
# there (NaN in the unused tail of a last block, another sequence's tokens where an unused table entry was
# replaced by block 0), and the mask keeps all of it out:

# %%
print(
    "gathered keys:",
    tuple(gathered_k.shape),
    "| padding slots holding NaN:",
    int(torch.isnan(gathered_k[~valid]).any(-1).any(-1).sum()),
    "of",
    int((~valid).sum()),
)

# %% [markdown]
# **fp16 and GQA edge cases**, on your decode. Queries and keys of 32.0 in fp16 with head_dim 64 give
# raw dot products of 65536, past fp16's largest value; values are rows of 1, 2 and 3, so the right answer
# is their mean, 2.0. And with 28 query heads over 4 KV heads (Qwen2.5-7B's ratio, group 7), where every
# value row of KV head `g` is `g + 1`, query head `h` must output `h // 7 + 1`.

# %%
k16 = torch.full((1, 4, 1, 64), 32.0, dtype=torch.float16)
v16 = torch.zeros((1, 4, 1, 64), dtype=torch.float16)
for p in range(3):
    v16[0, p] = p + 1.0
q16 = torch.full((1, 1, 64), 32.0, dtype=torch.float16)
out16 = decode(
    q16,
    k16,
    v16,
    torch.tensor([[0]], dtype=torch.int32),
    torch.tensor([3], dtype=torch.int32),
    0.125,
)
print("fp16 overflow case:", out16.dtype, "values", sorted(set(out16.flatten().tolist())))
print(
    "the same in fp16 arithmetic (no fp32): scores are",
    (q16[0] @ k16[0, :3, 0].T).flatten().tolist(),
)

kc = torch.randn(6, 4, 4, 16, generator=torch.Generator().manual_seed(13))
vc = (
    torch.arange(1.0, 5.0)[None, None, :, None].expand(6, 4, 4, 16).contiguous()
)  # KV head g holds g + 1
q28 = torch.randn(1, 28, 16)
out28 = decode(
    q28,
    kc,
    vc,
    torch.tensor([[2, 0, 5]], dtype=torch.int32),
    torch.tensor([9], dtype=torch.int32),
    0.25,
)
print("GQA 28/4, output per query head:", [round(x) for x in out28[0, :, 0].tolist()])

# %% [markdown]
# Without the fp32 upcast the scores themselves are already `inf`, and the softmax of `inf - inf` is NaN.
#
# ### What the gather costs
#
# The gather copies every sequence's context into a padded tensor before attending: that copy is what a
# fused paged-attention kernel avoids by reading the pool through the block table inside the kernel
# (paper §5.1, "fused block read and attention"). How much of a paged call is that copy? On this CPU, for a
# batch of 32 sequences of up to 512 tokens, with the reference gather, beside attention on K/V that are
# already contiguous (medians of 15 interleaved rounds):

# %%
lens_big = torch.randint(64, 513, (32,), generator=torch.Generator().manual_seed(1)).tolist()
qb, kvb, btb, clb, _ = random_paged_batch(
    lens_big, num_heads=8, num_kv_heads=2, head_dim=64, block_size=16
)
argsb = (qb, kvb.key_cache[0], kvb.value_cache[0], btb, clb)
kb, vb, _ = gather_kv(*argsb[1:])

candidates = {
    "gather alone": lambda: gather_kv(*argsb[1:]),
    "paged (gather + attend)": lambda: paged_attention_gather(*argsb),
    "contiguous (attend only)": lambda: contiguous_attention(qb, kb, vb, clb),
}
times = {name: [] for name in candidates}
for _ in range(15):  # interleaved rounds: this CPU may be shared with other work
    for name, fn in candidates.items():
        start = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - start)
median = {name: statistics.median(t) for name, t in times.items()}
print(" | ".join(f"{name} {t * 1e3:.1f} ms" for name, t in median.items()))
print(
    f"the gather is {median['gather alone'] / median['paged (gather + attend)']:.0%} of the paged call"
)
copied = 2 * kb.numel() * kb.element_size()
needed = 2 * sum(lens_big) * kb.shape[2] * kb.shape[3] * kb.element_size()
print(
    f"the gather copies {copied / 2**20:.1f} MiB of K/V (padded to the longest context) to read "
    f"{needed / 2**20:.1f} MiB of real context: {copied / needed:.2f}x"
)

# %% [markdown]
# Both paths then run the same attention on tensors of the same shape. The paged call also allocates its
# gathered tensors afresh on every call (the contiguous run reuses one set), so it can cost more than gather +
# attend, and on a shared CPU the rounds vary. The share is a CPU measurement of *this* reference, not of
# vLLM's kernel: the paper measured its fused CUDA
# kernel at 20-26% higher attention latency than FasterTransformer's contiguous kernel (§7.1), not the
# "2-5%" the implementation article states (§3.1; ledger row E2). Chapter 04 builds the fused kernel;
# `python -m paged bench kernel` times it on a GPU (the committed H200 run timed chapter 04's teaching kernel,
# not yet the tuned one; chapter 08 reads it).
#
# ## 5. One block table per sequence, for every layer (ledger row E6)
#
# The implementation article's walk-through (§3.4) says vLLM's block table "stores each layer's block_table tensor" and places the
# cache engine under `vllm/core/`. Neither is right. A physical block id names the same slots in *every*
# layer's pool tensor, so a sequence needs one table, and the step needs one `block_tables` tensor and one
# slot mapping, shared by all layers; only the pool tensor differs per layer. In vLLM v0 the tables live in
# the block manager (`vllm/core/block_manager.py`, `vllm/core/block/block_table.py`), the pool tensors in the
# worker's cache engine (`vllm/worker/cache_engine.py`), and the kernels behind the attention backends
# (`vllm/attention/backends/`, v1: `vllm/v1/attention/backends/`). Four layers, one table, your three parts:

# %%
layers = 4
kv4 = KVCache(layers, num_blocks=8, block_size=4, num_kv_heads=2, head_dim=16)
kv4.kv.fill_(float("nan"))
table = BlockTable(4, [6, 1, 3], num_tokens=10)
slot_map = torch.tensor(slot_mapping([table.block_ids], [0], [10], 4))  # computed once
bt, cl = pad_block_tables([table.block_ids]), torch.tensor([10], dtype=torch.int32)
q4 = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(4))
worst = 0.0
for layer in range(layers):
    k, v = torch.randn(10, 2, 16), torch.randn(10, 2, 16)  # each layer has its own K/V
    write_kv(kv4.key_cache[layer], kv4.value_cache[layer], k, v, slot_map)  # same slots
    out = decode(q4, kv4.key_cache[layer], kv4.value_cache[layer], bt, cl, 0.25)  # same table
    worst = max(worst, (out - sdpa_per_sequence(q4, [(k, v)])).abs().max().item())
print(f"{layers} layers, 1 block table {table.block_ids}: max abs error vs SDPA = {worst:.5f}")
print(
    f"block-table bytes per step: {bt.numel() * bt.element_size()} (one table), "
    f"not {layers * bt.numel() * bt.element_size()} (one per layer)"
)

# %% [markdown]
# ## 6. Your parts inside the engine
#
# The engine (`paged.LLM`) takes its parts as a constructor argument: `LLM(model, parts=Parts(slot_mapping=...,
# write_kv=..., decode_attention=...))`. `paged_course.capstone.learner_parts` collects yours from
# `exercises/ex03_block_tables.py` (the module's `PART_REGIONS` names the regions each part is made of) and keeps
# the reference for a part whose regions do not pass yet. Below, a tiny Llama (2 layers, 4 query heads over 2 KV
# heads, head dim 16, random weights) generates greedily for three prompts, with blocks of 4 tokens and at most
# 8 tokens per step, so the long prompts are computed in chunks whose later pieces read the earlier ones back
# from the pool through your slots; every decode step runs your `decode_attention`. The reference engine runs the
# same requests:

# %%
from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged_course.capstone import learner_parts, origin_table
from paged_course.reference.models import tiny_model


def engine_tokens(parts=None):
    llm = LLM(
        tiny_model("llama", vocab_size=128),
        block_size=4,
        num_gpu_blocks=32,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        parts=parts,
        verbose=False,
    )
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [50 + i for i in range(13)], [90, 91]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.stats()


parts, origin = learner_parts(parts=("slot_mapping", "write_kv", "decode_attention"))
print(origin_table(origin))
reference_tokens, reference_stats = engine_tokens()
your_tokens, your_stats = engine_tokens(parts)
print("prompt chunks computed:", your_stats["prefill_chunks"], "| generated:", your_tokens)
print("same tokens as the reference engine:", your_tokens == reference_tokens)

# %% [markdown]
# Grade all four steps from a terminal (the score the course records):
#
# ```bash
# python -m paged grade ch03
# ```
#
# ## Summary
#
# - A block table maps a sequence's logical blocks to physical blocks; the slot of position `p` is
#   `table[p // bs] * bs + p % bs`. A step's slot mapping lists the slot of every new token, prompts, chunks and
#   decodes packed in batch order (your `slot_mapping`).
# - `KVCache` is one preallocated tensor per engine, `[layers, 2, blocks, block_size, kv_heads, head_dim]`; each
#   layer sees `[blocks, block_size, kv_heads, head_dim]` (NHD): a token's heads are contiguous, and so is a
#   block. A step's K/V go in with one in-place copy per cache on the one-row-per-slot view; slot `-1` stores
#   nothing (your `write_kv`). Bytes per block = 2 × layers × kv_heads × head_dim × block_size × dtype bytes (E8).
# - Paged decode attention = gather through the block tables (never indexing the pool with an unused entry) +
#   a masked fp32 softmax with the model's scale and GQA groups (your `decode_attention`); it matches
#   `scaled_dot_product_attention` to float32 rounding with ragged lengths and garbage past every context.
# - One block table per sequence serves every layer (E6).
# - Your three parts ran inside the engine and produced the reference engine's tokens.
# - Next, chapter 04 computes the same attention without the gather: an online softmax over the blocks, in a
#   Triton kernel.
#
# ## Further reading
#
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving with PagedAttention*, SOSP 2023:
#   §4.1 (the PagedAttention algorithm: attention block by block through a block table), §4.2-4.3 (the KV cache
#   manager, logical and physical blocks), §5.1 (the fused kernels: block read and attention, `reshape_and_cache`).
# - vLLM v1 (read in 0.10.2): `vllm/v1/worker/block_table.py` (`BlockTable.compute_slot_mapping`: block tables and the slot
#   mapping of a packed batch), `vllm/v1/worker/gpu_model_runner.py` (the step's packed inputs),
#   `vllm/v1/attention/backends/flash_attn.py` (the NHD pool, the write, the attention call).
# - vLLM v0 (read in 0.10.2, the last release that ships it): `vllm/core/block/block_table.py` (one table per sequence), `vllm/attention/backends/utils.py`
#   (`compute_slot_mapping`, with `PAD_SLOT_ID = -1`), `vllm/worker/cache_engine.py` (the pool tensors per layer),
#   `csrc/cache_kernels.cu` (`reshape_and_cache`, `reshape_and_cache_flash`).
# - PyTorch: `torch.nn.functional.scaled_dot_product_attention` (`enable_gqa`, `scale`), the ground truth here.
