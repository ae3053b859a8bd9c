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
# # 02 · The block allocator
#
# Chapter 01 measured how much KV memory a server wastes when every request reserves one contiguous
# region. This chapter builds the piece of vLLM that removes that waste: a **block allocator** that
# hands out small fixed-size blocks of the KV cache pool one at a time, counts who holds each block,
# and takes them back. Everything here is bookkeeping on integers; chapter 03 attaches real tensors.
#
# **You will learn to**
#
# 1. explain why a paged KV cache borrows the operating system's idea of pages (and where the analogy stops);
# 2. build the engine's **block allocator** yourself, in five steps: a **free queue** that can also give up a
#    block from its middle, `allocate_many` and `free_many` that either do all of their work or none of it,
#    the id and **reference count** checks with their errors (`NoFreeBlocksError`, `ValueError`), and `take`;
# 3. run the engine with your allocator inside and get the same tokens as with the reference;
# 4. read a **block table**: logical blocks of one sequence mapped to physical blocks anywhere in the pool;
# 5. see what the scheduler sees: `BlockSpaceManager.allocate_slots` with vLLM v0's **watermark** (ledger row E9:
#    the fragmentation article's misreading of it, `docs/sources.md`);
# 6. measure what the allocator costs on this CPU.
#
# The reference code is the package's: `paged/core/allocator.py`, `paged/core/block_table.py`,
# `paged/core/block_manager.py`. Yours goes in **`exercises/ex02_allocator.py`**, and it is a real part of the
# engine: `LLM(..., parts=Parts(allocator=YourAllocator))` runs with it. After each step a cell checks it;
# until all five pass, the chapter uses the reference allocator and says so in one line.

# %%
import sys
import time

import matplotlib.pyplot as plt
from IPython.display import display

from paged_course.check import ROOT, check, exercise_module, hint, learner_or_reference, solution

if str(ROOT) not in sys.path:
    sys.path.insert(
        0, str(ROOT)
    )  # the notebook runs in chapters/; your exercise files live at the root

from collections import deque

from paged.core.allocator import BlockAllocator, NoFreeBlocksError
from paged.core.block_manager import AllocStatus, BlockSpaceManager
from paged.core.block_table import BlockTable, blocks_needed
from paged.core.sequence import Sequence
from paged_course.bench.allocator import allocator_vs_deque, manager_allocate_free
from paged_course.engine_views import slot, slots
from paged_course.predict import reveal
from paged_course.viz.blocks import (
    allocator_stepper,
    allocator_trace,
    draw_block_table,
    draw_pool,
    draw_trace,
    rows_for,
    trace_table,
)

STEPS = ["ch02.ex1", "ch02.ex2", "ch02.ex3", "ch02.ex4", "ch02.ex5"]


def yours(name: str):
    """``name`` from your exercise file as it is on disk now (``exercises/`` unless PAGED_IMPL says otherwise);
    None when the file does not import (its checks then fail, and the chapter carries on with the reference)."""
    return getattr(exercise_module("ex02_allocator"), name, None)


chapter_start = time.perf_counter()

# %% [markdown]
# ## 1. Why blocks: pages for the KV cache
#
# A decoding sequence grows one token at a time and nobody knows its final length. A server that stores
# each sequence's keys and values in one contiguous region must reserve the maximum up front, and the
# unused tail of that reservation is lost while the request runs (chapter 01 measured how much).
#
# Operating systems met the same problem with processes, whose memory needs also grow unpredictably.
# Their answer was **paging**: split physical memory into fixed-size pages, give a process pages
# only when it touches new memory, and keep a per-process **page table** that maps the process's
# contiguous *virtual* addresses to pages scattered anywhere in physical memory.
#
# PagedAttention (Kwon et al., SOSP 2023, §4) does the same for the KV cache:
#
# | operating system | paged KV cache |
# |---|---|
# | page (e.g. 4 KiB) | **block**: K/V of `block_size` tokens (16 by default) in every layer |
# | process | sequence |
# | virtual address | token position in the sequence |
# | page table | **block table** (one per sequence) |
# | page-frame allocator | **block allocator** (this chapter) |
# | shared pages, copy-on-write after `fork()` | shared blocks with reference counts, copy-on-write (chapter 05) |
# | swapping pages to disk | swapping blocks to CPU memory (chapter 06) |
#
# Where the analogy stops: there is no hardware MMU. The attention kernel itself reads the block table
# and computes addresses (chapter 04), and the whole "virtual memory" exists only for the K/V tensors.
# And a sequence only ever grows at its end, so at most its last block is partly empty: the waste per
# sequence is below one block, whatever its length.

