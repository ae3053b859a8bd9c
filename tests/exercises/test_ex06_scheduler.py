"""Graded: chapter 06, the scheduling policy the engine runs (exercises/ex06_scheduler.py).

Each region is tested on its own: the learner's method goes into a subclass of the reference
``paged.core.scheduler.Scheduler``, so an unfinished step never fails another step's checks. A
content-checked fake engine (``paged_course.sim.kv_check.CheckedEngine``) executes every step: it moves
the blocks the step orders (swap out, swap in, copy-on-write), writes the scheduled tokens and checks
that every token a sequence attends to holds that sequence's own prefix, and that no step exceeds the
token budget. Hand-made cases try each rule (decodes before a long prefill, a request alone that cannot
grow, a sequence the budget does not reach, the watermark, recompute and swap bookkeeping, seats and
order of swap-in); the two checks that pin the policy the chapter names beyond the invariants (the newest
victim first) say so in their message (``PINNED``); seeded random runs check
invariants any correct policy holds, not the reference's exact steps (``check_step``: no block
over-committed, a preemption only when an allocation failed, every victim's GPU blocks freed, the victim
no older than a sequence that kept running, nobody admitted in a step that preempted, swapped kept oldest
first) and that every request ends as with the reference, same status and same tokens. A policy in vLLM
v1's shape passes them (tests/unit/test_ch06_v1_policy.py).
"""

from __future__ import annotations

import itertools
import random

import pytest

from paged.config import CacheConfig, SchedulerConfig
from paged.core.scheduler import Scheduler as RefScheduler
from paged.core.scheduler_outputs import SchedulerOutputs
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged_course.sim.kv_check import CheckedEngine, assert_all_free


def prefills(out) -> list:
    """The step's prompt chunks (``SchedulerOutputs.scheduled`` entries that are prefills)."""
    return [s for s in out.scheduled if s.is_prefill]


S = SequenceStatus


PINNED = (
    "pinned case of the policy this chapter names (the newest victim first, one victim at a time), "
    "beyond the invariants any correct policy holds: "
)


def mix(ex, *methods):
    """The reference Scheduler with the learner's ``methods`` (their own definitions, not inherited)."""
    own = vars(ex.Scheduler)
    missing = [m for m in methods if m not in own]
    assert not missing, f"Scheduler must define {', '.join(missing)} (schedule() calls it)"
    return type("LearnerScheduler", (RefScheduler,), {m: own[m] for m in methods})


_ids = itertools.count()


def make(rid, prompt, max_tokens, bs=4, n=1):
    prompt = list(range(1, prompt + 1)) if isinstance(prompt, int) else list(prompt)
    return SequenceGroup(
        rid, [Sequence(next(_ids), prompt, bs)], SamplingParams(n=n, max_tokens=max_tokens)
    )


def sched(
    cls,
    num_gpu_blocks,
    bs=4,
    max_model_len=32,
    mode="recompute",
    num_cpu_blocks=0,
    watermark=0.0,
    prefix=False,
    **kw,
):
    kw.setdefault("max_num_seqs", 4)
    return cls(
        SchedulerConfig(max_model_len=max_model_len, preemption_mode=mode, **kw),
        CacheConfig(
            block_size=bs,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            watermark=watermark,
            enable_prefix_caching=prefix,
        ),
    )


def ids(seqs):
    return [s.group.request_id for s in seqs]


def plan(out):
    """(request, start, num_tokens) of each scheduled sequence."""
    return [(s.seq.group.request_id, s.start, s.num_tokens) for s in out.scheduled]


# ---------------------------------------------------------------- random runs checked by invariants
def random_spec(seed):
    rng = random.Random(seed)
    bs = rng.choice([2, 4])
    mode = rng.choice(["recompute", "swap"])
    chunked = rng.random() < 0.8
    cpu = rng.randint(2, 8) if mode == "swap" else 0
    cfg = dict(
        bs=bs,
        num_gpu_blocks=rng.randint(3, 9),
        mode=mode,
        num_cpu_blocks=cpu,
        watermark=rng.choice([0.0, 0.0, 0.2]),
        prefix=rng.random() < 0.5,
        max_model_len=16,
        max_num_seqs=rng.choice([2, 4]),
        enable_chunked_prefill=chunked,
        max_num_batched_tokens=rng.choice([4, 6, 16]) if chunked else 16,
        long_prefill_token_threshold=rng.choice([0, 0, 3]) * chunked,
    )  # a threshold needs chunking
    reqs = []  # (arrival step, id, prompt, max_tokens, n)
    for i in range(rng.randint(2, 8)):
        p = rng.randint(1, 14)
        prompt = [1 + rng.randrange(2)] * min(p, 4) + [10 + i] * max(
            0, p - 4
        )  # shared heads: prefix hits
        reqs.append(
            (rng.randint(0, 6), f"r{i}", prompt, rng.randint(1, 8), rng.choice([1, 1, 1, 2]))
        )
    return cfg, sorted(reqs)


def run_spec(cls, cfg, reqs, max_steps=400):
    """Run the requests through ``cls`` with a checked engine (budget, seats, K/V contents) and check the
    invariants every correct policy holds after each step (``check_step``). Returns the kinds of decision
    seen and each request's outcome ``[(status, output tokens)]``."""
    s = sched(cls, **cfg)
    engine, pending, seen = CheckedEngine(s), list(reqs), set()
    failed = _watch_allocations(s.block_manager)
    seq_ids = itertools.count()
    groups = []
    for t in itertools.count():
        while pending and pending[0][0] <= t:
            _, rid, prompt, m, n = pending.pop(0)
            groups.append(
                SequenceGroup(
                    rid,
                    [Sequence(next(seq_ids), prompt, cfg["bs"])],
                    SamplingParams(n=n, max_tokens=m),
                )
            )
            s.add_request(groups[-1])
        if not pending and not s.has_unfinished_requests():
            break
        assert t < max_steps, f"no progress after {max_steps} steps: a livelock"
        running, waiting = [x for x in s.running if not x.is_finished], list(s.waiting)
        failed.clear()
        out = engine.step()
        check_step(s, out, running, waiting, failed, f"step {t + 1}")
        kinds = ("preempted", "swapped_in", "ignored", "exhausted", "blocks_to_copy")
        seen |= {k for k in kinds if getattr(out, k)}
        if any(x.num_tokens > 1 and x.start > 0 for x in out.scheduled):
            seen.add("chunked")
    assert_all_free(s)
    outputs = {g.request_id: [(x.status.value, x.output_token_ids) for x in g.seqs] for g in groups}
    return seen, outputs


