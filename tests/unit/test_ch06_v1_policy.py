"""Chapter 06's graded tests check what any correct policy holds, not the reference's exact steps: a
policy in vLLM v1's shape passes them.

``V1Scheduler`` is written here, apart from ``solutions/``, after vLLM v1's ``Scheduler.schedule``
(``vllm/v1/core/sched/scheduler.py``, release 0.10.0): the running list is walked in place by index while
budget is left, and when ``allocate_slots`` returns ``None`` the tail of ``self.running`` is popped and
preempted by recompute, the request itself when it is the tail (``preempted_req = self.running.pop()``;
``if preempted_req == request: can_schedule = False``). v1 has no swap and no "alone and cannot grow" rule
(it checks at start-up that one ``max_model_len`` request fits the cache): here a request that preempts
itself while alone is recomputed, and the reference plumbing (``_recompute``) ends it kv_cache_exhausted
because it can never be admitted again. It lists a preemption where the reference does not, which
step-by-step grading against the reference would reject.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from paged.core.scheduler import Scheduler as RefScheduler
from paged.core.scheduler_outputs import SchedulerOutputs
from paged.core.sequence import Sequence
from tests.exercises import test_ex06_scheduler as graded


class V1Scheduler(RefScheduler):
    """Running first, preempt the tail of running by recompute (vLLM v1 0.10.0's shape)."""

    def _schedule_running(self, out: SchedulerOutputs, budget: int) -> int:
        self.running = list(self.running)
        bm, index = self.block_manager, 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            n = self._chunk(len(request) - request.num_computed_tokens, budget)
            if n == 0:
                index += 1
                continue
            while True:
                new_blocks = bm.allocate_slots(request, n)
                if new_blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is request:
                    break
            if new_blocks is None:
                break
            out.blocks_to_copy += new_blocks.copies
            budget -= self._mark_scheduled(request, n, out)
            index += 1
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutputs) -> None:
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.num_recomputes += 1
        self._recompute(seq, out)


V1 = SimpleNamespace(Scheduler=V1Scheduler)


def _graded(region):
    """The graded test functions of ``region`` with their parameter sets."""
    for name, fn in inspect.getmembers(graded, inspect.isfunction):
        marks = getattr(fn, "pytestmark", [])
        if any(m.name == "exercise" and m.args[0] == region for m in marks):
            params = [m for m in marks if m.name == "parametrize"]
            if not params:
                yield name, fn, {}
                continue
            (mark,) = params
            names = [x.strip() for x in mark.args[0].split(",")]
            for values in mark.args[1]:
                values = values if len(names) > 1 else (values,)
                yield name, fn, dict(zip(names, values))


RUNNING_TESTS = list(_graded("ch06.ex2"))


def test_every_region_has_graded_tests():
    assert len(RUNNING_TESTS) >= 5
    for region in ("ch06.ex1", "ch06.ex3", "ch06.ex4", "ch06.ex5"):
        assert list(_graded(region)), region


@pytest.mark.parametrize("name", [name for name, _, _ in RUNNING_TESTS])
def test_v1_tail_preemption_passes_the_running_steps_graded_tests(name):
    for test_name, fn, kwargs in RUNNING_TESTS:
        if test_name == name:
            fn(lambda module: V1, **kwargs)


def test_v1_policy_passes_the_invariants_on_its_own_scheduler():
    """The whole v1-style policy (its running step and recompute-only preemption), recompute runs."""
    seen = graded.assert_invariants(V1Scheduler, range(40), recompute_only=True)
    assert seen >= {"preempted", "exhausted", "blocks_to_copy", "chunked"}, seen


def test_v1_policy_differs_from_the_reference_step_by_step():
    """What makes lockstep grading wrong: a run where the v1 shape decides differently, yet both are
    correct (the invariants hold, requests end alike)."""
    cfg, reqs = dict(bs=4, num_gpu_blocks=2, max_model_len=32), [(0, "X", list(range(1, 7)), 10, 1)]
    _, want = graded.run_spec(RefScheduler, cfg, reqs)
    seen, got = graded.run_spec(V1Scheduler, cfg, reqs)
    assert got == want and got["X"][0][0] == "kv_cache_exhausted"
    assert "preempted" in seen, (
        "v1 preempts a request alone in the pool (itself); the reference does not"
    )


def test_pinned_policy_cases_are_few_and_say_so():
    """Only a few graded checks pin the policy the chapter names (beyond the invariants); their failure
    message says so (``graded.PINNED``), so a learner whose correct policy of another shape fails one
    knows why."""
    for region in ("ch06.ex1", "ch06.ex2", "ch06.ex3", "ch06.ex4", "ch06.ex5"):
        tests = {name: fn for name, fn, _ in _graded(region)}
        pinned = [name for name, fn in tests.items() if "PINNED" in inspect.getsource(fn)]
        assert len(pinned) <= 2 and len(pinned) * 2 < len(tests), (region, pinned)
    assert "pinned case" in graded.PINNED