# %% [markdown]
# ## 2. A free list and reference counts
#
# The allocator knows nothing about tensors. The pool has `num_blocks` blocks numbered `0..num_blocks-1`;
# the allocator keeps
#
# * a **free queue** of block ids: `allocate()` takes the front, a block freed to zero goes to the back
#   (first in, first out: the block freed longest ago is reused first, which chapter 05 turns into
#   LRU eviction of cached blocks);
# * a **reference count** per block: how many block tables hold it. `allocate` sets it to 1, `incref`
#   adds a holder (two sequences sharing a block), `free` removes one, and only the last `free` returns
#   the block to the queue.
#
# Step through a short history with the slider (the table below it shows the same steps as text).
# Watch block 1: after `incref 1` it has two holders, so the first `free 1` does not free it.

# %%
OPS = [
    "allocate",
    "allocate",
    "allocate",
    "incref 1",
    "free 1",
    "free 0",
    "allocate",
    "free 1",
    "allocate",
    "allocate",
    "allocate",
    "allocate",
    "allocate",
    "free 9",
    "free 0",
]
display(allocator_stepper(6, OPS))
print(trace_table(allocator_trace(6, OPS)))

# %% [markdown]
# The same history as one picture (blue: in use, with its reference count; white: free):

# %%
fig = draw_trace(6, OPS[:8])
plt.show()

# %% [markdown]
# Three kinds of failure, each a named exception with the numbers, and none of them changes the
# allocator's state:
#
# * running out: `NoFreeBlocksError` says how many blocks were requested and how many were free;
# * freeing a block that is already free (a double free) or an id outside the pool: `ValueError`;
# * `incref` of a free block: `ValueError` (nobody holds it, so nobody can share it).
#
# The reference allocator, failing on purpose:

# %% tags=["nbval-check-output"]
alloc = BlockAllocator(4)
held = [alloc.allocate() for _ in range(3)]
try:
    alloc.allocate_many(2)
except NoFreeBlocksError as err:
    print("NoFreeBlocksError:", err)
alloc.free(held[0])
for bad in (held[0], 7):
    try:
        alloc.free(bad)
    except ValueError as err:
        print("ValueError:", err)
print(
    "free blocks:",
    alloc.num_free_blocks,
    "| queue:",
    alloc.free_queue(),
    "| ref counts:",
    [alloc.ref_count(b) for b in range(4)],
)

