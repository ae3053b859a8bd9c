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
# # 06 · The scheduler: continuous batching, chunked prefill and preemption
#
# Paged blocks (chapters 02-05) make memory cheap to hand out one block at a time. The **scheduler** decides
# what to do with that freedom: every step, which sequences compute which tokens, which wait, and who gives
# memory back when the pool runs out. The engine's scheduler is a hybrid, on purpose. Its step is vLLM v1's:
# one **token budget** per step, running sequences first, prompts cut into **chunks** that fit the budget,
# preemption of the newest. Beside it, it keeps three things of vLLM v0 that v1 dropped: a **swapped** queue
# with preemption by swap, the admission **watermark**, and the **fork** of a request's samples with
# copy-on-write. Each section says which engine (and which release) a rule comes from. In this chapter you
# write the policy, one method per build step, and the engine of chapter 07 runs on it.
#
# **You will learn to**
#
# 1. explain continuous batching and measure it against static batching on the same requests;
# 2. read one `schedule()` call: the waiting / running / swapped queues, the step's prefill chunks and
#    decodes, and the `SchedulerOutputs` the engine executes;
# 3. split a step's token budget (**chunked prefill**, `long_prefill_token_threshold`);
# 4. grow the running sequences and preempt the **most recently admitted** one when memory runs out, by
#    **recompute** or by **swap**, and end a sequence that can never grow instead of looping;
# 5. bring swapped sequences back and admit new ones first come, first served under the **watermark**
#    (and correct the fragmentation article's description of it, ledger row E9, `docs/sources.md`), and tell a
#    request that must wait from one that can never run;
# 6. compare the step orders of vLLM v0 and v1, and measure what the chunk budget does to time to first
#    token and inter-token latency (Sarathi-Serve, OSDI 2024), in a simulator and on the engine;
# 7. measure recompute against swap by block size (the PagedAttention paper §7.3, Fig. 19), and write the
#    CPU swap space that copies a block forked samples share once, not once per sample.
#
# You write seven regions of `exercises/ex06_scheduler.py`, the policy methods of `Scheduler`, a subclass of
# the reference `paged.core.scheduler.Scheduler` that keeps its plumbing (queues, requests in and out,
# small helpers that its docstring lists), and two of `exercises/ex06_swap.py`, the CPU swap space that
# preemption by swap moves blocks into. After each build step a cell `check("ch06.exK")` runs that
# step's graded tests on your file: a fake engine executes every step and checks that each token attends
# to its own sequence's K/V, and random runs check what any correct policy holds (no step over the token
# budget, no block handed out twice, a preemption only when memory ran short, every victim's blocks freed,
# every request ending with the same tokens as the reference's), not the reference's exact steps. The chapter then
# goes on with your method when it passes, and with the reference (saying so in one line) when it does not.
# Stuck? `hint("ch06.exK")` gives a nudge, a second call a stronger one; `solution("ch06.exK")` prints the
# reference answer, where your copy of the course ships it.

# %%
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import display

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "paged_course").is_dir())
if str(ROOT) not in sys.path:  # the notebook runs in chapters/; the exercises live at the root
    sys.path.insert(0, str(ROOT))

from paged.config import CacheConfig, SchedulerConfig
from paged.core.block_manager import BlockSpaceManager
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged.core.swap import SwapSpace
from paged.engine.llm import LLM
from paged.engine.parts import Parts
from paged.models import load_default
from paged_course.capstone import origins
from paged_course.check import (  # noqa: F401
    check,
    exercise_module,
    hint,
    learner_or_reference,
    run_check,
    solution,
)
from paged_course.predict import reveal
from paged_course.sim.kv_check import CheckedEngine
from paged_course.sim.scheduling import (
    CostModel,
    chunk_budget_sweep,
    make_workload,
    recompute_vs_swap,
    simulate,
    simulate_static,
)
from paged_course.sim.step_order import ORDERS, TraceRequest, V0ChunkedScheduler, run_trace
from paged_course.viz.chunked import engine_budget_sweep, plot_latency_vs_budget, plot_step_orders
from paged_course.viz.scheduler import (
    Stepper,
    plot_memory,
    plot_steps,
    plot_timelines,
    stepper_widget,
)

STEP_METHODS = {
    "ch06.ex1": "_chunk",
    "ch06.ex2": "_schedule_running",
    "ch06.ex3": "_preempt",
    "ch06.ex4": "_schedule_swapped",
    "ch06.ex5": "_schedule_waiting",
    "ch06.ex8": "_never_reason",
    "ch06.ex9": "_recompute",
}


def your_scheduler(*steps):
    """The reference Scheduler with the methods of build steps `steps` taken from your file, each one that
    passes its checks (the others stay the reference's, one line says which)."""
    module, methods = exercise_module("ex06_scheduler"), {}
    for step in steps:
        if module is not None and learner_or_reference(step, True, False):
            methods[STEP_METHODS[step]] = vars(module.Scheduler)[STEP_METHODS[step]]
    return type("YourScheduler", (Scheduler,), methods)


# a tiny model: one thread is faster than several on a shared CPU, and steadier
torch.set_num_threads(1)
chapter_start = time.perf_counter()

# %% [markdown]
# ## 1. Static batching against continuous batching
#
# **Static batching** (transformers' `generate` on a padded batch, FasterTransformer) takes a batch of
# requests, pads every prompt to the longest one, and decodes until the *longest* output is done. A request
# that finished early keeps its row, computing padding, and the next batch waits. It also reserves KV memory
# for the maximum length of every row up front, so few rows fit.
#
# **Continuous batching** (Orca's iteration-level scheduling, vLLM) decides again at every step: a finished
# request leaves at once and a waiting one takes its place in the next step. With paged blocks a request
# holds only the blocks its tokens fill, so many more run at once.
#
# The simulator `paged_course.sim.scheduling` runs both on the same 200 requests (long-tailed prompt and output
# lengths, all arriving at once), with the engine's real scheduler and block manager and a clock instead of a
# model. Time comes from a documented cost model, not a stopwatch: a step costs
# `step_overhead_s + per_token_s × tokens in the step` (defaults shaped like OPT-13B on an A100: 20 ms to read
# the weights once, 0.15 ms per token). The KV pool holds 16,384 token slots in both runs; static batching
# reserves `max_model_len = 1024` slots per row, so its batch is 16 rows.

# %%
cost = CostModel()
workload = make_workload(200, seed=0, mean_prompt=160, mean_output=200, max_len=1024)
KV_SLOTS, MAX_LEN = 16_384, 1024
continuous = simulate(
    workload,
    SchedulerConfig(max_num_seqs=256, max_model_len=MAX_LEN),
    CacheConfig(block_size=16, num_gpu_blocks=KV_SLOTS // 16),
    cost,
)
static = simulate_static(workload, batch_size=KV_SLOTS // MAX_LEN, cost=cost, max_model_len=MAX_LEN)

# %% tags=["nbval-check-output"]
print(f"{'':<12} {'seconds':>8} {'tokens/s':>9} {'mean latency s':>15} {'mean running':>13}")
for res in (static, continuous):
    running = sum(s["running"] for s in res.steps) / len(res.steps)
    print(
        f"{res.name:<12} {res.total_s:>8.1f} {res.throughput:>9.0f} {res.mean_latency_s:>15.1f} {running:>13.1f}"
    )
print(f"continuous / static throughput: {continuous.throughput / static.throughput:.2f}x")

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), sharex=True)
plot_timelines(static, ax=axes[0], max_requests=None)
plot_timelines(continuous, ax=axes[1], max_requests=None)
fig.tight_layout()
display(fig)
plt.close(fig)