def _watch_allocations(bm):
    """Record the allocations that failed (``allocate_slots`` / ``swap_in`` returned ``None``)."""
    failed = []
    for name in ("allocate_slots", "swap_in"):
        original = getattr(bm, name)

        def watched(seq, *args, _original=original, _name=name):
            got = _original(seq, *args)
            if got is None:
                failed.append((_name, seq.seq_id))
            return got

        setattr(bm, name, watched)
    return failed


def check_step(s, out, running, waiting, failed, where):
    """The invariants of one step, whatever the policy's shape: blocks never over-committed, a preemption
    only when an allocation failed, every victim's GPU blocks freed (swapped: SWAPPED with its CPU blocks;
    recomputed: WAITING from token 0, or ended kv_cache_exhausted), victims no older than any running
    sequence that kept going, nobody admitted in a step that preempted."""
    bm = s.block_manager
    held = {b for x in s.running for b in bm.get_block_table(x)}
    used = bm.num_gpu_blocks - bm.get_num_free_gpu_blocks()
    assert len(held) <= used <= bm.num_gpu_blocks, (
        f"{where}: running sequences hold {len(held)} GPU blocks, the pool counts {used} of "
        f"{bm.num_gpu_blocks} in use: blocks over-committed"
    )
    if out.preempted:
        assert failed, f"{where}: preempted {ids(out.preempted)} though no allocation failed"
    order = {x.seq_id: i for i, x in enumerate(running)}
    kept = [x for x in out.scheduled if x.seq.seq_id in order]
    for victim in out.preempted:
        name = f"{where}: preempted {victim.group.request_id!r} (sequence {victim.seq_id})"
        assert victim.seq_id in order, f"{name} was not running"
        assert victim not in s.running and not any(x.seq is victim for x in out.scheduled), (
            f"{name} still runs"
        )
        assert victim.seq_id not in bm.block_tables, f"{name} still holds GPU blocks"
        if victim.status is S.SWAPPED:
            assert victim in s.swapped and victim.seq_id in bm.cpu_block_tables, (
                f"{name}: swapped, it must wait in swapped with its CPU blocks"
            )
        elif victim.status is S.WAITING:
            assert victim in s.waiting and victim.num_computed_tokens == 0, (
                f"{name}: recomputed, it waits with num_computed_tokens 0"
            )
        else:
            assert victim.status is S.FINISHED_KV_EXHAUSTED and victim in out.exhausted, (
                f"{name} is {victim.status.value}: swapped, waiting again, or kv_cache_exhausted"
            )
        older = [x.seq.group.request_id for x in kept if order[x.seq.seq_id] > order[victim.seq_id]]
        assert not older, (
            f"{name} is older than {older}, which kept running: the victim is the most recently admitted"
        )
    if out.preempted:
        admitted = [x.seq.group.request_id for x in out.scheduled if x.seq in waiting]
        assert not admitted, f"{where}: admitted {admitted} in a step that preempted"
    assert len(s.swapped) == len(set(map(id, s.swapped))) and list(s.swapped) == sorted(
        s.swapped, key=s._rank
    ), f"{where}: swapped must hold each sequence once, oldest first"


def assert_invariants(cls, seeds, recompute_only=False):
    """Seeded random runs: every step holds the invariants (``check_step``) and every request ends as
    with the reference (same status, same tokens). Returns the kinds of decision the runs made."""
    seen = set()
    for seed in seeds:
        cfg, reqs = random_spec(seed)
        if recompute_only:
            cfg.update(mode="recompute", num_cpu_blocks=0)
        _, want = run_spec(RefScheduler, cfg, reqs)
        try:
            got_seen, got = run_spec(cls, cfg, reqs)
        except AssertionError as e:
            raise AssertionError(f"seed {seed} ({cfg}): {e}") from None
        for rid, outcome in want.items():
            assert got[rid] == outcome, (
                f"seed {seed} ({cfg}): request {rid!r} ends {got[rid]}, the reference {outcome} "
                "(status and generated tokens)"
            )
        seen |= got_seen
    return seen


# ================================================================ ch06.ex1: the chunked budget split
@pytest.mark.exercise("ch06.ex1", points=2)
@pytest.mark.parametrize("chunked", [True, False])
def test_chunk_caps_by_threshold_and_budget(impl, chunked):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_chunk")
    for threshold in (
        (0, 1, 4, 16) if chunked else (0,)
    ):  # a threshold cuts prompts: only with chunking on
        s = sched(
            cls,
            8,
            max_model_len=64,
            max_num_batched_tokens=64,
            enable_chunked_prefill=chunked,
            long_prefill_token_threshold=threshold,
        )
        for remaining in (1, 2, 5, 16, 40):
            for budget in (0, 1, 3, 8, 16, 64):
                n = min(remaining, threshold) if threshold else remaining
                want = n if n <= budget else (budget if chunked else 0)
                got = s._chunk(remaining, budget)
                assert got == want, (
                    f"{remaining} tokens left, budget {budget}, threshold {threshold}, chunked "
                    f"prefill {'on' if chunked else 'off'}: at most the threshold, never over the "
                    f"budget (cut when chunked, else wait): expected {want}"
                )


@pytest.mark.exercise("ch06.ex1", points=1)
@pytest.mark.parametrize("threshold, chunks", [(0, [16, 16, 8]), (6, [6, 6, 6, 6, 6, 6, 4])])
def test_a_long_prompt_runs_in_chunks(impl, threshold, chunks):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_chunk"),
        16,
        max_model_len=64,
        max_num_batched_tokens=16,
        long_prefill_token_threshold=threshold,
    )
    g = make("long", 40, 2)
    s.add_request(g)
    engine = CheckedEngine(s)
    engine.run()
    got = [x.num_tokens for out in engine.log for x in prefills(out)]
    assert got == chunks, (
        f"a 40-token prompt, budget 16, threshold {threshold}: chunks {got}, expected {chunks}"
    )
    assert g.seqs[0].status is S.FINISHED_LENGTH and len(g.seqs[0].output_token_ids) == 2, (
        f"threshold {threshold}: the chunked 40-token prompt still finishes with its 2 tokens"
    )