# %% [markdown]
# ## 3. Build the allocator
#
# `exercises/ex02_allocator.py` holds the class with the engine's exact interface (`paged/engine/parts.py`,
# `Allocator`): the methods the block manager calls are `allocate_many`, `free_many`, `incref`, `take`,
# `ref_count` and `num_free_blocks`, plus `allocate` and `free` for single blocks. The plumbing is written
# for you (the constructor, the counts list `_ref_counts`, `allocate` and `free` as one-block calls of the
# batch methods, `incref`, `ref_count`, `free_queue`); the logic is yours, in five regions.
#
# ### Step 1: the free queue (`FreeBlockQueue`, region `ch02.ex1`)
#
# The free queue is first in, first out, like a `deque`: `popleft` at the front, `append` at the back. One
# more operation makes it more than a `deque`. In chapter 05 a block keeps its tokens after its last holder
# frees it, so that a later request with the same prefix can use it again; such a request then needs *that*
# block, wherever it waits in the queue. So the queue must also `remove` a given id from its middle, and
# in constant time, because the engine does it for every cached block a request hits:
#
# ```
#   front                                   back
#     4 <-> 1 <-> 6 <-> 0 <-> 3        remove(6):   4 <-> 1 <-> 0 <-> 3
# ```
#
# A Python list or a `deque` gets the order right and still fails: `pop(0)`, `insert` and `remove` walk the
# queue, so a pool of 100,000 blocks pays a hundred times what a pool of 1,000 pays, on every block of every
# step. The check times each operation at both sizes and compares the two (absolute times mean nothing on a
# busy machine). vLLM v1 keeps a doubly linked list over the free blocks (`FreeKVCacheBlockQueue` in
# `vllm/v1/core/kv_cache_utils.py`, 0.8.5 to 0.34.0). The class
# docstring lists the six methods.

# %%
_ = check("ch02.ex1")

# %% [markdown]
# Stuck? `hint("ch02.ex1")` gives a nudge, a second call a stronger one; `solution("ch02.ex1")` prints the
# reference answer (a linked list over two Python lists).
#
# ### Step 2: `allocate_many` (region `ch02.ex2`)
#
# The block manager asks for all the blocks of a prompt, or of a step's tokens, in one call. If only some
# were free and the call took them before failing, the sequence would be half admitted and those blocks
# lost to everyone. So `allocate_many(n)` is **all or nothing**: with fewer than `n` free blocks it raises
# `NoFreeBlocksError(n, free)` and changes nothing; otherwise it takes the `n` blocks at the front of the queue,
# in order, each with one holder.

# %%
_ = check("ch02.ex2")

# %% [markdown]
# ### Step 3: ids and counts (`_check`, region `ch02.ex3`)
#
# Every other method starts by checking the id it was given: an `int` in `0..num_blocks-1` (a float, a string
# or `None` is not an id, and a negative one would silently index from the end of a Python list), and, for
# `free` and `incref`, a block somebody holds. `_check` raises the `ValueError`s shown above, naming the
# operation, the id and the range (or saying the block is already free), and returns the block's count.

# %%
_ = check("ch02.ex3")

# %% [markdown]
# ### Step 4: spot the bug in `free_many` (region `ch02.ex4`)
#
# A finished sequence returns all its blocks in one call, its last block first (the block manager passes
# the table reversed), so that a prefix cache evicts a sequence's tail before its head. Each listed block
# loses one holder and joins the back of the queue when its count reaches 0. All or nothing again: every
# id is checked before any count changes, and an id listed twice needs two holders.
#
# **Predict, then run.** The free queue is `[4, 1, 6, 0, 3]`; a sequence whose table is `[2, 5, 7]` finishes,
# and the block manager frees its blocks tail first. Then `allocate_many(5)` runs. Which block does the next
# `allocate()` hand out? Set `prediction`, then run the next cell (it uses the reference allocator).

# %%
prediction = None  # your guess, e.g. prediction = 2

# %%
pool = BlockAllocator(8)
pool.allocate_many(8)
pool.free_many([4, 1, 6, 0, 3])  # the free queue is now [4, 1, 6, 0, 3]
pool.free_many(reversed([2, 5, 7]))  # the finished sequence, tail first
pool.allocate_many(5)
reveal(
    prediction,
    pool.allocate(),
    "the next allocate() hands out block",
    why="first in, first out: the five older free blocks go first, then the finished sequence's tail (7), "
    "so its head (2), the block a later request most likely shares, stays cached longest",
)