fig = plot_memory({"static": static, "continuous": continuous})
display(fig)
plt.close(fig)

# %% [markdown]
# Each row of the Gantt charts is one request (all 200, in arrival order): grey while it waits, green while it
# runs, orange while it waits again after a preemption. Static batches start in lock step and every request
# of a batch finishes when its longest member does. With continuous batching requests start as soon as
# memory allows and leave as soon as they are done. The lower plot shows the price static batching pays in
# memory: it holds the full reservation of every row from the first step, while continuous batching holds
# only filled blocks and admits new requests until the pool is full. A few continuous requests are
# preempted (orange): the scheduler admitted them optimistically and took their blocks back when older
# requests needed to grow. The build steps below write exactly that policy.
#
# ## 2. One `schedule()` call
#
# `Scheduler(scheduler_config, cache_config)` keeps three queues and builds each step with one **token
# budget**, `max_num_batched_tokens`. There is no prefill phase and no decode phase: every sequence has
# `num_computed_tokens`, the leading tokens whose K/V are in the pool, and each step lets it catch up with its
# length by some tokens (vLLM v1, `Scheduler.schedule` in `vllm/v1/core/sched/scheduler.py`, the same from
# 0.8.5 to 0.34.0). One `schedule()` call, in order, with where each rule comes from:
#
# 1. **running** (admission order, oldest first): each sequence gets its next tokens: 1 for a decode, the
#    next chunk of a partly computed prompt. When the pool is full, the most recently admitted running
#    sequence is preempted. *v1*, which preempts by recompute only; this engine can also swap (*v0*).
# 2. **swapped**: if nobody was preempted in this step, swapped-out sequences come back, oldest first. *v0*
#    (`_schedule_chunked_prefill` in `vllm/core/scheduler.py`, 0.10.2, the last release with v0's code);
#    v1 has no swapped queue.
# 3. **waiting**: if nobody was preempted and nothing is swapped out, new prompts are admitted first come,
#    first served, while seats (`max_num_seqs`), the budget and the watermark allow. Nobody admitted in a step
#    that preempted: *v1* (`if not preempted_reqs` in `schedule`). Nobody admitted while a sequence is swapped
#    out, and the watermark: *v0* (`_schedule_default` in `vllm/core/scheduler.py`;
#    `SelfAttnBlockSpaceManager.can_allocate` in `vllm/core/block_manager.py`, 0.10.2).
#
# The **sequence** is the unit. A request with `n > 1` samples computes its prompt once, then **forks** into
# `n` sequences that share every block of the prompt, with copy-on-write for a shared partial block (chapter
# 05); each is scheduled, preempted and swapped on its own. That is vLLM v0's parallel sampling up to 0.6.3
# (`scheduler.fork_seq` in `vllm/engine/output_processor/single_step.py`). vLLM v1 has no fork: it fans the
# request out at arrival into `n` independent requests (`ParentRequest` in `vllm/v1/engine/parallel_sampling.py`,
# 0.8.5 to 0.34.0), which share the prompt's full blocks through the prefix cache and each compute their own
# partial block; v0 did the same from 0.6.4 on (`ParallelSampleSequenceGroup` in `vllm/sequence.py`).
#
# Here is one step on a pool of 8 blocks of 4 tokens, with the reference scheduler. `SchedulerOutputs` tells
# the engine, per scheduled sequence, which tokens to compute (`start`, `num_tokens`) and where they go
# (`block_table`). The scheduler marks them computed as it schedules them; the engine runs the model,
# samples, and appends the sampled token.

# %% tags=["nbval-check-output"]
sched = Scheduler(
    SchedulerConfig(max_num_seqs=8, max_model_len=32, max_num_batched_tokens=32),
    CacheConfig(block_size=4, num_gpu_blocks=8, watermark=0.0),
)
for i, (prompt_len, max_tokens) in enumerate([(6, 4), (3, 2), (40, 2)]):
    sched.add_request(
        SequenceGroup(
            f"req{i}",
            [Sequence(i, list(range(1, prompt_len + 1)), 4)],
            SamplingParams(max_tokens=max_tokens),
        )
    )
out = sched.schedule()
for entry in out.scheduled:
    print(
        f"seq {entry.seq.seq_id}: compute positions {entry.start}..{entry.start + entry.num_tokens - 1}, "
        f"block table {entry.block_table}"
    )
print("ignored:", [(seq.group.request_id, seq.finish_message) for seq in out.ignored])
print(
    "tokens in the step:",
    out.num_batched_tokens,
    "| free blocks:",
    sched.block_manager.get_num_free_gpu_blocks(),
)

# %% [markdown]
# ## 3. Build step 1: the chunked budget split
#
# Each sequence asks for its `remaining = len(seq) - num_computed_tokens` tokens. How many run now?
#
# * **A cap per prompt.** With `long_prefill_token_threshold = T > 0`, at most `T` tokens of one sequence
#   run in a step, so one long prompt cannot take the whole budget from the prompts behind it.
# * **The budget.** What is left of `max_num_batched_tokens`. If the tokens fit, they all run. If not, with
#   `enable_chunked_prefill` (the engine's default) the prompt is cut: it runs `budget` tokens now and the
#   rest in later steps. Without chunked prefill it runs nothing and waits for a step with room for all of it.
#   vLLM v1 forces chunked prefill on for generative models in 0.8.5 to 0.11.0 (`_set_default_args` in
#   `vllm/engine/arg_utils.py`) and turns it on by default from 0.11.1 (`enable_chunked_prefill=False` then
#   switches it off); vLLM v0 left it off by default, except for models of more than 32K tokens of context.
#
# ```
# remaining 40, budget 16, T 0    -> 16     (then 16, then 8)
# remaining 40, budget 16, T 6    -> 6      (the other 10 tokens go to other sequences)
# remaining  1, budget  0         -> 0      (no budget left: it waits for the next step)
# remaining 40, budget 16, chunked prefill off -> 0
# ```
#
# **Your turn.** In `exercises/ex06_scheduler.py`, write the region `ch06.ex1` of `Scheduler._chunk(remaining,
# budget)`. The threshold and the chunking flag are read for you from `self.config`.

# %%
_ = check("ch06.ex1")

# %% [markdown]
# With your `_chunk`: a decoding request and a 40-token prompt under a 16-token budget, without and with a
# threshold of 6. Each line is one step: `request:tokens`.


