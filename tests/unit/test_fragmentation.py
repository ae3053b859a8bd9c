"""Fragmentation simulator: slot conservation, claim C3, rejections, and the event loop against a per-step loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_course.sim.fragmentation import (
    MANAGERS,
    PagedManager,
    compare,
    max_concurrency,
    simulate,
    slot_kinds,
    summary_table,
)
from paged_course.sim.workload import Trace, chat_trace


def naive_paged(trace: Trace, pool: int, bs: int, watermark: float):
    """Step-by-step reference of the paged manager: per-step allocated slots and real tokens."""
    nb, wm = pool // bs, int(watermark * pool // bs)
    final = trace.final_len.tolist()
    running, waiting, nxt, t = [], [], 0, 0  # running: [req, tokens] in admission order
    alloc, real, preempt, recomputed = [], [], 0, 0
    while nxt < trace.n or waiting or running:
        running = [
            [r, L + 1] for r, L in running if L < final[r]
        ]  # grow; drop those that were done
        while nxt < trace.n and trace.arrival[nxt] <= t:
            if -(-trace.prompt_len[nxt] // bs) <= nb - wm:
                waiting.append([nxt, int(trace.prompt_len[nxt])])
            nxt += 1
        while sum(-(-L // bs) for _, L in running) > nb:
            r, L = running.pop()
            if running:
                waiting.insert(
                    0, [r, L - 1]
                )  # re-prefilled later: prompt + tokens generated so far
                preempt += 1
                recomputed += L - 1
        while waiting and sum(-(-L // bs) for _, L in running) + -(-waiting[0][1] // bs) <= nb - wm:
            running.append(waiting.pop(0))
        if not running and not waiting and nxt >= trace.n:
            break
        alloc.append(sum(-(-L // bs) * bs for _, L in running))
        real.append(sum(L for _, L in running))
        t += 1
    return np.array(alloc), np.array(real), preempt, recomputed


@st.composite
def traces(draw):
    n = draw(st.integers(1, 25))
    prompt = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    extra = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    return Trace.from_lengths(
        prompt, output, np.add(output, extra), np.cumsum(gaps), max_seq_len=100
    )


@settings(max_examples=60, deadline=None)
@given(
    trace=traces(),
    bs=st.sampled_from([1, 3, 4, 16]),
    pool=st.integers(16, 160),
    watermark=st.sampled_from([0.0, 0.1]),
)
def test_paged_matches_step_by_step_reference_and_c3(trace, bs, pool, watermark):
    res = simulate(trace, pool, "paged", bs, watermark)
    alloc, real, preempt, recomputed = naive_paged(trace, pool, bs, watermark)
    n = len(res.real)
    assert np.array_equal(res.real, real[:n]) and np.array_equal(res.allocated, alloc[:n]), (
        "the event loop must give the same per-step slots as stepping one decode step at a time"
    )
    assert not real[n:].any(), "the simulation ended while a request still held tokens"
    assert res.preemptions == preempt
    assert res.recomputed_tokens == recomputed, "each re-admission re-prefills what the victim held"
    slack = res.allocated - res.real
    assert (slack >= 0).all() and (slack <= res.running * (bs - 1)).all(), (
        "C3: each paged sequence wastes at most block_size - 1 slots"
    )
    assert (res.allocated <= pool // bs * bs).all(), "never more blocks than the pool holds"


_ARRAYS = ("real", "reserved", "internal", "external", "running", "waiting", "admitted")


@settings(max_examples=60, deadline=None)
@given(
    trace=traces(),
    bs=st.sampled_from([1, 3, 4, 16]),
    pool=st.integers(8, 160),
    watermark=st.sampled_from([0.0, 0.1, 0.3]),
)
def test_a_paged_manager_object_and_slot_kinds_give_the_built_in_results(
    trace, bs, pool, watermark
):
    """The pluggable paths (chapter 01 runs the learner's pieces through them) decide and count the same."""
    results = compare(trace, pool, bs, watermark)
    plugged = compare(trace, pool, bs, watermark, paged_manager=PagedManager, slot_kinds=slot_kinds)
    for manager, res in results.items():
        other = plugged[manager]
        for name in _ARRAYS:
            assert np.array_equal(getattr(res, name), getattr(other, name)), (
                f"{manager}: {name} differs"
            )
        assert (res.preemptions, res.rejected.tolist(), res.truncated.tolist()) == (
            other.preemptions,
            other.rejected.tolist(),
            other.truncated.tolist(),
        ), manager


def test_plugging_in_checks_its_arguments():
    trace = Trace.from_lengths([3, 5], [4, 2])
    with pytest.raises(ValueError, match="paged_manager"):
        simulate(trace, 64, "static", paged_manager=PagedManager)
    with pytest.raises(ValueError, match="slot_kinds must return"):
        simulate(trace, 64, "paged", slot_kinds=lambda tokens, final, held: (tokens, held))


@settings(max_examples=40, deadline=None)
@given(trace=traces(), pool=st.integers(40, 400), manager=st.sampled_from(MANAGERS))
def test_slots_are_conserved(trace, pool, manager):
    res = simulate(trace, pool, manager, block_size=4)
    for kind in ("real", "reserved", "internal", "external"):
        assert (getattr(res, kind) >= 0).all(), f"{kind} slots cannot be negative"
    assert (res.allocated + res.external <= pool).all(), (
        "allocated + external fragmentation fit in the pool"
    )
    finished = set(
        res.segments["req"][
            res.segments["end"] - res.segments["start"] + res.segments["init"] - 1
            == res.segments["final"]
        ].tolist()
    )
    accounted = finished | set(res.rejected.tolist()) | set(res.truncated.tolist())
    assert accounted == set(range(trace.n)), "every request finishes, is rejected, or is truncated"
    if (
        manager != "paged"
    ):  # reservations: every admitted stay runs to its end; token-steps add up exactly
        rejected = set(res.rejected.tolist())
        expected = sum(
            sum(range(int(p), int(f) + 1))
            for i, (p, f) in enumerate(zip(trace.prompt_len, trace.final_len))
            if i not in rejected
        )
        assert res.real.sum() == expected, (
            "each request holds prompt, prompt + 1, ..., final tokens"
        )


def test_static_and_contiguous_by_hand():
    # pool 64, max_seq_len 32: two static slots; contiguous reserves prompt + max_tokens
    trace = Trace.from_lengths([4, 4, 4], [2, 2, 2], [28, 28, 2], max_seq_len=32)
    static = simulate(trace, 64, "static")
    assert static.running.tolist() == [2, 2, 2, 1, 1, 1]  # the third request waits for a slot
    assert static.real.tolist() == [8, 10, 12, 4, 5, 6]
    assert static.internal.tolist() == [52, 52, 52, 26, 26, 26]
    contiguous = simulate(trace, 64, "contiguous")  # reserves 32, 32, 6: the third waits for a hole
    assert contiguous.running.tolist() == [2, 2, 2, 1, 1, 1]
    assert contiguous.segments["offset"].tolist() == [0, 32, 0], (
        "first fit: lowest address that fits"
    )
    assert contiguous.external.sum() == 0, (
        "no free slot at all while it waits: a shortage, not fragmentation"
    )


def test_contiguous_external_fragmentation():
    # pool 30: A, B, C reserve 10 slots each; A and C leave at step 2, B at step 6; D needs 15 slots:
    # 20 slots are free from step 2 but in two holes of 10, so D waits on external fragmentation
    trace = Trace.from_lengths([5, 5, 5, 5], [1, 5, 1, 1], [5, 5, 5, 10], max_seq_len=15)
    res = simulate(trace, 30, "contiguous")
    assert res.external.tolist() == [0, 0, 20, 20, 20, 20, 0, 0], (
        "free holes too small for the head request"
    )
    assert res.segments["offset"].tolist() == [0, 10, 20, 0]
    assert res.waiting.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]