# %% [markdown]
# **Spot the bug.** This step is already written in your file: `free_many` runs, frees what it is given, and
# passes some of its checks, but one promise of the contract does not hold. The symptom: blocks 0, 3 and 4 are
# held once, block 1 twice, and the free queue is `[2, 5]`. `free_many([0, 3, 9])` must raise (9 is no block)
# and change nothing; as handed out, it raises, but blocks 0 and 3 are already back in the free queue
# (`[2, 5, 0, 3]`), and the next allocation hands out blocks that their sequence still uses. The cell below
# runs your `free_many` on a plain queue and the reference id check (so your other regions do not matter).
# Find the bug, fix it, and run the cell and the check again. This region scores only when all of its checks
# pass.


# %%
def free_many_symptom(free_many) -> str:
    """The free queue and counts after ``free_many([0, 3, 9])`` on a small pool (9 is no block)."""
    host = type("Host", (), {"_check": BlockAllocator._check})()
    host.num_blocks, host._ref_counts, host._free = 6, [1, 2, 0, 1, 1, 0], deque([2, 5])
    try:
        free_many(host, [0, 3, 9])
        said = "no error"
    except ValueError as err:
        said = f"ValueError ({err})"
    return f"{said}; free queue {list(host._free)}, counts {host._ref_counts}"


your_free_many = getattr(yours("BlockAllocator"), "free_many", None)
print("the contract:  ValueError; free queue [2, 5], counts [1, 2, 0, 1, 1, 0]")
print(
    "your free_many:",
    free_many_symptom(your_free_many) if your_free_many else "(your file does not import)",
)

# %%
_ = check("ch02.ex4")

# %% [markdown]
# ### Step 5: `take` (region `ch02.ex5`)
#
# `take(b)` is the prefix-cache hit on a freed block: block `b` leaves the free queue from wherever it
# stands and gets one holder. A block that is in use cannot be taken (the block manager `incref`s those
# instead); `take` raises `ValueError` saying so, with the block's count.

# %%
_ = check("ch02.ex5")

# %% [markdown]
# ### Your allocator, replayed and inside the engine
#
# First the history of the stepper above, replayed on your allocator and on the reference:

# %%
Allocator = learner_or_reference(STEPS, yours("BlockAllocator"), BlockAllocator)
same = trace_table(allocator_trace(6, OPS, Allocator)) == trace_table(allocator_trace(6, OPS))
print(
    f"{Allocator.__module__}.{Allocator.__name__}: the same {len(OPS)} steps as the reference, every result, "
    f"count and queue: {same}"
)

# %% [markdown]
# Then the real test: the engine itself, on a small model, with the allocator as its `allocator` part. The
# pool is tight on purpose (12 blocks of 4 tokens for five requests), so that the run needs every method:
# prefix-cache hits on blocks in use (`incref`) and on freed blocks (`take`), a copy-on-write for the two
# samples of one request, preemptions that free a victim's blocks. Both runs use the same model and greedy
# decoding, so the tokens must be equal:

# %%
from collections import Counter

from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged.engine.parts import Parts
from paged_course.reference.models import tiny_model

model = tiny_model("llama", vocab_size=128)
calls = Counter()


def counted(cls):
    """``cls`` with a call counter on each method the engine may call (calls from the engine only, not the
    allocator's calls of its own methods)."""
    inside = []

    def wrap(name):
        method = getattr(cls, name)

        def call(self, *args):
            calls[name] += not inside
            inside.append(name)
            try:
                return method(self, *args)
            finally:
                inside.pop()

        return call

    names = ("allocate", "allocate_many", "free", "free_many", "incref", "take")
    return type(cls.__name__, (cls,), {name: wrap(name) for name in names})


def generate_with(allocator_cls):
    llm = LLM(
        model,
        block_size=4,
        num_gpu_blocks=12,
        max_num_batched_tokens=16,
        max_num_seqs=8,
        parts=Parts(allocator=allocator_cls),
        verbose=False,
    )
    shared = [3, 1, 4, 1, 5, 9, 2, 6]
    prompts = [
        shared + [7, 7],
        shared + [8],
        [50 + i for i in range(13)],
        [90, 91],
        shared + [5, 3, 5],
    ]
    params = [
        SamplingParams(max_tokens=8, ignore_eos=True, n=2 if i == 1 else 1)
        for i in range(len(prompts))
    ]
    first = llm.generate(prompts, params, use_tqdm=False)
    later = llm.generate(
        [shared + [7, 7, 1], shared + [11]],
        SamplingParams(max_tokens=3, ignore_eos=True),
        use_tqdm=False,
    )  # arrive after the first five finished: hits on freed blocks
    return [[c.token_ids for c in out.outputs] for out in first + later], llm.stats()