# %%
def chunk_steps(scheduler_cls, threshold):
    s = scheduler_cls(
        SchedulerConfig(
            max_num_seqs=4,
            max_model_len=64,
            max_num_batched_tokens=16,
            long_prefill_token_threshold=threshold,
        ),
        CacheConfig(block_size=4, num_gpu_blocks=32, watermark=0.0),
    )
    for rid, p, m in (("chat", 3, 8), ("long", 40, 2)):
        s.add_request(
            SequenceGroup(
                rid,
                [Sequence(len(s.waiting), list(range(1, p + 1)), 4)],
                SamplingParams(max_tokens=m),
            )
        )
    engine = CheckedEngine(s)
    engine.run()
    return [
        " ".join(f"{e.seq.group.request_id}:{e.num_tokens}" for e in out.scheduled)
        for out in engine.log
    ]


YourChunk = your_scheduler("ch06.ex1")
for threshold in (0, 6):
    print(f"threshold {threshold}: " + " | ".join(chunk_steps(YourChunk, threshold)))

# %% [markdown]
# ## 4. Build step 2: running sequences first, the newest is preempted
#
# `_schedule_running(out, budget)` gives every running sequence its next chunk, or takes it out of
# `running`. When it is called, `self.running` holds the running sequences in admission order (oldest first;
# the method starts with them in `queue` and rebuilds `self.running`). What must hold when it returns:
#
# * **Budget.** Each sequence that stays gets `self._chunk(remaining, budget)` tokens, listed with
#   `self._mark_scheduled(seq, n, out)` (it returns `n`, to take from the budget); the method returns the
#   budget left. A chunk of 0 (no budget left) is no reason to leave: the sequence keeps its blocks and
#   stays, computing nothing this step.
# * **Memory.** `block_manager.allocate_slots(seq, n)` gives a sequence its slots (a `NewBlocks`, whose
#   `copies` are copy-on-write pairs for `out.blocks_to_copy`) or returns `None`, changing nothing, when the
#   pool has no room. A sequence is scheduled only once it got its slots.
# * **Victims.** When memory is short, it comes from a preemption (`self._preempt(...)`, build step 3), and
#   only then. The victim is never older than a sequence that keeps running: PagedAttention (paper §4.5)
#   serves first come, first served, so the **latest** request gives way (vLLM v1 0.8.5 to 0.34.0 preempts
#   the tail of its running list when `allocate_slots` returns `None`, `vllm/v1/core/sched/scheduler.py`).
# * **No endless loop.** A sequence that is alone in the pool and still cannot grow never will:
#   `self._exhaust(seq, out)` ends it as `kv_cache_exhausted` (preempting it would re-prefill it forever).
#
# How you walk the queue and pick among the allowed victims is yours; the checks test these promises on
# hand-made cases and seeded random runs, and a few pinned cases check the policy this chapter names
# (the newest victim first, a sequence preempting itself when nobody younger is left).
#
# Two consequences: decodes are never starved by a long prompt admitted after them (they come first in the
# walk), and a preempted sequence is always younger than every sequence that keeps running.
#
# The `kv_cache_exhausted` finish is this course's own: vLLM checks at start-up that one request of
# `max_model_len` tokens fits in the KV cache and refuses to start otherwise (v0: `raise_if_cache_size_invalid`
# in `vllm/worker/worker.py`; v1: `check_enough_kv_cache_memory` in `vllm/v1/core/kv_cache_utils.py`), so
# there a request alone can always grow. This scheduler accepts a pool smaller than `max_model_len` and ends
# such a request instead.
#
# **Your turn.** Write the region `ch06.ex2`.

# %%
_ = check("ch06.ex2")

# %% [markdown]
# **Predict, then run.** The pool has 3 blocks of 4 tokens. Requests A, B and C arrive in that order, each
# with a 4-token prompt, and all three are prefilled in step 1 (one full block each). In step 2 each needs a
# second block for its first decode. Which requests are preempted in step 2, in order? Set `prediction` to
# a list of request ids, then run the next cell (it uses the reference scheduler).

# %%
prediction = None  # your guess, e.g. prediction = ["A"]

# %%
predict_sched = Scheduler(
    SchedulerConfig(max_model_len=32, max_num_seqs=4),
    CacheConfig(block_size=4, num_gpu_blocks=3, num_cpu_blocks=0),
)
for rid, first in (("A", 1), ("B", 11), ("C", 21)):
    predict_sched.add_request(
        SequenceGroup(
            rid,
            [Sequence(first, list(range(first, first + 4)), 4)],
            SamplingParams(max_tokens=4),
        )
    )
predict_engine = CheckedEngine(predict_sched)
predict_engine.step()
reveal(
    prediction,
    [seq.group.request_id for seq in predict_engine.step().preempted],
    "preempted in step 2, in order",
    why="A, the oldest, grows first and takes C's block (C is the newest); B then finds no block and "
    "nobody younger, so it gives way itself; only A decodes",
)

# %% [markdown]
# ## 5. Build step 3: preemption by recompute or swap
#
# `_preempt(seq, out)` gives a running sequence's GPU blocks back to the pool (the counters
# `num_preemptions` and `out.preempted` are done for you). After the call:
#
# * **swapped**, when `config.preemption_mode == "swap"` and the CPU pool has room
#   (`block_manager.swap_out(seq)` returns the `(gpu_block, cpu_block)` pairs, or `None` when the CPU pool is
#   full): the engine finds the pairs in `out.blocks_to_swap_out`; the sequence is `SWAPPED` with its
#   `num_computed_tokens` kept (its K/V still exist), counted in `num_swap_outs`; and `self.swapped` is still
#   in **arrival order** (`self._rank`): victims leave newest first, yet must come back oldest first.
# * **recomputed**, otherwise, counted in `num_recomputes`: `self._recompute(seq, out)` takes its memory
#   and its work away (you write it next, as `ch06.ex9`; until then the reference's runs).
#
# Swap keeps the work and pays for copies over PCIe; recompute throws the work away and pays for a prefill
# (section 9 compares them).
#
# **Your turn.** Write the region `ch06.ex3`.

# %%
_ = check("ch06.ex3")

# %% [markdown]
# ### Build step 3b: what recompute leaves behind
#
# `_recompute(seq, out)` runs for every recompute victim (and for a swapped sequence that cannot come back).
# The sequence keeps its tokens, prompt and output so far, but loses every block and every computed token:
# its next admission is a prefill of all of them. Two questions are yours to answer in the region `ch06.ex9`:
#
# * **Where does it wait?** It was admitted before every prompt still waiting, and first come, first served
#   should not punish it for being evicted. Victims reach `_recompute` newest first, so think about where each
#   must go for `waiting` to stay in arrival order.
# * **Can it ever come back?** A running sequence may grow into the blocks the watermark keeps free at
#   admission; once its length is more than an empty pool offers an admission, waiting would block the queue
#   forever. Such a victim ends `kv_cache_exhausted` instead, with the reason `self._no_room_reason(seq,
#   "sequence")` gives (`block_manager.can_ever_fit` answers the question).
#
# The docstring states the contract.