def test_recomputed_tokens_by_hand():
    # bs 4, 4 blocks, watermark 0.25 (1 block kept free at admission). A (prompt 4, 8 new) and B (prompt
    # 4, 5 new) each hold 2 blocks from step 1; at step 5 both need a third: B, admitted last, is
    # preempted holding 8 tokens (prompt + 4 generated) and re-admitted with those 8 when A leaves.
    trace = Trace.from_lengths([4, 4], [8, 5], max_seq_len=12)
    res = simulate(trace, 16, "paged", block_size=4, watermark=0.25)
    _, _, preempt, recomputed = naive_paged(trace, 16, 4, 0.25)
    assert res.preemptions == preempt == 1 and res.recomputed_tokens == recomputed == 8
    assert res.segments["init"][res.segments["req"] == 1].tolist() == [4, 8], (
        "B: its prompt, then 4 + 4 tokens"
    )
    assert res.segments["start"][res.segments["req"] == 1].tolist() == [0, 9], (
        "B comes back when A leaves"
    )
    assert res.summary()["recomputed_tokens"] == 8
    for manager in ("static", "contiguous"):
        assert simulate(trace, 32, manager).recomputed_tokens == 0, "reservations never preempt"


def test_rejected_requests_do_not_hang():
    trace = Trace.from_lengths([10, 500, 3], [5, 5, 5], max_seq_len=505)
    for manager in MANAGERS:
        res = simulate(trace, 64, manager, block_size=4)
        expected = {"static": [0, 1, 2], "contiguous": [1], "paged": [1]}[manager]
        assert res.rejected.tolist() == expected, manager
    paged = simulate(
        Trace.from_lengths([6], [20], max_seq_len=26), 16, "paged", block_size=4, watermark=0
    )
    assert paged.truncated.tolist() == [0] and paged.real.max() == 16, (
        "alone and out of blocks: truncated"
    )