reference_tokens, reference_stats = generate_with(BlockAllocator)
tokens, stats = generate_with(counted(Allocator))
print(
    f"engine with {Allocator.__module__}.{Allocator.__name__}: tokens equal to the reference engine's: "
    f"{tokens == reference_tokens}"
)
print(
    "calls:",
    ", ".join(
        f"{name} {calls[name]}" for name in ("allocate_many", "free_many", "incref", "take", "free")
    ),
    f"| preemptions {stats['preemptions']}, copy-on-write {stats['cow_copies']}, "
    f"prefix-cache hit rate {stats['prefix_cache_hit_rate']:.0%}",
)

# %% [markdown]
# ## 4. The block table
#
# A sequence sees its KV cache as consecutive **logical blocks**: positions `0..bs-1` in logical block 0,
# `bs..2bs-1` in logical block 1, and so on. Its **block table** lists the physical block behind each
# logical block. The physical blocks need no order and no neighbours: whichever block is at the front of
# the free queue serves. The K/V of token position `p` live in **slot**
#
# $$\text{slot}(p) = \text{table}[\,p \,/\!/\, \text{bs}\,] \cdot \text{bs} + p \bmod \text{bs}.$$
#
# Below, a 10-token sequence with block size 4 holds blocks `[7, 2, 5]`: two full blocks and one with
# 2 of its 4 slots used. Its last token (position 9) lives in slot `5 * 4 + 1 = 21`.

# %%
table = BlockTable(4, [7, 2, 5], num_tokens=10)
draw_block_table(
    table.block_ids, 10, 4, num_blocks=8, title="logical blocks -> physical blocks (block size 4)"
)
plt.show()

# %% tags=["nbval-check-output"]
print("slots of positions 0..9:", slots(table, 0, 10))
print(
    "blocks for 10 tokens:",
    blocks_needed(10, 4),
    "| table width for max_model_len 10:",
    blocks_needed(10, 4),
)
boundary = BlockTable(4, [10, 11, 12])
print(
    "last slot at L = 8 (exact block boundary):",
    slot(boundary, 8 - 1),
    "(block 11, offset 3; not 43)",
)

# %% [markdown]
# ## 5. What the scheduler sees: the block space manager
#
# The scheduler never touches the allocator directly. It asks the **block space manager**
# (`paged/core/block_manager.py`, after vLLM v0's `vllm/core/block_manager.py`), which owns one block table
# per sequence:
#
# * `allocate_slots(seq)` gives a sequence blocks for all its tokens that have none yet (a waiting
#   prompt's first blocks, or a new block when the last one is full), or returns `None`, changing
#   nothing, when the pool cannot give them now;
# * `can_ever_fit(num_tokens)` says whether a sequence that long could fit at all;
# * `free(seq)` returns its blocks, last block first.
#
# vLLM v0 answered a waiting prompt with three words, `OK`, `LATER` or `NEVER` (`AllocStatus`); the two
# questions above give the same three answers.
#
# **Ledger row E9.** The fragmentation article (§3.2) says the watermark is a ratio "below which preemption is triggered". In
# vLLM v0 the watermark is an *admission* rule (`SelfAttnBlockSpaceManager.can_allocate` in
# `vllm/core/block_manager.py`, 0.10.2; v1 has none up to 0.23.0 and an optional one, off by default, from
# 0.24.0): a new prompt is admitted only if at least
# `watermark_blocks = int(watermark * num_gpu_blocks)` blocks stay free afterwards, so that the running
# sequences still have room to grow and the new prefill does not force an immediate preemption. A
# prompt that cannot fit beside the watermark even in an empty pool is `NEVER`.