# %%
_ = check("ch06.ex9")

# %% [markdown]
# Your steps 1-3 and 3b (`ch06.ex1`, `ch06.ex2`, `ch06.ex3`, and `ch06.ex9`'s recompute) at work on a tiny
# memory: five blocks of 4 tokens. Requests A (prompt 6, 6 new tokens) and B (prompt 5, 6 new tokens) arrive
# at step 0, C (prompt 3, 3 new tokens) at step 1. Each coloured cell is a
# token whose K/V is in the pool, hatched cells are slots reserved in a request's last block. Step through
# it with the widget (each click is one `schedule()` call plus a fake model), or read the static strip below it.

# %%
Yours123 = your_scheduler("ch06.ex1", "ch06.ex2", "ch06.ex3", "ch06.ex9")


def tiny(mode="recompute", cpu=0):
    return Stepper(
        [("A", 6, 6, 0), ("B", 5, 6, 0), ("C", 3, 3, 1)],
        block_size=4,
        num_gpu_blocks=5,
        num_cpu_blocks=cpu,
        preemption_mode=mode,
        scheduler_cls=Yours123,
    )


stepper_widget(tiny)

# %%
fig = plot_steps(tiny(), 8)
display(fig)
plt.close(fig)

# %%
for mode, cpu in (("recompute", 0), ("swap", 8)):
    s = tiny(mode, cpu)
    while s.sched.has_unfinished_requests() or s.step_no < 2:
        s.step()
    print(f"{mode}:")
    print("  " + "\n  ".join(s.log))

# %% [markdown]
# At step 4 the pool is full and A and B both need a new block: C, admitted last, is preempted. At step 5 B
# needs one more and A must grow too, so B is evicted. With **recompute** the victims lose their KV and go
# back to the *front* of the waiting queue; everything they hold (prompt plus generated tokens) is prefilled
# again later: `prefill B(9)` at step 7 is B's 5 prompt tokens and its 4 generated tokens. With **swap** the
# victims' blocks are copied to the CPU pool (`blocks_to_swap_out`) and copied back when memory frees up; the
# engine pays bytes over the host link instead of compute.
#
# Two corner cases that broke other paged-KV systems in public, on your steps: a request alone that cannot
# grow ends `kv_cache_exhausted` (prompt 6 and 10 new tokens on 2 blocks, below), and a request of prompt P and
# M new tokens needs P + M − 1 slots (the last sampled token is never written): on 16 slots, 16 + 1 fits,
# 16 + 2 does not.


# %%
def run_alone(scheduler_cls, prompt_len, new_tokens, num_blocks):
    s = scheduler_cls(
        SchedulerConfig(max_num_seqs=4, max_model_len=32, max_num_batched_tokens=32),
        CacheConfig(block_size=4, num_gpu_blocks=num_blocks, watermark=0.0),
    )
    g = SequenceGroup(
        "x", [Sequence(0, list(range(1, prompt_len + 1)), 4)], SamplingParams(max_tokens=new_tokens)
    )
    s.add_request(g)
    steps = 0
    while s.has_unfinished_requests():
        out = s.schedule()
        steps += 1
        for e in out.scheduled:
            if e.samples_next_token:
                e.seq.append_token_id(1)
                if len(e.seq.output_token_ids) >= new_tokens:
                    e.seq.status = SequenceStatus.FINISHED_LENGTH
    seq = g.seqs[0]
    return steps, seq.status.value, len(seq.output_token_ids), seq.finish_message


for args in [(16, 1, 4), (15, 2, 4), (16, 2, 4), (6, 10, 2)]:
    steps, status, n, msg = run_alone(Yours123, *args)
    print(
        f"prompt {args[0]:>2} + {args[1]:>2} new on {args[2]} blocks: {status:<18} after {steps} steps, "
        f"{n} tokens{'  | ' + msg if msg else ''}"
    )

# %% [markdown]
# ## 6. Build step 4: swapped sequences come back
#
# `_schedule_swapped(out, budget)` runs only in a step that preempted nobody (a preemption means there was
# no room). It returns the budget left, and:
#
# * **Order.** Swapped sequences come back oldest first (`self.swapped` is in arrival order); none overtakes
#   an older one that does not fit.
# * **Room.** One comes back only with a free seat (`self._num_seats() < config.max_num_seqs`), a chunk
#   `n > 0` of the budget, and GPU room: `block_manager.swap_in(seq, n)` returns the `(cpu_block,
#   gpu_block)` pairs for `out.blocks_to_swap_in`, or `None`, changing nothing, when it does not fit now
#   (the admission watermark, with room for the `n` new tokens).
# * **Back in.** A sequence that came back is out of `swapped`, `RUNNING`, at the back of `self.running`, in
#   `out.swapped_in`, counted in `num_swap_ins`, and its chunk is scheduled (`self._mark_scheduled`) on the
#   slots of `block_manager.allocate_slots(seq, n)` (never `None` after a swap in; its `copies` go to
#   `out.blocks_to_copy`).
# * **No waiting forever.** A swapped sequence that does not fit while nothing else runs would wait for
#   memory nobody will free: it leaves `swapped` by recompute (`self._recompute(seq, out)`, which also frees
#   its CPU blocks).
#
# Return the budget left. **Your turn:** the region `ch06.ex4`.

# %%
_ = check("ch06.ex4")

# %% [markdown]
# ## 7. Build step 5: admission, first come first served, and the watermark (E9)
#
# `_schedule_waiting(out, budget)` runs only in a step that preempted nobody and with nothing swapped out. For
# the waiting sequences in arrival order. What must hold:
#
# (A request that can never run never gets here: `add_request` turns it away at arrival, with your build step 5b
# below.)
#
# * **First come, first served.** The first sequence that does not fit stops admission: nobody behind it
#   overtakes.
# * **Seats.** A sequence takes `self._seats(seq)` seats (a request with `n` samples that has not forked yet
#   needs `n`); the seats taken never exceed `config.max_num_seqs`.
# * **Budget.** Tokens the prefix cache already holds cost no budget. Look the prefix up once per
#   admission attempt, `computed = block_manager.get_computed_blocks(seq)`; the chunk is `self._chunk` of
#   the tokens those blocks do not cover, and a chunk of 0 does not fit.
# * **The watermark.** `block_manager.allocate_slots(seq, n, computed)` shares the cached prefix and gives
#   slots to `n` tokens only if that leaves at least `watermark × num_gpu_blocks` blocks free, else returns
#   `None` (the call shape of vLLM v1's `get_computed_blocks` then `allocate_slots`,
#   `vllm/v1/core/kv_cache_manager.py`, 0.8.5; the watermark itself is v0's).
# * **Admitted.** Out of `waiting`, `RUNNING`, at the back of `self.running`, its chunk scheduled with
#   `self._mark_scheduled(...)`.
#
# **Ledger row E9.** The fragmentation article (§3.2) describes the block manager's `watermark=0.01` as *"the water line:
# below this ratio, preemption is triggered"*. That is not what it does. In vLLM v0 (`SelfAttnBlockSpaceManager.can_allocate`
# in `vllm/core/block_manager.py`, 0.10.2) the watermark applies only to **admission**; v1 has none up to 0.23.0,
# and from 0.24.0 an optional one, off by default, for admissions only (`KVCacheManager`). Running sequences may use the reserved blocks
# to grow, and preemption happens only when a running sequence finds no free block at all. The reserve
# exists so that admitting new prompts does not fill the pool to the last block and force a preemption a
# few steps later.
#
# **Your turn:** the region `ch06.ex5`.