def test_bad_arguments():
    trace = Trace.from_lengths([1], [1])
    with pytest.raises(ValueError, match="manager"):
        simulate(trace, 10, "buddy")
    with pytest.raises(ValueError, match="pool_slots"):
        simulate(trace, 0, "paged")
    with pytest.raises(ValueError, match="watermark"):
        simulate(trace, 10, "paged", watermark=1.5)
    with pytest.raises(ValueError, match="max_tokens"):
        Trace.from_lengths([1], [5], [4])
    with pytest.raises(ValueError, match="num_requests"):
        chat_trace(-1)


def test_chat_trace_is_seeded_and_clipped():
    a, b = chat_trace(500, seed=3, max_seq_len=1024), chat_trace(500, seed=3, max_seq_len=1024)
    assert np.array_equal(a.prompt_len, b.prompt_len) and np.array_equal(a.output_len, b.output_len)
    assert (a.prompt_len + a.max_tokens <= 1024).all() and (a.output_len <= a.max_tokens).all()
    assert np.median(a.output_len) < a.output_len.mean(), "long right tail: mean above median"


def test_utilization_ordering_and_table():
    trace = chat_trace(300, seed=1)
    results = compare(trace, 16384)
    util = {m: r.summary()["utilization"] for m, r in results.items()}
    assert util["static"] < util["contiguous"] < util["paged"], util
    assert util["paged"] > 0.95, "paged waste is at most one partial block per sequence"
    assert "paged" in summary_table(results)


def test_max_concurrency():
    assert max_concurrency(32768, 2048, "static") == 16
    assert max_concurrency(32768, 500, "static", max_seq_len=2048) == 16
    assert max_concurrency(32768, 500, "contiguous") == 65
    assert max_concurrency(32768, 500, "paged", block_size=16) == 2048 // 32 == 64
    with pytest.raises(ValueError, match="manager"):
        max_concurrency(10, 1, "buddy")


def test_pool_snapshot_matches_the_per_step_counts():
    from paged_course.viz.fragmentation import pool_snapshot

    trace = chat_trace(120, seed=2, max_seq_len=512, mean_prompt=60, mean_output=80)
    for manager, res in compare(trace, 4096, block_size=8).items():
        for step in (0, res.num_steps // 3, res.num_steps // 2):
            owner, kind = pool_snapshot(res, step)
            counts = np.bincount(kind, minlength=5)
            assert counts[0] == res.real[step] and counts[1] == res.reserved[step], (manager, step)
            assert counts[2] == res.internal[step], (manager, step)
            assert (owner >= 0).sum() == res.allocated[step], (
                f"{manager}: owned slots are the allocated slots"
            )
            if manager == "paged":  # whole blocks, never shared between requests
                blocks = owner.reshape(-1, 8)
                assert (blocks == blocks[:, :1]).all(), "a block belongs to one request"