# %% tags=["nbval-check-output"]
manager = BlockSpaceManager(block_size=4, num_gpu_blocks=20, watermark=0.1)  # keeps 2 blocks free
running = Sequence(0, list(range(1, 50)), 4)  # 49 tokens -> 13 blocks
manager.allocate_slots(running)


def admission(seq: Sequence) -> AllocStatus:
    """vLLM v0's answer for a waiting prompt, from the manager's two questions."""
    if not manager.can_ever_fit(len(seq)):
        return AllocStatus.NEVER
    if manager.allocate_slots(seq) is None:
        return AllocStatus.LATER
    manager.free(seq)  # it fitted: give the blocks back, this is only a question
    return AllocStatus.OK


for n_tokens in (8, 20, 21, 72, 73):
    seq = Sequence(1, [1] * n_tokens, 4)
    print(
        f"prompt of {n_tokens:2d} tokens ({blocks_needed(n_tokens, 4):2d} blocks) with "
        f"{manager.get_num_free_gpu_blocks()} free, watermark {manager.watermark_blocks}: "
        f"{admission(seq).name}"
    )

# %% [markdown]
# The 20-token prompt (5 blocks) leaves exactly 2 free blocks: OK. One token more needs a sixth block
# and would leave 1: LATER. A 73-token prompt needs 19 blocks, more than `20 - 2`: NEVER, even in an
# empty pool. Here the manager gives the running sequence its next blocks and then frees it:

# %%
other = Sequence(2, list(range(100, 106)), 4)
manager.allocate_slots(other)
for t in range(7):
    other.append_token_id(200 + t)
    manager.allocate_slots(other)
draw_pool(
    manager,
    rows_for(manager, [running, other], ["seq 0", "seq 2"]),
    title="two block tables over one pool",
)
plt.show()
manager.free(running)
manager.free(other)
print("free after both finish:", manager.get_num_free_gpu_blocks(), "of", manager.num_gpu_blocks)

# %% [markdown]
# ## 6. Measurement: what does the bookkeeping cost?
#
# Allocation runs in the scheduler's Python loop for every block of every sequence, so it must stay
# cheap. The baseline is the least any free list can cost in Python: a bare `collections.deque`,
# `popleft` + `append`. (`python -m paged bench allocator` runs the same functions with more repeats
# and writes JSON.) The times are this machine's and vary from run to run; they are not checked.

# %%
pair = allocator_vs_deque(num_ops=2048, repeats=30)
print(
    f"one block at a time : BlockAllocator {pair['ours_single']:6.0f} ns  deque {pair['deque_single']:5.0f} ns"
    f"  -> {pair['ratio_single']:.1f}x"
)
print(
    f"64 blocks at a time : BlockAllocator {pair['ours_batch']:6.0f} ns  deque {pair['deque_batch']:5.0f} ns"
    f"  -> {pair['ratio_batch']:.1f}x"
)
for n in (64, 256, 1024):
    r = manager_allocate_free(n, repeats=3)
    print(
        f"BlockSpaceManager: {n:4d} sequences x 64 blocks allocated + freed in {r['seconds'] * 1e3:6.1f} ms "
        f"({r['us_per_block']:.2f} us per block)"
    )

# %% [markdown]
# Reading the numbers: one block at a time, the allocator costs several times the bare deque. In
# CPython a method call alone costs about as much as the deque's `popleft` + `append`, and the
# allocator also checks the id and keeps a reference count. Its queue is a `deque` with lazy deletion:
# chapter 05 pulls a given free block out of the middle by marking its entry dead, and allocation skips
# dead entries. Two empty Python methods around a deque already cost about 2.4x the bare deque, so one
# block at a time the allocator stays at about 4-5x; the batched calls (`allocate_many`, `free_many`, used
# by the block manager) pay for a call once per 64 blocks and come closer, at about 3-3.5x. On an idle
# machine the block
# manager's cost per block is below a microsecond and about the same from 4,096 to 65,536 blocks (the
# larger runs pay somewhat more for CPU cache misses): the work is linear in the number of blocks. On a
# busy machine single runs are slower; `python -m paged bench allocator` reports the best of many.
# Next to a model's forward pass (milliseconds) this bookkeeping is noise.

