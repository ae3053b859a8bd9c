"""Graded: chapter 06, one scheduling step (exercises/ex06_scheduler.py).

Hand-made cases (among them the only running request that cannot grow) and the chapter's, then seeded
random queues under tight memory (ragged token counts, running requests sitting exactly at a block
boundary, several block sizes), compared with a plain reference written here.
"""

from __future__ import annotations

import random

import pytest


def _ref(running, waiting, free, bs, max_num_seqs, watermark):
    """Reference policy: grow oldest first, evict from the newest end, then FCFS admission."""
    kept, preempted, exhausted, admitted = [], [], [], []
    lo, hi = 0, len(running)  # running[lo:hi] still undecided
    while lo < hi:
        r = running[lo]
        lo += 1
        need = (r.num_tokens + bs - 1) // bs - r.num_blocks
        while need > free and lo < hi:
            hi -= 1
            free += running[hi].num_blocks
            preempted.append(running[hi].request_id)
        if need <= free:
            free -= need
            kept.append(r.request_id)
        else:
            free += r.num_blocks
            (preempted if kept else exhausted).append(r.request_id)
    if not preempted:
        for w in waiting:
            need = (w.num_tokens + bs - 1) // bs
            if len(kept) + len(admitted) >= max_num_seqs or free - need < watermark:
                break
            free -= need
            admitted.append(w.request_id)
    return {"running": kept + admitted, "preempted": preempted, "exhausted": exhausted, "admitted": admitted,
            "free_blocks": free}


def _plan(p):
    return {"running": list(p.running), "preempted": list(p.preempted), "exhausted": list(p.exhausted),
            "admitted": list(p.admitted), "free_blocks": p.free_blocks}


def _random_case(ex, seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    running = []
    for i in range(rng.randint(0, 7)):
        held = rng.randint(1, 5)
        # the new token lands in a fresh block (at a boundary) about half the time
        tokens = held * bs + 1 if rng.random() < 0.5 else held * bs - rng.randrange(bs)
        running.append(ex.Req(f"r{i}", tokens, held))
    waiting = [ex.Req(f"w{i}", rng.randint(1, 6 * bs)) for i in range(rng.randint(0, 6))]
    return running, waiting, rng.randint(0, 6), bs, rng.randint(1, 8), rng.choice([0, 0, 1, 2])


@pytest.mark.exercise("ch06.ex1", points=2)
def test_grow_running_preempts_the_most_recent(impl):
    ex = impl("ex06_scheduler")
    # bs 4, no free block. A needs a third block: C (the newest) is evicted and returns its 2 blocks;
    # A takes one, B (crossing into its second block) the other.
    running = [ex.Req("A", 9, 2), ex.Req("B", 5, 1), ex.Req("C", 8, 2)]
    plan = ex.StepPlan()
    free = ex.grow_running(running, 0, 4, plan)
    assert plan.preempted == ["C"], "the victim is the most recently admitted request"
    assert plan.running == ["A", "B"] and plan.exhausted == [] and free == 0


@pytest.mark.exercise("ch06.ex1", points=2)
def test_grow_running_case8_self_preemption_and_exhaustion(impl):
    ex = impl("ex06_scheduler")
    # bs 4, 2 blocks: two requests of 5 tokens that each need a second block (the younger one is preempted),
    # then a request alone that can never grow.
    plan = ex.StepPlan()
    free = ex.grow_running([ex.Req("A", 5, 1), ex.Req("B", 5, 1)], 0, 4, plan)
    assert (plan.running, plan.preempted, free) == (["A"], ["B"], 0), "the older request keeps running"
    # alone, holding both blocks, 9 tokens: it can never grow -> exhausted, not preempted forever
    plan = ex.StepPlan()
    free = ex.grow_running([ex.Req("X", 9, 2)], 0, 4, plan)
    assert (plan.running, plan.preempted, plan.exhausted, free) == ([], [], ["X"], 2)
    # an older request kept running: the newest one preempts itself instead
    plan = ex.StepPlan()
    free = ex.grow_running([ex.Req("A", 4, 1), ex.Req("B", 9, 2)], 0, 4, plan)
    assert (plan.running, plan.preempted, plan.exhausted, free) == (["A"], ["B"], [], 2)


@pytest.mark.exercise("ch06.ex2", points=2)
def test_admission_is_fcfs_with_seats_and_watermark(impl):
    ex = impl("ex06_scheduler")
    waiting = [ex.Req("w0", 8), ex.Req("w1", 13), ex.Req("w2", 1)]
    plan = ex.StepPlan(running=["r0"])
    free = ex.admit_waiting(waiting, 6, 4, max_num_seqs=8, watermark_blocks=1, plan=plan)
    # w0 needs 2 (6 - 2 = 4 >= 1); w1 needs 4 (4 - 4 = 0 < 1): stop, and w2 may not overtake
    assert plan.admitted == ["w0"] and plan.running == ["r0", "w0"] and free == 4
    plan = ex.StepPlan(running=["r0"])
    free = ex.admit_waiting(waiting, 100, 4, max_num_seqs=3, watermark_blocks=0, plan=plan)
    assert plan.admitted == ["w0", "w1"] and free == 94, "max_num_seqs counts the running requests too"


@pytest.mark.exercise("ch06.ex2", points=1)
def test_no_admission_in_a_step_that_preempted(impl):
    ex = impl("ex06_scheduler")
    plan = ex.schedule_step([ex.Req("A", 5, 1), ex.Req("B", 5, 1)], [ex.Req("w", 1)], 0, 4)
    assert plan.preempted == ["B"] and plan.admitted == [] and plan.running == ["A"]
    plan = ex.schedule_step([ex.Req("A", 5, 2)], [ex.Req("w", 3)], 1, 4)
    assert plan.admitted == ["w"] and plan.running == ["A", "w"] and plan.free_blocks == 0


@pytest.mark.exercise("ch06.ex1", points=3)
def test_random_steps_match_the_reference(impl):
    ex = impl("ex06_scheduler")
    kinds = set()
    for seed in range(300):
        running, waiting, free, bs, seats, wm = _random_case(ex, seed)
        got = _plan(ex.schedule_step(running, waiting, free, bs, seats, wm))
        want = _ref(running, waiting, free, bs, seats, wm)
        assert got == want, f"seed {seed}: block size {bs}, free {free}, seats {seats}, watermark {wm}"
        kinds |= {k for k in ("preempted", "exhausted", "admitted") if want[k]}
    assert kinds == {"preempted", "exhausted", "admitted"}, "the random cases cover every decision"
