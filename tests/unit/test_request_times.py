"""Chapter 08's latency tools (``paged_course/bench/request_times.py``): the recorder reads one time per
output token of each request from a real engine run, and the reference report agrees with the exercise's
answer (``solutions/ex08_metrics.py``) on random runs."""

from __future__ import annotations

import random

import pytest

from paged.core.sequence import SamplingParams
from paged.engine import LLM
from paged_course.bench import request_times
from solutions import ex08_metrics


@pytest.mark.timeout(120)
def test_the_recorder_gives_each_request_its_tokens_times_in_order():
    llm = LLM(max_num_seqs=2, verbose=False)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (3, 1, 4)]
    run = request_times.record_request_times(llm, prompts, params)
    assert [len(r.tokens) for r in run] == [3, 1, 4]
    for r in run:
        assert r.tokens[0] >= r.arrival and list(r.tokens) == sorted(r.tokens)
    assert run[2].tokens[0] > run[0].tokens[0], (
        "the third request waits for a seat (max_num_seqs=2)"
    )
    assert "on_tokens" not in vars(llm.engine.metrics), "the engine's own method is put back"
    assert llm.stats()["generated_tokens"] == 8, "the engine's counters still count the run"


@pytest.mark.parametrize("seed", range(5))
def test_the_reference_report_agrees_with_the_exercise_answer(seed):
    rng = random.Random(seed)
    run = []
    for _ in range(rng.randint(1, 30)):
        arrival = rng.uniform(0, 3)
        times = sorted(arrival + rng.uniform(0, 2) for _ in range(rng.choice([0, 1, 2, 5, 20])))
        run.append((arrival, tuple(times)))
    kwargs = {"percentiles": (50, 90, 99.9), "slo_ttft": 0.7, "slo_tpot": 0.2}
    ours = request_times.latency_report([request_times.RequestTimes(*r) for r in run], **kwargs)
    answer = ex08_metrics.latency_report([ex08_metrics.RequestTimes(*r) for r in run], **kwargs)
    assert ours.keys() == answer.keys()
    for key, value in answer.items():
        if isinstance(value, dict):
            assert ours[key] == pytest.approx(value), key
        else:
            assert ours[key] == pytest.approx(value) if value is not None else ours[key] is None, (
                key
            )