# %% [markdown]
# Your allocator on the same footing, timed here against the reference in this run (allocate and free 2,048
# blocks, one at a time and 64 at a time; best of 15 runs). This one is for you to read, not a claim: a
# queue written in Python does in several list operations per block what the reference's `deque` does in C,
# and `allocate` and `free` written as one-block batch calls pay for the batch machinery each time.

# %%
import timeit


def ns_per_block(cls, batch: int) -> float:
    """Nanoseconds per block allocated and freed, ``batch`` blocks per call (best of 15 runs)."""
    a = cls(1024)
    if batch == 1:

        def run():
            allocate, free = a.allocate, a.free
            for _ in range(2048):
                free(allocate())
    else:

        def run():
            for _ in range(2048 // batch):
                a.free_many(a.allocate_many(batch))

    return min(timeit.repeat(run, number=1, repeat=15)) / 2048 * 1e9


for cls in dict.fromkeys((BlockAllocator, Allocator)):
    one, many = ns_per_block(cls, 1), ns_per_block(cls, 64)
    print(
        f"{cls.__module__ + '.' + cls.__name__:<36} one at a time {one:6.0f} ns, 64 at a time {many:6.0f} ns "
        f"per block"
    )

# %% [markdown]
# ## Summary
#
# * The KV cache pool is cut into fixed-size blocks; a sequence gets blocks one at a time as it grows,
#   so its waste is less than one block.
# * The allocator is a FIFO free queue plus a reference count per block; sharing a block is `incref`,
#   and a block returns to the queue only when its last holder frees it. The queue must also give up a
#   given block from its middle (`take`, for prefix-cache hits on freed blocks), which a doubly linked list
#   or an `OrderedDict` does in constant time.
# * The batch operations are all or nothing, and every failure is a named exception with the numbers that
#   leaves the allocator as it was.
# * You built that allocator, and the engine ran with it and produced the reference engine's tokens.
#   `python -m paged grade ch02` grades the five regions from a terminal.
# * A block table maps a sequence's logical blocks to physical blocks anywhere in the pool; the slot of
#   position `p` is `table[p // bs] * bs + p % bs`.
# * The block space manager is the scheduler's only view of memory; its watermark is an admission rule
#   (E9), not a preemption trigger.
#
# Next: chapter 03 gives the blocks their tensors and reads them back in attention.
#
# ## Further reading
#
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving with PagedAttention*
#   (SOSP 2023): §4.1-4.3 (blocks, block tables and the KV cache manager, after virtual memory and paging),
#   §4.4 (sharing blocks with reference counts, copy-on-write).
# - vLLM v1 (read in 0.8.5, 0.10.2 and 0.34.0): `vllm/v1/core/block_pool.py` (`BlockPool`: `get_new_blocks`, `free_blocks`, `touch`, the reference
#   counts) and `vllm/v1/core/kv_cache_utils.py` (`FreeKVCacheBlockQueue`, the doubly linked free queue with
#   `popleft`, `append` and `remove`).
# - vLLM v0 (read in 0.10.2, the last release that ships it): `vllm/core/block/naive_block.py` (`NaiveBlockAllocator`: the free block ids and a `RefCounter`
#   from `vllm/core/block/common.py`); `vllm/core/block_manager.py` (`SelfAttnBlockSpaceManager`, the
#   watermark in `can_allocate`).

# %%
print(
    f"time since the set-up cell ran: {time.perf_counter() - chapter_start:.1f} s "
    "(reading and editing time included)"
)