# %%
_ = check("ch06.ex5")

# %% [markdown]
# ### Build step 5b: never, or only not yet?
#
# FCFS has a price: the first waiting prompt that does not fit stops admission for everyone behind it. That is
# right for a prompt that will fit once running requests finish, and a disaster for one that never will: it
# would block the queue forever. So `add_request` asks once, at arrival, `self._never_reason(seq)`: a reason
# string ends the request `ignored` (the engine reports it to the caller with that reason), `None` sends it to
# `waiting`. The line between the two is the design question of the region `ch06.ex8`: which limits would
# still stop this sequence if every other request finished now? The pool's free blocks at this moment are not
# one of them. The docstring lists the limits this engine has and the order in which they are reported.
#
# vLLM v0 asks the same question (`AllocStatus.NEVER` from `can_allocate`, and the prompt limit, in
# `_schedule_prefills`, `vllm/core/scheduler.py`, 0.10.2), each time a prompt reaches the front of the queue.

# %%
_ = check("ch06.ex8")

# %% [markdown]
# **Predict, then run.** A pool of 8 blocks of 4 tokens, watermark 0.25, `max_model_len` 32 and `max_num_seqs`
# 4, with 6 of the blocks held by a running request. Five requests arrive: prompts of 24, 25, 32 and 33 tokens,
# and one of 3 tokens asking for `n=5` samples. How many of them are ignored? Set `prediction`, then run both
# cells.

# %%
prediction = None  # your guess, e.g. prediction = 2

# %%
arrivals = [(24, 1), (25, 1), (32, 1), (33, 1), (3, 5)]  # (prompt tokens, n)
YoursNever = your_scheduler("ch06.ex8")
never_sched = YoursNever(
    SchedulerConfig(max_num_seqs=4, max_model_len=32, max_num_batched_tokens=32),
    CacheConfig(block_size=4, num_gpu_blocks=8, watermark=0.25),
)
busy = SequenceGroup("busy", [Sequence(0, list(range(1, 23)), 4)], SamplingParams(max_tokens=4))
never_sched.add_request(busy)
never_sched.schedule()  # the busy request's 22 tokens take 6 of the 8 blocks
busy.seqs[0].append_token_id(1)  # the token its step sampled
for i, (prompt_len, n) in enumerate(arrivals):
    never_sched.add_request(
        SequenceGroup(
            f"p{prompt_len}n{n}",
            [Sequence(i + 1, list(range(1, prompt_len + 1)), 4)],
            SamplingParams(max_tokens=2, n=n),
        )
    )
turned_away = never_sched.schedule().ignored
print(f"free blocks now: {never_sched.block_manager.get_num_free_gpu_blocks()} of 8")
for seq in turned_away:
    print(f"  {seq.group.request_id}: {seq.finish_message}")
print("waiting:", [seq.group.request_id for seq in never_sched.waiting])
reveal(
    prediction,
    len(turned_away),
    "requests ignored",
    why="25 tokens need 7 blocks where an admission may take 6 of 8 (the watermark keeps 2), 32 tokens likewise, "
    "33 is over max_model_len and 5 samples need 5 seats of 4; the 24-token prompt only has to wait for the "
    "busy request, which is later, not never",
)

# %% [markdown]
# Your whole scheduler (or the reference for the steps that do not pass yet) in the simulator: 100 requests
# arriving at 8 per second, a pool of 256 blocks of 16 tokens, four watermarks.

# %%
YourScheduler = your_scheduler(*STEP_METHODS)
arrivals = make_workload(100, seed=5, mean_prompt=200, mean_output=200, max_len=1024, rate=8.0)
by_watermark = {
    wm: simulate(
        arrivals,
        SchedulerConfig(max_num_seqs=64, max_model_len=1024),
        CacheConfig(block_size=16, num_gpu_blocks=256, watermark=wm),
        cost,
        name=f"wm {wm}",
        scheduler_cls=YourScheduler,
    )
    for wm in (0.0, 0.01, 0.05, 0.1)
}

# %%
print(
    f"{'watermark':>9} {'kept free':>9} {'preemptions':>12} {'recomputed tokens':>18} {'tokens/s':>9} "
    f"{'latency s':>10}"
)
for wm, res in by_watermark.items():
    print(
        f"{wm:>9.2f} {int(wm * 256):>9} {res.num_preemptions:>12} {res.recomputed_tokens:>18} "
        f"{res.throughput:>9.0f} {res.mean_latency_s:>10.2f}"
    )

# %% [markdown]
# Without a reserve the scheduler fills the pool at admission and then preempts (and recomputes) dozens of
# requests as the running ones grow. A reserve of 5-10% of the blocks removes most of those preemptions at
# the same throughput. vLLM v0's default of 1% (0.10.2) is a small safety margin (2 blocks here); it matters most when
# many short prompts arrive while long outputs are being generated. The watermark never *causes* a preemption.
#
# ## 8. Chunked prefill: why vLLM v1 cuts prompts
#
# A prompt's prefill is the largest piece of work a step can hold: a 2,000-token prompt is 2,000 tokens of
# compute in one forward pass, against one token for each decoding request. Whatever step runs it, every
# request decoding in that step waits for it: the step takes as long as its tokens. Three designs, on one trace
# (A and B are decoding, C brings a 24-token prompt at step 3, D a 3-token one at step 4):
#
# * **vLLM v0's default scheduler** (`_schedule_default` in `vllm/core/scheduler.py`) schedules new prompts
#   *first*, whole, and a step that admits a prompt runs **no decodes**: A and B stall for a step, and again
#   for D. Prompts are never cut, so its budget must hold `max_model_len` tokens (32 here).
# * **vLLM v0 with chunked prefill** (`_schedule_chunked_prefill`, after Sarathi) runs decodes first, then the
#   next chunks of running prompts, then swapped requests, then new prompts into what is left of the budget
#   (8 tokens here): A and B never stall; C arrives in chunks.
# * **vLLM v1** (`vllm/v1/core/sched/scheduler.py`) has the same order without the swapped step, and admits
#   nobody in a step that preempted. This engine follows v1 here, with v0's swapped step in the middle.
#
# `paged_course.sim.step_order` rebuilds v0's two orders as small subclasses of the engine's scheduler (they
# reuse its policy methods), and `run_trace` runs the trace through each, through the content-checked fake
# engine, recording what every request did in every step (`P6`: a prefill chunk of 6 tokens, `D`: a decode).