@pytest.mark.exercise("ch06.ex1", points=2)
def test_threshold_leaves_budget_to_decodes_and_other_prompts(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_chunk"),
        32,
        max_model_len=64,
        max_num_batched_tokens=16,
        long_prefill_token_threshold=8,
    )
    for g in (make("A", 2, 6), make("long", 40, 1), make("B", 3, 4)):
        s.add_request(g)
    engine = CheckedEngine(s)
    first, second = engine.step(), engine.step()
    assert plan(first) == [("A", 0, 2), ("long", 0, 8), ("B", 0, 3)], (
        "the threshold caps the long prompt's chunk at 8, so B still fits the 16-token budget"
    )
    assert plan(second) == [("A", 2, 1), ("long", 8, 8), ("B", 3, 1)], (
        "step 2: A and B decode one token each, the long prompt takes its next chunk of 8 (threshold)"
    )
    seen = set(assert_invariants(mix(ex, "_chunk"), range(12)))
    assert seen >= {"chunked"}, f"the random runs must chunk a prompt: {seen}"


@pytest.mark.exercise("ch06.ex1", points=2)
def test_chunk_without_chunked_prefill_waits_for_the_whole_prompt(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_chunk"),
        64,
        max_model_len=16,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        enable_chunked_prefill=False,
    )
    for rid, p in [("A", 10), ("B", 7), ("C", 3)]:
        s.add_request(make(rid, p, 3))
    out = s.schedule()
    assert plan(out) == [("A", 0, 10)], (
        "B's 7 tokens do not fit the 6 left and are not cut; C may not overtake"
    )