# %%
trace = [
    TraceRequest("A", 4, 8, 0),
    TraceRequest("B", 4, 8, 0),
    TraceRequest("C", 24, 3, 2),
    TraceRequest("D", 3, 4, 3),
]
settings = {"vLLM v0 default": dict(max_num_batched_tokens=32, enable_chunked_prefill=False)}
traces = {
    name: run_trace(
        cls, trace, max_model_len=32, **settings.get(name, dict(max_num_batched_tokens=8))
    )
    for name, cls in ORDERS.items()
}
fig = plot_step_orders(traces, ["A", "B", "C", "D"])
display(fig)
plt.close(fig)

# %% tags=["nbval-check-output"]
for name, steps in traces.items():
    stalls = sum(row.get(r) == "stall" for row in steps for r in "AB")
    first = (
        max(i for i, row in enumerate(steps) if row.get("C", "").startswith("P")) + 1
    )  # its last chunk
    print(f"{name:<26} decode steps A and B lost: {stalls} | C's first token after step {first}")

# %% [markdown]
# The price of chunking shows in C: its prompt takes four steps instead of one, so its first token comes
# later. The gain is that nobody else waits: A and B decode in every step.
#
# v0 with chunked prefill and v1 differ only in a step that preempts. With the pool cut to 7 blocks, A and B
# grow until C, the newest, is preempted (step 5). v1 then admits nobody in that step; v0 admits new prompts
# into the budget left, and C, at the front of the waiting queue, is admitted again at once, only to be
# preempted again in the next step. The figure labels such a step `x 6` and the printed line below it
# `pre+P6`: both mean preempted, then admitted again in the same step with 6 prompt tokens computed again.
# In the printed lines `P8` is a prompt chunk of 8 tokens, `D` a decode, `pre` a preemption, `wait` a step in
# the waiting queue, `.` not arrived yet or finished:

# %%
tight = {
    name: run_trace(cls, trace, max_model_len=32, num_gpu_blocks=7, max_num_batched_tokens=8)
    for name, cls in (
        ("vLLM v0, chunked prefill", V0ChunkedScheduler),
        ("vLLM v1 (this engine)", Scheduler),
    )
}
fig = plot_step_orders(tight, ["A", "B", "C", "D"])
display(fig)
plt.close(fig)
for name, steps in tight.items():
    print(f"{name:<26} C, step by step: " + " ".join(row.get("C", ".") for row in steps))

# %% [markdown]
# ### The chunk budget against latency
#
# So the budget trades two latencies (Sarathi-Serve, Agrawal et al., OSDI 2024). **Time to first token**
# (TTFT: arrival to first token) wants large chunks: a prompt finishes in fewer steps, each paying the
# step's fixed cost once. **Inter-token latency** (ITL: the gap between two tokens of a sequence) wants small
# steps: every decoding request waits through whatever chunk shares its step. Sarathi-Serve reports p50 and
# p99 of both; p99 is where a large chunk hurts, because most steps carry no long prompt.
#
# First in the simulator, on the cost model: 150 requests arriving at 3 per second, long-tailed prompts of 512
# tokens on average, 128 new tokens on average, a pool of 4,096 blocks, for budgets 128 to 2048, and vLLM v0's
# default order for comparison (`chunk_budget_sweep`, dotted lines).

# %%
latency_workload = make_workload(
    150, seed=3, mean_prompt=512, mean_output=128, max_len=2048, rate=3.0
)
sim_rows = chunk_budget_sweep(
    latency_workload,
    [128, 256, 512, 1024, 2048],
    CacheConfig(block_size=16, num_gpu_blocks=4096),
    cost,
)
fig = plot_latency_vs_budget(
    sim_rows, "simulated (cost model): chunk budget against TTFT and ITL, p50 and p99"
)
display(fig)
plt.close(fig)

# %% tags=["nbval-check-output"]
print(
    f"{'':<36} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'longest step':>13} {'tok/s':>6}"
)
for r in sim_rows:
    print(
        f"{r['name']:<36} {1e3 * r['ttft_p50']:>7.0f}ms {1e3 * r['ttft_p99']:>7.0f}ms {1e3 * r['itl_p50']:>6.0f}ms "
        f"{1e3 * r['itl_p99']:>6.0f}ms {1e3 * r['max_step_s']:>11.0f}ms {r['tokens_per_s']:>6.0f}"
    )

# %% [markdown]
# The p50 ITL is the same everywhere: most steps carry only decodes. The p99 ITL grows with the budget up to
# 1,024 tokens, where it levels off (few prompts here are longer), and v0's default order is worst: its prompt
# steps stall every decode. TTFT goes the other way: small budgets cut a prompt
# into many steps, each paying the 20 ms fixed cost. At this load the throughput is the same for every budget;
# Sarathi-Serve's point is that a budget of a few hundred tokens keeps the p99 ITL low for a small TTFT cost.
#
# Now on the engine itself: the built-in model on this CPU, 9 requests (every third a 384-token prompt,
# the others 12 tokens, 4 to 16 new tokens each), at most 4 running at once so that new prompts arrive while
# others decode. `LLM.stats()` gives the p50 / p99 of TTFT and ITL of the last `generate` (medians of three
# runs: wall-clock time on a shared CPU is noisy), and the engine's step history gives, exactly, the most
# tokens computed in a step that also ran decodes.

# %%
model, tokenizer = load_default()
gen = torch.Generator().manual_seed(0)
engine_prompts = [
    torch.randint(32, 127, ((384 if i % 3 == 1 else 12),), generator=gen).tolist() for i in range(9)
]
engine_params = [SamplingParams(max_tokens=4 + (5 * i) % 13, ignore_eos=True) for i in range(9)]
LLM(model, verbose=False).generate(
    engine_prompts[:2], SamplingParams(max_tokens=2), use_tqdm=False
)  # warm-up
engine_rows = engine_budget_sweep(
    model,
    engine_prompts,
    engine_params,
    [32, 128, 512],
    repeats=3,
    block_size=16,
    num_gpu_blocks=256,
    max_num_seqs=4,
    enable_prefix_caching=False,
)
fig = plot_latency_vs_budget(
    engine_rows, "measured on the engine (this CPU, built-in model): TTFT and ITL, p50 and p99"
)
display(fig)
plt.close(fig)
print(
    f"{'budget':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'prefill chunks':>15} "
    f"{'steps':>6} {'largest step with decodes':>26}"
)
for r in engine_rows:
    print(
        f"{r['budget']:>6} {1e3 * r['ttft_p50']:>7.0f}ms {1e3 * r['ttft_p99']:>7.0f}ms {1e3 * r['itl_p50']:>6.1f}ms "
        f"{1e3 * r['itl_p99']:>6.1f}ms {r['prefill_chunks']:>15} {r['steps']:>6} {r['max_decode_step_tokens']:>19} tokens"
    )
small, large = engine_rows[0], engine_rows[-1]
print(
    f"budget {small['budget']} -> {large['budget']}: ITL p99 x{large['itl_p99'] / small['itl_p99']:.1f}, "
    f"TTFT p50 x{large['ttft_p50'] / small['ttft_p50']:.2f}"
)

# %% [markdown]
# The engine shows the simulator's trade-off. The step counts are exact: a budget of 32 cuts each long prompt
# into a dozen chunks or more and needs the most steps; a budget of 512 prefills it in one step, which is
# then the step the decoding requests wait through (the last column). The times are this CPU's and vary from
# run to run, but in our runs their direction did not: the p99 inter-token latency climbs with the budget,
# while the time to first token is worst at the smallest budget, which needs the most steps. On a GPU the fixed cost of a step is relatively larger (reading the
# weights), which is why vLLM v1's default budget is in the thousands there (2,048 to 16,384 tokens on a GPU,
# depending on the entry point and the GPU's memory: `_set_default_args_v1` in `vllm/engine/arg_utils.py`, 0.8.5), and why
# `long_prefill_token_threshold` exists: it caps one prompt's chunk without shrinking the whole step.
#
# ## 9. Recompute or swap? It depends on the block size
#
# The paper (§7.3, Fig. 19) found that swapping suffers at small block sizes: each block is a separate small
# copy over PCIe (per layer, for K and V), so the fixed cost per transfer dominates; recomputation costs the
# same whatever the block size. Recompute wins for small blocks, swap for large ones, and they are close
# for 16-64.
#
# The cost model charges recompute its prefill tokens (`per_token_s` each) and swap
# `2 × layers` transfers per block, each `transfer_latency_s` (10 µs) plus bytes at 25 GB/s. The GPU pool
# holds 4,096 token slots and the CPU swap space as many; 64 requests arrive at once.

# %%
pressure = make_workload(64, seed=1, mean_prompt=200, mean_output=300, max_len=1024)
rows = recompute_vs_swap(
    pressure, [1, 4, 16, 64, 256], kv_slots=4096, max_model_len=1024, cost=cost
)

# %% tags=["nbval-check-output"]
print(
    f"{'block':>5} {'recompute s':>12} {'overhead s':>11} {'swap s':>8} {'overhead s':>11} {'preemptions':>12}"
)
for r in rows:
    print(
        f"{r['block_size']:>5} {r['recompute_s']:>12.1f} {r['recompute_overhead_s']:>11.2f} {r['swap_s']:>8.1f} "
        f"{r['swap_overhead_s']:>11.2f} {r['recompute_preemptions']:>12}"
    )

# %%
fig, ax = plt.subplots(figsize=(6, 3.2))
sizes = [r["block_size"] for r in rows]
ax.plot(sizes, [r["recompute_overhead_s"] for r in rows], "o-", label="recompute")
ax.plot(sizes, [r["swap_overhead_s"] for r in rows], "s-", label="swap")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("block size (tokens)")
ax.set_ylabel("time spent on preemption (s)")
ax.set_title("preemption overhead by block size (simulated, cost model)", fontsize=9)
ax.legend(frameon=False)
display(fig)
plt.close(fig)

# %% [markdown]
# The simulated overheads reproduce the paper's shape: swap costs about ten times recompute at block size 1,
# the two cross between 16 and 64, and swap is cheaper with large blocks. The total time also grows with the
# block size for another reason: bigger blocks waste more slots in each request's last block (chapter 01),
# so fewer requests fit. These are the cost model's numbers; a real GPU changes the constants, not the shape.
# vLLM v1 keeps only recompute (0.8.5 to 0.34.0: a victim's blocks are freed, its `num_computed_tokens` reset
# and it goes back to the front of the waiting queue); swap is v0's, and this engine keeps it so that the two
# can be compared.
#
# ### Build steps 6 and 7: the CPU swap space
#
# Where do a swapped sequence's blocks wait? In a second, smaller pool in host memory, with its own
# allocator: the block manager hands swapping to a small component, `SwapSpace` (`paged/core/swap.py`),
# which keeps one CPU block table per swapped-out sequence. vLLM v0 did the same
# (`SelfAttnBlockSpaceManager.swap_out` / `swap_in` in `vllm/core/block_manager.py`, moving the blocks
# through `CpuGpuBlockAllocator.swap`, `vllm/core/block/cpu_gpu_block_allocator.py`, 0.10.2, the last
# release with v0; v1 has no swap space).
#
# Two rules make it more than a copy loop. **Allocate or `None`**: a swap-out that the CPU pool cannot hold
# returns `None` and changes nothing, so `_preempt` (step 3) falls back to recompute. **Copy once**: forked
# samples share blocks (chapter 05), and when siblings are swapped out one after the other, a block they
# share is copied to the CPU once; the later sibling takes one more reference to that copy, and the same on
# the way back in. Copying it twice would spend CPU blocks and PCIe time on identical bytes and, worse, bring
# the siblings back as two private copies where they used to share one. A remembered copy is only true while
# both blocks hold the same bytes, so it is forgotten when either block is freed to zero (the next owner
# writes other data into it) or the GPU block is written in place; the block manager forgets GPU blocks,
# the swap space forgets CPU blocks.
#
# **Your turn.** Write the two regions of `exercises/ex06_swap.py`: `swap_out` (`ch06.ex6`) and `swap_in`
# (`ch06.ex7`), in a subclass of the reference `SwapSpace`; the docstrings state the contracts. The checks
# plug your swap space into the reference block manager and model the bytes: every pair you return is
# copied, and after each operation of a random trace every table must hold its own sequence's tokens and
# every remembered copy must match its original.

# %%
_ = check("ch06.ex6")

# %%
_ = check("ch06.ex7")

# %% [markdown]
# **Predict, then run.** Blocks of 4 tokens. A parent of 9 tokens (two full blocks and one partly filled)
# forks a child, which then decodes one token: copy-on-write gives the child a private last block. The parent
# is swapped out, then the child. How many CPU blocks do the two swap-outs take together?

# %%
prediction = None  # your guess, e.g. prediction = 6

# %%
swap_module = exercise_module("ex06_swap")
YourSwap = (
    learner_or_reference(["ch06.ex6", "ch06.ex7"], swap_module.SwapSpace, SwapSpace)
    if swap_module
    else SwapSpace
)
sm = BlockSpaceManager(4, 12, num_cpu_blocks=8, watermark=0.0)
sm.swap = YourSwap(4, 8)
parent = Sequence(100, list(range(1, 10)), 4)
sm.allocate_slots(parent)
child = parent.fork(101)
sm.fork(parent, child)
child.append_token_id(42)
cow = sm.allocate_slots(child, 1).copies
out_parent, out_child = sm.swap_out(parent), sm.swap_out(child)
print(f"copy-on-write {cow}; parent out {out_parent}; child out {out_child}")
reveal(
    prediction,
    8 - sm.get_num_free_cpu_blocks(),
    "CPU blocks taken",
    why="the parent copies its 3 blocks; the child shares the 2 full ones, so it reuses their copies "
    "(one more reference each) and copies only its private last block",
)
back_parent, back_child = sm.swap_in(parent), sm.swap_in(child)
print(f"parent in {back_parent}; child in {back_child}")
print(
    "the siblings share",
    [b for b in sm.get_block_table(child) if b in sm.get_block_table(parent)],
    "on the GPU again; free CPU blocks:",
    sm.get_num_free_cpu_blocks(),
)