# ================================================================ ch06.ex2: running sequences first, preempt the newest
@pytest.mark.exercise("ch06.ex2", points=3)
def test_the_victim_is_the_most_recently_admitted(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_running"), 3)  # 3 blocks of 4
    groups = [
        make(r, 4, 4) for r in "ABC"
    ]  # each prompt fills one block; the next token needs a second
    for g in groups:
        s.add_request(g)
    engine = CheckedEngine(s)
    engine.step()
    out = engine.step()
    preempted = ids(out.preempted)
    assert preempted == ["C", "B"], (
        f"{PINNED}requests preempted in step 2, in order: got {preempted}, expected ['C', 'B']. The victim is the "
        "most recently admitted running request: A grows into C's block (C, the newest, goes first); B then "
        "finds no block and nobody younger, so it preempts itself"
    )
    assert plan(out) == [("A", 4, 1)], (
        f"(request, first position, tokens) scheduled in step 2: got {plan(out)}, expected [('A', 4, 1)]: "
        "only A keeps running, with its one decode token"
    )
    engine.run()
    unfinished = [g.request_id for g in groups if g.seqs[0].status is not S.FINISHED_LENGTH]
    assert not unfinished, f"requests that never finished their 4 tokens: {unfinished}"
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex2", points=2)
def test_decodes_are_not_starved_by_a_long_prefill(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_running"), 32, max_model_len=64, max_num_batched_tokens=8)
    s.add_request(make("A", 1, 6))
    s.add_request(make("long", 30, 1))
    engine = CheckedEngine(s)
    first, second = plan(engine.step()), plan(engine.step())
    assert first == [("A", 0, 1), ("long", 0, 7)], (
        f"(request, first position, tokens) scheduled in step 1 with a budget of 8 tokens: got {first}, "
        "expected [('A', 0, 1), ('long', 0, 7)]: A's 1-token prompt first, the long prompt's chunk takes the 7 left"
    )
    assert second == [("A", 1, 1), ("long", 7, 7)], (
        f"(request, first position, tokens) scheduled in step 2: got {second}, expected [('A', 1, 1), "
        "('long', 7, 7)]: running sequences in admission order, A's decode first, the long prompt's next chunk "
        "takes what is left of the budget"
    )
    engine.run()
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex2", points=2)
def test_alone_and_cannot_grow_ends_kv_exhausted(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_running"), 2)  # 8 slots
    g = make("X", 6, 10)
    s.add_request(g)
    engine = CheckedEngine(s)
    steps = engine.run(max_steps=10)
    assert steps == 4, (
        f"engine steps until X ends: got {steps}, expected 4. The prefill and 2 decodes fill the pool's 8 "
        "slots; in step 4 X is alone and cannot grow, so it must end kv_cache_exhausted, not preempt itself "
        "and prefill again"
    )
    seq = g.seqs[0]
    assert seq.status is S.FINISHED_KV_EXHAUSTED and len(seq.output_token_ids) == 3, (
        f"X ends {seq.status.value} with {len(seq.output_token_ids)} generated tokens, expected "
        "finished_kv_exhausted with 3: a sequence alone in the pool that cannot grow ends kv_cache_exhausted "
        "(no preempt/re-prefill loop)"
    )
    prefills = [i + 1 for i, o in enumerate(engine.log) for x in o.scheduled if x.start == 0]
    assert prefills == [1], (
        f"steps that prefill X from its first token: got {prefills}, expected [1] (it is never prefilled "
        "again: ended by _exhaust, or by recompute when it preempts itself, never waiting to run again)"
    )
    assert ids(engine.log[-1].exhausted) == ["X"], (
        f"requests listed in the last step's out.exhausted: got {ids(engine.log[-1].exhausted)}, expected ['X']"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex2", points=2)
def test_two_requests_the_later_one_is_preempted_and_both_finish(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_running"), 2)
    a, b = make("A", 3, 6), make("B", 3, 6)
    s.add_request(a)
    s.add_request(b)
    engine = CheckedEngine(s)
    engine.run(max_steps=30)
    preemptions = [ids(o.preempted) for o in engine.log if o.preempted]
    assert preemptions == [["B"]], (
        f"requests preempted, step by step: got {preemptions}, expected [['B']]: the younger request is "
        "preempted, once; the older one keeps decoding"
    )
    tokens = [len(g.seqs[0].output_token_ids) for g in (a, b)]
    assert tokens == [6, 6], f"tokens generated by A and B: got {tokens}, expected [6, 6]"
    assert engine.steps == 11, (
        f"{PINNED}engine steps to finish both: got {engine.steps}, expected 11 (A runs to its end, then B is "
        "prefilled again and decodes)"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex2", points=1)
def test_a_sequence_without_budget_keeps_running_at_every_position(impl):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_schedule_running")
    for budget in range(4):
        s = sched(cls, 16, max_num_batched_tokens=16)
        for r in "ABC":
            s.add_request(make(r, 2, 4))
        CheckedEngine(s).step()  # the three prompts are computed; each now decodes
        before = list(s.running)
        out = SchedulerOutputs()
        left = s._schedule_running(out, budget)
        want = [(r, 2, 1) for r in "ABC"[:budget]]
        assert plan(out) == want and left == 0, (
            f"three decoding sequences, a budget of {budget}: scheduled {plan(out)}, expected {want}, "
            f"budget left {left}, expected 0"
        )
        kept = [x.group.request_id for x in s.running]
        assert list(s.running) == before and all(s.block_manager.has_blocks(x) for x in before), (
            f"budget {budget}: running is {kept} after the step, expected ['A', 'B', 'C'] with their "
            "blocks: a sequence the budget does not reach computes nothing this step but keeps running"
        )
        assert not out.preempted, (
            f"budget {budget}: a sequence the budget does not reach is skipped, not preempted"
        )


@pytest.mark.exercise("ch06.ex2", points=3)
def test_running_step_holds_the_invariants_on_random_runs(impl):
    ex = impl("ex06_scheduler")
    seen = assert_invariants(mix(ex, "_schedule_running"), range(40))
    assert seen >= {"preempted", "exhausted", "blocks_to_copy", "chunked"}, (
        f"the random runs must cover every decision: {seen}"
    )


# ================================================================ ch06.ex3: preemption bookkeeping
def _preempting_run(cls, mode, num_cpu_blocks=8):
    s = sched(cls, 3, mode=mode, num_cpu_blocks=num_cpu_blocks)
    groups = [make(r, 4, 4) for r in "ABC"]
    for g in groups:
        s.add_request(g)
    engine = CheckedEngine(s)
    engine.step()
    return s, engine, groups, engine.step()


@pytest.mark.exercise("ch06.ex3", points=3)
def test_recompute_frees_resets_and_requeues_at_the_front(impl):
    ex = impl("ex06_scheduler")
    s, engine, (a, b, c), out = _preempting_run(mix(ex, "_preempt"), "recompute", 0)
    assert ids(out.preempted) == ["C", "B"], (
        "out of blocks: the newest first, C then B, are preempted"
    )
    for g in (b, c):
        seq = g.seqs[0]
        assert seq.status is S.WAITING and seq.num_computed_tokens == 0, (
            "preempted by recompute: WAITING with num_computed_tokens 0 (all its tokens are prefilled again)"
        )
        assert not s.block_manager.has_blocks(seq), "preempted by recompute: its blocks are freed"
    assert ids(s.waiting) == ["B", "C"], "victims go back to the front of waiting, oldest first"
    assert (s.num_preemptions, s.num_recomputes, s.num_swap_outs) == (2, 2, 0), (
        "(preemptions, recomputes, swap-outs): 2 victims, both recomputed, none swapped"
    )
    assert out.blocks_to_swap_out == [] and s.block_manager.get_num_free_gpu_blocks() == 1, (
        "recompute copies no block to the CPU, and the victims' blocks are back in the pool: 1 free"
    )
    engine.run()
    assert all(g.seqs[0].status is S.FINISHED_LENGTH for g in (a, b, c)), (
        "after recompute, A, B and C all finish"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex3", points=3)
def test_swap_moves_the_blocks_and_queues_by_arrival(impl):
    ex = impl("ex06_scheduler")
    s, engine, (a, b, c), out = _preempting_run(mix(ex, "_preempt"), "swap")
    assert ids(out.preempted) == ["C", "B"], (
        "out of blocks: the newest first, C then B, are preempted"
    )
    for g in (b, c):
        seq = g.seqs[0]
        assert seq.status is S.SWAPPED and seq.num_computed_tokens == 4, (
            "preempted by swap: SWAPPED, K/V kept on CPU"
        )
    assert ids(s.swapped) == ["B", "C"], (
        "swapped is kept in arrival order (oldest first), whatever the eviction order"
    )
    assert len(out.blocks_to_swap_out) == 2 and s.block_manager.get_num_free_cpu_blocks() == 6, (
        "the victims' blocks go to the CPU pool: one (gpu, cpu) pair per block in blocks_to_swap_out"
    )
    assert (s.num_preemptions, s.num_recomputes, s.num_swap_outs) == (2, 0, 2), (
        "(preemptions, recomputes, swap-outs): 2 victims, both swapped out"
    )
    engine.run()  # the checked engine proves the swapped K/V come back intact
    assert all(g.seqs[0].status is S.FINISHED_LENGTH for g in (a, b, c)), (
        "after the swap, A, B and C all finish"
    )
    assert s.num_swap_ins == 2, "both swapped victims come back by swap-in (2 swap-ins)"
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex3", points=2)
def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_preempt"), 4, mode="swap", num_cpu_blocks=1
    )  # B's 2 blocks do not fit 1 CPU block
    a, b = make("A", 7, 6), make("B", 7, 6)
    s.add_request(a)
    s.add_request(b)
    CheckedEngine(s).run(max_steps=30)
    assert s.num_swap_outs == 0 and s.num_recomputes == 1, "no room on the CPU: recompute instead"
    assert all(len(g.seqs[0].output_token_ids) == 6 for g in (a, b)), (
        "A and B each still generate their 6 tokens"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex3", points=3)
def test_preemption_holds_the_invariants_on_random_runs(impl):
    ex = impl("ex06_scheduler")
    seen = assert_invariants(mix(ex, "_preempt"), range(40))
    assert seen >= {"preempted", "swapped_in"}, f"the random runs must recompute and swap: {seen}"


# ================================================================ ch06.ex4: swapped sequences come back
@pytest.mark.exercise("ch06.ex4", points=3)
def test_a_swapped_out_request_comes_back_after_the_other_finishes(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_swapped"), 4, mode="swap", num_cpu_blocks=4)
    a, b = make("A", 7, 6), make("B", 7, 6)
    s.add_request(a)
    s.add_request(b)
    engine = CheckedEngine(s)
    engine.run(max_steps=30)
    in_steps = [i for i, o in enumerate(engine.log) if o.swapped_in]
    assert (
        in_steps == [6]
        and ids(engine.log[6].swapped_in) == ["B"]
        and len(engine.log[6].blocks_to_swap_in) == 2
    ), "B comes back (its 2 blocks copied in) as soon as A is done and the pool has room"
    assert plan(engine.log[6]) == [("B", 8, 1)], "swapped back in: it continues where it stopped"
    assert s.num_swap_ins == 1 and a.seqs[0].output_token_ids == b.seqs[0].output_token_ids, (
        "one swap-in (B), and B's tokens equal A's (same prompt): its K/V came back intact"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex4", points=2)
def test_swapped_come_back_oldest_first(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_swapped"), 4, mode="swap", num_cpu_blocks=12)
    groups = [make(r, 4, 8) for r in "ABCD"]
    for g in groups:
        s.add_request(g)
    engine = CheckedEngine(s)
    engine.step()
    assert ids(engine.step().preempted) == ["D", "C"], "set-up: D then C (newest first) swap out"
    engine.run(max_steps=80)
    back = [r for o in engine.log for r in ids(o.swapped_in) if r in "CD"]
    assert back[:2] == ["C", "D"], (
        "swapped sequences return oldest first (C before D, though D left first)"
    )
    assert all(g.seqs[0].status is S.FINISHED_LENGTH for g in groups), (
        "A, B, C and D all finish after their swaps"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex4", points=2)
def test_a_swapped_sequence_that_cannot_return_alone_is_recomputed(impl):
    ex = impl("ex06_scheduler")
    # 4 blocks of 4, admission keeps 1 free, budget 4. B (prompt 12) is admitted chunk by chunk beside A
    # (prompt 1) and fills 3 blocks; when A needs its second block, B is swapped out. After A is done
    # nothing runs, yet B's 3 blocks plus 1 to grow leave no block free: B goes back to waiting (recompute),
    # where it can never fit beside the watermark, and ends kv_cache_exhausted instead of waiting forever.
    s = sched(
        mix(ex, "_schedule_swapped"),
        4,
        mode="swap",
        num_cpu_blocks=8,
        watermark=0.25,
        max_num_batched_tokens=4,
        max_num_seqs=2,
    )
    a, b = make("A", 1, 8), make("B", 12, 6)
    s.add_request(a)
    s.add_request(b)
    engine = CheckedEngine(s)
    engine.run(max_steps=40)
    assert [i for i, o in enumerate(engine.log) if o.preempted] == [4] and s.num_swap_outs == 1, (
        "set-up: B is swapped out once, at step 4, when A needs its second block"
    )
    assert [i for i, o in enumerate(engine.log) if o.exhausted] == [8] and s.num_swap_ins == 0, (
        "while A runs, B waits in swapped; once nothing runs and B still does not fit, it is recomputed"
    )
    assert a.seqs[0].status is S.FINISHED_LENGTH and b.seqs[0].status is S.FINISHED_KV_EXHAUSTED, (
        f"A finishes; B, which can never fit beside the watermark, ends "
        f"{S.FINISHED_KV_EXHAUSTED.value}: got {a.seqs[0].status.value}, {b.seqs[0].status.value}"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex4", points=1)
def test_a_swapped_sequence_comes_back_only_to_a_free_seat(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_swapped"), 8, mode="swap", num_cpu_blocks=8, max_num_seqs=2)
    a, b = make("A", 4, 8), make("B", 4, 8)
    s.add_request(a)
    s.add_request(b)
    CheckedEngine(s).step()
    victim = b.seqs[0]
    s.running.remove(victim)
    s._preempt(victim, SchedulerOutputs())  # the reference's: B waits in swapped, A runs (1 seat)
    s.config.max_num_seqs = 1  # every seat taken
    out = SchedulerOutputs()
    s._schedule_swapped(out, 16)
    assert not out.swapped_in and list(s.swapped) == [victim], (
        "max_num_seqs 1 and A running: no seat is free, so B stays swapped"
    )
    s.config.max_num_seqs = 2
    s._schedule_swapped(out, 16)
    assert ids(out.swapped_in) == ["B"], "a seat is free again: B comes back"


@pytest.mark.exercise("ch06.ex4", points=1)
def test_a_younger_swapped_sequence_never_overtakes_one_that_does_not_fit(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_schedule_swapped"),
        6,
        mode="swap",
        num_cpu_blocks=8,
        max_model_len=32,
        max_num_batched_tokens=32,
    )
    a, c, d = make("A", 4, 8), make("C", 8, 8), make("D", 2, 8)  # 1 + 2 + 1 blocks
    for g in (a, c, d):
        s.add_request(g)
    CheckedEngine(s).step()
    for g in (d, c):  # the newest first, as a running step would
        s.running.remove(g.seqs[0])
        s._preempt(g.seqs[0], SchedulerOutputs())
    bm = s.block_manager
    filler = Sequence(10_000, [1] * 12, 4)
    # 3 of the 5 free blocks: C (3 to come back) no longer fits
    assert bm.allocate_slots(filler) is not None, "set-up: a 12-token filler takes 3 free blocks"
    out = SchedulerOutputs()
    s._schedule_swapped(out, 16)
    assert not out.swapped_in and ids(s.swapped) == ["C", "D"], (
        f"swapped in {ids(out.swapped_in)}: C, the oldest swapped sequence, does not fit while A runs, "
        "so it waits, and D (which would fit) may not overtake it"
    )


@pytest.mark.exercise("ch06.ex4", points=3)
def test_swap_in_holds_the_invariants_on_random_runs(impl):
    ex = impl("ex06_scheduler")
    seen = assert_invariants(mix(ex, "_schedule_swapped"), range(40))
    assert "swapped_in" in seen, f"the random runs must swap a sequence in: {seen}"


# ================================================================ ch06.ex5: admission, first come first served
@pytest.mark.exercise("ch06.ex5", points=2)
def test_admission_is_fcfs_within_seats_and_budget(impl):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_schedule_waiting")
    s = sched(
        cls,
        64,
        max_model_len=16,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        enable_chunked_prefill=False,
    )
    for rid, p in [("A", 10), ("B", 7), ("C", 3), ("D", 2)]:
        s.add_request(make(rid, p, 3))
    assert plan(s.schedule()) == [("A", 0, 10)], (
        "B (7 tokens) does not fit the 6 left; C and D may not overtake it"
    )
    s = sched(cls, 64, max_model_len=32, max_num_batched_tokens=16, max_num_seqs=3)
    for g in (make("A", 3, 2, n=2), make("B", 3, 2, n=2)):
        s.add_request(g)
    assert plan(s.schedule()) == [("A", 0, 3)], (
        "a request with n = 2 takes two seats: B's two do not fit 3 seats"
    )
    s = sched(cls, 64, max_model_len=64, max_num_batched_tokens=16)
    for g in (make("A", 5, 2), make("B", 40, 2)):
        s.add_request(g)
    assert plan(s.schedule()) == [("A", 0, 5), ("B", 0, 11)], (
        "a prompt longer than the budget left is cut into it"
    )


@pytest.mark.exercise("ch06.ex5", points=3)
def test_the_watermark_keeps_blocks_free_at_admission(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_schedule_waiting"),
        100,
        bs=1,
        max_model_len=200,
        watermark=0.1,
        max_num_batched_tokens=256,
    )
    big, fits = make("big", 91, 1, bs=1), make("fits", 90, 5, bs=1)
    s.add_request(big)
    s.add_request(fits)
    engine = CheckedEngine(s)
    out = engine.step()
    assert ids(out.ignored) == ["big"] and "keeps 10" in big.seqs[0].finish_message, (
        "a prompt that never fits beside the watermark is ignored with its reason, and does not block the queue"
    )
    assert plan(out) == [("fits", 0, 90)], (
        "'fits' (90 tokens) is admitted whole past the ignored one"
    )
    s.add_request(make("more", 1, 1, bs=1))
    assert [r for r, _, _ in plan(engine.step())] == ["fits"], (
        "watermark: admitting 'more' would leave fewer than 10 of 100 blocks free, so it waits"
    )
    engine.run()
    assert s.num_preemptions == 0, "admissions that keep the watermark never force a preemption"
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex5", points=2)
def test_a_prompt_larger_than_the_cache_does_not_block_the_queue(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_schedule_waiting"), 4)  # 16 slots
    a, b = make("A", 20, 2), make("B", 3, 2)
    s.add_request(a)
    s.add_request(b)
    engine = CheckedEngine(s)
    first = engine.step()
    assert (
        ids(first.ignored) == ["A"]
        and a.seqs[0].status is S.FINISHED_IGNORED
        and a.seqs[0].finish_message
    ), "A's 20 tokens never fit 16 slots: it is ignored at once, with a finish message"
    assert plan(first) == [("B", 0, 3)], "B must not wait behind a prompt that can never run"
    engine.run()
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex5", points=2)
def test_prefix_cached_tokens_cost_no_budget(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_schedule_waiting"), 64, max_model_len=16, max_num_batched_tokens=16, prefix=True
    )
    s.add_request(make("X", range(100, 116), 1))
    CheckedEngine(s).run()
    s.add_request(make("Y", range(100, 116), 1))  # 12 tokens cached (the last block is recomputed)
    s.add_request(make("Z", range(200, 212), 1))
    assert plan(s.schedule()) == [("Y", 12, 4), ("Z", 0, 12)], (
        "cached tokens are computed already: Y costs 4 tokens of the budget, so Z's 12 fit too"
    )


@pytest.mark.exercise("ch06.ex5", points=1)
def test_one_prefix_lookup_per_admission(impl):
    ex = impl("ex06_scheduler")
    s = sched(
        mix(ex, "_schedule_waiting"), 8, max_model_len=16, max_num_batched_tokens=16, prefix=True
    )
    lookups = []
    lookup = s.block_manager.prefix_cache.lookup
    s.block_manager.prefix_cache.lookup = lambda *a: lookups.append(a[0].seq_id) or lookup(*a)
    x, y = make("X", range(100, 116), 1), make("Y", range(100, 112), 1)
    s.add_request(x)
    s.add_request(y)
    assert plan(s.schedule()) == [("X", 0, 16)] and lookups == [
        x.seqs[0].seq_id,
        y.seqs[0].seq_id,
    ], (
        "one get_computed_blocks per admission attempt (X admitted, Y tried and stopped by the "
        f"budget), its blocks passed on to allocate_slots: got lookups by sequence {lookups}"
    )


@pytest.mark.exercise("ch06.ex5", points=3)
def test_admission_holds_the_invariants_on_random_runs(impl):
    ex = impl("ex06_scheduler")
    seen = assert_invariants(mix(ex, "_schedule_waiting"), range(40))
    assert seen >= {"preempted", "ignored"}, f"the random runs must preempt and ignore: {seen}"


# ---------------------------------------------------------------- ch06.ex8: a request that can never run


def _reason(cls, seq_group, **cfg):
    """The learner's verdict on a fresh request, and the scheduler it was asked on."""
    s = sched(cls, **cfg)
    return s._never_reason(seq_group.seqs[0]), s


@pytest.mark.exercise("ch06.ex8", points=2)
@pytest.mark.parametrize(
    "rule, runs, never, cfg",
    [
        pytest.param(
            "length", make("ok", 32, 1), make("long", 33, 1), dict(num_gpu_blocks=64), id="length"
        ),
        pytest.param(
            "seats",
            make("ok", 4, 1, n=4),
            make("wide", 4, 1, n=5),
            dict(num_gpu_blocks=64),
            id="seats",
        ),
        pytest.param(
            "pool",
            make("ok", 24, 1),
            make("big", 25, 1),
            dict(num_gpu_blocks=8, watermark=0.25),
            id="pool",
        ),
    ],
)
def test_each_limit_at_its_edge(impl, rule, runs, never, cfg):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_never_reason")
    # max_model_len 32, max_num_seqs 4, blocks of 4 tokens; the pool: 8 blocks, 2 kept free (watermark 0.25)
    ok, _ = _reason(cls, runs, **cfg)
    assert ok is None, (
        f"{rule}: a request exactly at the limit can run ({len(runs.seqs[0])} prompt tokens, "
        f"n={runs.sampling_params.n}, {cfg}); got the reason {ok!r}"
    )
    reason, _ = _reason(cls, never, **cfg)
    want = {
        "length": {
            "33": "the prompt's tokens",
            "32": "max_model_len",
            "max_model_len": "the limit's name",
        },
        "seats": {"5": "the seats (n)", "4": "max_num_seqs", "max_num_seqs": "the limit's name"},
        "pool": {
            "7": "blocks needed",
            "8": "blocks in the pool",
            "2": "blocks the watermark keeps",
        },
    }[rule]
    missing = [
        f"{w} ({what})"
        for w, what in want.items()
        if not isinstance(reason, str) or w not in reason
    ]
    assert not missing, (
        f"{rule}: one step past the limit can never run; the reason must name "
        f"{', '.join(f'{w} ({what})' for w, what in want.items())}; missing {', '.join(missing)}, "
        f"got {reason!r}"
    )


@pytest.mark.exercise("ch06.ex8", points=2)
def test_the_first_rule_that_applies_gives_the_reason(impl):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_never_reason")
    reason, _ = _reason(cls, make("X", 40, 1, n=5), num_gpu_blocks=4, max_model_len=32)
    assert reason and "max_model_len" in reason and "max_num_seqs" not in reason, (
        f"a prompt over max_model_len, with too many samples, larger than the pool: the length comes first, "
        f"got {reason!r}"
    )
    reason, _ = _reason(cls, make("Y", 40, 1, n=5), num_gpu_blocks=4, max_model_len=64)
    assert reason and "max_num_seqs" in reason and "10" not in reason, (
        f"too many samples and larger than the pool: the seats come before the pool, got {reason!r}"
    )


@pytest.mark.exercise("ch06.ex8", points=3)
def test_a_busy_pool_is_later_not_never(impl):
    # A's 28 tokens hold 7 of the 8 blocks; B (12 tokens, 3 blocks) does not fit now but fits an empty pool.
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_never_reason"), 8)
    a, b = make("A", 28, 3), make("B", 12, 2)
    s.add_request(a)
    engine = CheckedEngine(s)
    engine.step()
    free_before = s.block_manager.get_num_free_gpu_blocks()
    s.add_request(b)
    got = (b.seqs[0].status.value, ids(s.waiting))
    assert got == ("waiting", ["B"]) and s.waiting[0] is b.seqs[0], (
        f"B needs 3 blocks, {free_before} of the pool's 8 {'is' if free_before == 1 else 'are'} free now: "
        f"it must wait (later), not be ignored (never); got status {got[0]}, waiting {got[1]}"
    )
    assert s.block_manager.get_num_free_gpu_blocks() == free_before, (
        "asking whether a request can ever run must not allocate anything"
    )
    engine.run(max_steps=60)
    assert [len(g.seqs[0].output_token_ids) for g in (a, b)] == [3, 2] and not any(
        o.ignored for o in engine.log
    ), "both requests run to their max_tokens; nobody is ignored"
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex8", points=2)
def test_the_whole_prompt_counts_not_its_first_chunk(impl):
    # 8 blocks of 4 tokens; chunks of at most 8 tokens. 32 tokens fill the pool exactly; 33 never fit.
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_never_reason")
    for length, ignored in ((32, False), (33, True)):
        s = sched(cls, 8, max_model_len=64, max_num_batched_tokens=8)
        g = make("P", length, 1)
        s.add_request(g)
        engine = CheckedEngine(s)
        engine.run(max_steps=30)
        got = g.seqs[0].status is S.FINISHED_IGNORED
        assert got == ignored, (
            f"a {length}-token prompt in a pool of 32 slots, computed in chunks of 8: "
            f"{'it can never hold all its tokens' if ignored else 'it fits the pool exactly'}, expected "
            f"{'ignored' if ignored else 'to run'}, got {g.seqs[0].status.value}"
        )
        assert_all_free(s)


@pytest.mark.exercise("ch06.ex8", points=2)
@pytest.mark.parametrize("position", range(4), ids=lambda p: f"at position {p}")
def test_an_ignored_request_at_every_position_blocks_nobody(impl, position):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_never_reason"), 16, max_num_seqs=8)
    groups = [make(f"R{i}", 3 + i, 2) for i in range(3)]
    never = make("NEVER", 40, 2)  # over max_model_len=32
    groups.insert(position, never)
    for g in groups:
        s.add_request(g)
    engine = CheckedEngine(s)
    engine.run(max_steps=40)
    ignored = [ids(o.ignored) for o in engine.log if o.ignored]
    assert ignored == [["NEVER"]] and never.seqs[0].finish_message.startswith("ignored: "), (
        f"the request over max_model_len at position {position} is listed once in out.ignored, with its "
        f"reason; got {ignored}"
    )
    done = [len(g.seqs[0].output_token_ids) for g in groups if g is not never]
    assert done == [2, 2, 2], f"the other three requests each generate 2 tokens, got {done}"
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex8", points=1)
def test_asking_changes_nothing(impl):
    ex = impl("ex06_scheduler")
    s = sched(mix(ex, "_never_reason"), 8, watermark=0.25)
    s.add_request(make("A", 10, 4))
    CheckedEngine(s).step()
    state = (
        s.block_manager.get_num_free_gpu_blocks(),
        [x.seq_id for x in s.running],
        list(s.waiting),
    )
    for g in (make("B", 5, 1), make("C", 40, 1), make("D", 30, 1), make("E", 3, 1, n=6)):
        seq = g.seqs[0]
        before = (list(seq.token_ids), seq.num_computed_tokens, seq.status)
        first, second = s._never_reason(seq), s._never_reason(seq)
        assert first == second, f"asked twice about {g.request_id}: {first!r}, then {second!r}"
        assert (list(seq.token_ids), seq.num_computed_tokens, seq.status) == before, (
            f"_never_reason changed sequence {g.request_id}"
        )
    after = (
        s.block_manager.get_num_free_gpu_blocks(),
        [x.seq_id for x in s.running],
        list(s.waiting),
    )
    assert after == state, (
        "_never_reason must change no queue and allocate nothing (free blocks, running, waiting)"
    )


# ---------------------------------------------------------------- ch06.ex9: preemption by recompute


def _running_and_waiting(cls, num_running=3, num_waiting=2, **cfg):
    """A scheduler with ``num_running`` admitted sequences (3 tokens each, decoding) and ``num_waiting``
    prompts that never got in (the seats are full)."""
    s = sched(cls, 16, max_num_seqs=num_running, **cfg)
    groups = [make(f"R{i}", 3, 6) for i in range(num_running)]
    groups += [make(f"W{i}", 5, 2) for i in range(num_waiting)]
    for g in groups:
        s.add_request(g)
    CheckedEngine(s).step()
    return s, groups


@pytest.mark.exercise("ch06.ex9", points=3)
@pytest.mark.parametrize("position", range(3), ids=lambda p: f"victim at position {p}")
def test_a_recomputed_victim_waits_at_the_front_with_nothing_computed(impl, position):
    ex = impl("ex06_scheduler")
    s, groups = _running_and_waiting(mix(ex, "_recompute"))
    victim = list(s.running)[position]
    tokens, waiting = list(victim.token_ids), list(s.waiting)
    free = s.block_manager.get_num_free_gpu_blocks()
    held = len(s.block_manager.get_block_table(victim))
    s.running.remove(victim)
    out = SchedulerOutputs()
    s._recompute(victim, out)
    assert ids(s.waiting) == ids([victim, *waiting]) and s.waiting[0] is victim, (
        f"the victim (admitted before every waiting prompt) must wait at the front of waiting: got "
        f"{ids(s.waiting)}, expected {ids([victim, *waiting])}"
    )
    got = (victim.status.value, victim.num_computed_tokens)
    assert got == ("waiting", 0), (
        f"a recomputed sequence waits with nothing computed (seq.reset_for_recompute()): expected "
        f"status waiting and 0 computed tokens, got status {got[0]} and {got[1]} computed tokens"
    )
    assert list(victim.token_ids) == tokens, (
        f"its tokens (prompt and output so far) are all kept: {len(tokens)} expected, got "
        f"{len(victim.token_ids)}"
    )
    still = (
        len(s.block_manager.get_block_table(victim)) if s.block_manager.has_blocks(victim) else 0
    )
    assert still == 0, (
        f"its blocks go back to the pool (block_manager.free): it held {held}, still holds {still}"
    )
    free_now = s.block_manager.get_num_free_gpu_blocks()
    assert free_now == free + held, (
        f"{held} blocks freed: {free} + {held} = {free + held} free expected, got {free_now}"
    )
    assert not out.exhausted and not out.preempted, (
        "a victim that can come back is not exhausted (and counting preemptions is _preempt's job)"
    )


@pytest.mark.exercise("ch06.ex9", points=2)
def test_victims_newest_first_keep_waiting_in_arrival_order(impl):
    ex = impl("ex06_scheduler")
    s, groups = _running_and_waiting(mix(ex, "_recompute"))
    waiting = list(s.waiting)
    out = SchedulerOutputs()
    victims = [
        s.running.pop(),
        s.running.pop(),
    ]  # the newest first, as _schedule_running takes them
    for seq in victims:
        s._recompute(seq, out)
    want = [victims[1], victims[0], *waiting]
    assert ids(s.waiting) == ids(want) and all(a is b for a, b in zip(s.waiting, want)), (
        f"two victims, the newest first: waiting must be {ids(want)} (arrival order), got {ids(s.waiting)}"
    )


def _grown(cls, prompt, max_tokens, steps):
    """A pool of 4 blocks of 4 tokens, one kept free at admission (watermark 0.25): admissions get at most
    3 blocks (12 tokens), a running sequence may grow into the fourth."""
    s = sched(cls, 4, watermark=0.25, max_model_len=32)
    g = make("G", prompt, max_tokens)
    s.add_request(g)
    engine = CheckedEngine(s)
    for _ in range(steps):
        engine.step()
    return s, g.seqs[0]


@pytest.mark.exercise("ch06.ex9", points=3)
def test_a_victim_grown_past_an_empty_pool_ends_exhausted(impl):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_recompute")
    s, seq = _grown(cls, 11, 8, 3)  # 11 prompt tokens + 3 sampled = 14 tokens, 4 blocks held
    assert len(seq) == 14 and len(s.block_manager.get_block_table(seq)) == 4, "set-up: 14 tokens"
    s.running.remove(seq)
    out = SchedulerOutputs()
    s._recompute(seq, out)
    got = (seq.status.value, ids(out.exhausted))
    assert got == (S.FINISHED_KV_EXHAUSTED.value, ["G"]), (
        f"14 tokens need 4 blocks; an admission may take 3 of the 4 (watermark): it can never come back "
        f"and must end {S.FINISHED_KV_EXHAUSTED.value} in out.exhausted, got status {got[0]}, "
        f"exhausted {got[1]}"
    )
    message = seq.finish_message or ""
    assert message.startswith("KV cache exhausted: ") and "14" in message, (
        f"its finish message is 'KV cache exhausted: ' + self._no_room_reason(seq, 'sequence') (which "
        f"names its 14 tokens), got {message!r}"
    )
    waiting, unfinished = ids(s.waiting), s.has_unfinished_requests()
    assert not waiting and not unfinished, (
        f"it never waits; its request is over: got waiting {waiting}, unfinished requests: {unfinished}"
    )
    free_now = s.block_manager.get_num_free_gpu_blocks()
    assert free_now == 4, (
        f"its 4 blocks go back to the pool (block_manager.free): 4 free expected, got {free_now} "
        f"({4 - free_now} still held)"
    )


@pytest.mark.exercise("ch06.ex9", points=2)
def test_a_victim_that_fits_an_empty_pool_exactly_waits(impl):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_recompute")
    s, seq = _grown(cls, 9, 8, 3)  # 9 + 3 = 12 tokens: 3 blocks, exactly what an admission may take
    assert len(seq) == 12, "set-up: 12 tokens"
    s.running.remove(seq)
    out = SchedulerOutputs()
    s._recompute(seq, out)
    got = (ids(s.waiting), seq.status.value, ids(out.exhausted))
    assert got == (["G"], "waiting", []) and s.waiting[0] is seq, (
        f"12 tokens fit the 3 blocks an admission may take: it must wait, got waiting {got[0]}, status "
        f"{got[1]}, exhausted {got[2]}"
    )
    engine = CheckedEngine(s)
    engine.run(max_steps=30)
    got = (seq.status.value, len(seq.output_token_ids))
    assert got == (S.FINISHED_LENGTH.value, 8), (
        f"readmitted, it is prefilled again and generates its 8 tokens: got status {got[0]}, "
        f"{got[1]} tokens"
    )
    assert_all_free(s)


@pytest.mark.exercise("ch06.ex9", points=2)
def test_runs_with_recompute_preemption_end_as_with_the_reference(impl):
    ex = impl("ex06_scheduler")
    cls = mix(ex, "_recompute")
    for num_blocks in (2, 3, 5):
        results = []
        for scheduler_cls in (cls, RefScheduler):
            s = sched(scheduler_cls, num_blocks, max_num_seqs=4)
            groups = [make(r, 3 + i, 5) for i, r in enumerate("ABC")]
            for g in groups:
                s.add_request(g)
            engine = CheckedEngine(s)
            engine.run(max_steps=80)
            assert_all_free(s)
            results.append(
                (
                    [(g.seqs[0].status.value, list(g.seqs[0].output_token_ids)) for g in groups],
                    s.num_preemptions,
                )
            )
        assert results[0] == results[1], (
            f"{num_blocks} blocks of 4: statuses, tokens and preemptions must equal the reference's: "
            f"got {results[0]}, the reference {results[1]}"
        )