# %% [markdown]
# The child's swap-in copies only its private block: the two full blocks came back with the parent, and the
# child shares them again, as before the swap. Without the reuse the pair would come back holding five GPU
# blocks instead of four.
#
# ## 10. What it costs: `schedule()` at scale
#
# `python -m paged bench scheduler` times `schedule()` with 64, 256 and 1024 running requests. A quick taste:

# %%
from paged_course.bench.scheduler import _time_schedule

for n in (64, 256):
    secs = _time_schedule(n, 16)
    print(
        f"{n:>5} running requests: {min(secs) * 1e6:8.0f} us per schedule() call (fastest of 16, this CPU)"
    )

# %% [markdown]
# The work per request is constant, so the cost grows linearly with the number of running requests. For a
# model step of tens of milliseconds, a few milliseconds of scheduling at 1,000 requests matters. (vLLM v1's
# scheduler sends its workers only what changed for a request already running, `CachedRequestData` in
# `vllm/v1/core/sched/output.py`; this course's scheduler has no such optimization.)
#
# ## 11. The engine on your scheduler
#
# Your `Scheduler` is the engine part `scheduler`: `LLM(parts=Parts(scheduler=...))` runs the real engine on
# it. Six requests on a pool of 14 blocks of 8 tokens, which cannot hold them all at once: the engine must
# chunk, preempt and recompute. The tokens must equal those of the reference engine.

# %%
# The engine takes your whole Scheduler or none of it: yours only when all its steps pass.
your_module = exercise_module("ex06_scheduler")
still_failing = [step for step in STEP_METHODS if not run_check(step)] if your_module else []
your_part = your_module.Scheduler if your_module and not still_failing else Scheduler
if your_module is None:
    verdict = "your file does not import, so it runs on the reference Scheduler"
elif still_failing:
    verdict = f"still failing: {', '.join(still_failing)}, so it runs on the reference Scheduler"
else:
    verdict = "all pass, so it runs on yours"
print(
    f"the engine uses your Scheduler only when all its steps ({', '.join(STEP_METHODS)}) pass; {verdict}"
)
demo_prompts = [list(range(40 + i, 58 + 4 * i)) for i in range(6)]
demo_params = SamplingParams(max_tokens=24, ignore_eos=True)


def run_engine(parts):
    llm = LLM(
        model,
        block_size=8,
        num_gpu_blocks=14,
        max_num_batched_tokens=32,
        max_num_seqs=6,
        parts=parts,
        verbose=False,
    )
    outs = llm.generate(demo_prompts, demo_params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm.stats()


reference_tokens, reference_stats = run_engine(Parts())
your_tokens, your_stats = run_engine(Parts(scheduler=your_part))
print("scheduler:", origins(Parts(scheduler=your_part))["scheduler"])
print("same tokens as the reference engine:", your_tokens == reference_tokens)
print({k: your_stats[k] for k in ("preemptions", "recomputes", "prefill_chunks", "steps")})

# %% [markdown]
# ## Summary
#
# - Continuous batching re-decides at every step: finished requests leave at once and waiting ones join. With
#   paged memory it ran about 6x the throughput of static batching on the same pool and requests (simulated).
# - The scheduler is a hybrid: vLLM v1's step (one token budget, running sequences first with decodes and the
#   next prompt chunks, preemption of the newest, nobody admitted in a step that preempted) with three pieces of
#   vLLM v0 that v1 dropped: the swapped queue (back before new prompts), the admission watermark, and the fork
#   of a request's `n` samples with copy-on-write. v1 recomputes only and fans `n > 1` out into independent
#   requests. The sequence is the unit: `n` samples are scheduled, preempted and swapped one by one.
# - Chunked prefill cuts a prompt into the budget left (at most `long_prefill_token_threshold` per step):
#   decodes never stall behind a prompt. vLLM v0's default order ran prompts first, whole, and no decode in
#   such a step. The budget trades TTFT (large chunks) against the p99 of ITL (small chunks): measured in the
#   simulator and on the engine.
# - When memory runs out the most recently admitted sequence is preempted, by recompute (v0 and v1) or swap
#   (v0 only); a sequence
#   alone that cannot grow ends `kv_cache_exhausted` (this course's state: vLLM refuses at start-up a KV cache
#   that cannot hold one `max_model_len` request); a prompt that can never fit is ignored with a reason.
# - Swap pays per transfer, so it loses at small block sizes and wins at large ones; recompute's cost does not
#   depend on the block size (paper §7.3, reproduced by the cost model).
# - The swap space allocates or returns `None` (then the victim is recomputed), and copies a block that forked
#   samples share once: a sibling swapped later reuses the copy with one more reference, in both directions.
#   A remembered copy is forgotten as soon as either block is freed to zero or written in place.
# - The watermark is an admission reserve, not a preemption trigger (E9): a 10% reserve cut preemptions by 90% here.
# - Chapter 07 puts the engine, on your parts, in front of a real transformers model.
#
# ## Further reading
#
# - Kwon et al., *Efficient Memory Management for Large Language Model Serving with PagedAttention*, SOSP 2023:
#   §4.5 (scheduling and preemption: FCFS, all-or-nothing eviction, recompute and swap), §7.3 (recompute against
#   swap by block size, Fig. 19).
# - Agrawal et al., *Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve*, OSDI 2024: chunked
#   prefills and stall-free batching (§3-4), TTFT and TBT at p50 / p99 against the chunk size (§5).
# - Yu et al., *Orca: A Distributed Serving System for Transformer-Based Generative Models*, OSDI 2022:
#   iteration-level scheduling (continuous batching).
# - vLLM v1 (read in 0.8.5 and 0.34.0): `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`: one budget,
#   running first, `long_prefill_token_threshold`, preemption of the last running request by recompute),
#   `vllm/v1/core/sched/output.py` (`SchedulerOutput`: `num_scheduled_tokens` per request),
#   `vllm/v1/core/kv_cache_manager.py` (`allocate_slots`), `vllm/v1/engine/parallel_sampling.py` (`ParentRequest`:
#   `n > 1` as independent requests).
# - vLLM v0 (read in 0.10.2, the last release that ships it; 0.11.0 removed `vllm/core/`): `vllm/core/scheduler.py`
#   (`_schedule_default`, `_schedule_chunked_prefill`, `_schedule_running`, `_schedule_swapped`,
#   `_schedule_prefills`, `_preempt_by_recompute`, `_preempt_by_swap`), `vllm/core/block_manager.py`
#   (`SelfAttnBlockSpaceManager.can_allocate` and the watermark); the fork of parallel sampling in 0.6.3:
#   `vllm/engine/output_processor/single_step.py`.

# %%
print(
    f"time since the set-up cell ran: {time.perf_counter() - chapter_start:.0f} s "
    "(reading and editing time included)"
)
