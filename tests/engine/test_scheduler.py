"""Scheduler: a prompt larger than the cache, a lone request that cannot grow and a swapped-out request
coming back, at scheduler level; the watermark, abort, budgets, and random runs.

A fake engine drives the real ``Scheduler`` + ``BlockSpaceManager``: it applies the block moves of
each step to a dictionary standing in for the KV pool (slot -> the token prefix whose K/V it holds),
"computes" the scheduled tokens by writing their slots, checks that every token a sequence attends to
sits in its block table with the right content (so preemption, swap, copy-on-write and prefix caching
can never serve wrong K/V unnoticed), then appends a token chosen from the sequence's own tokens.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged.config import EngineConfig
from paged.core.scheduler import CacheConfig, Scheduler, SchedulerConfig
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus


def prefills(out) -> list:
    """The step's prompt chunks (``SchedulerOutputs.scheduled`` entries that are prefills)."""
    return [s for s in out.scheduled if s.is_prefill]


def decodes(out) -> list:
    """The step's decodes."""
    return [s for s in out.scheduled if not s.is_prefill]


S = SequenceStatus


class FakeEngine:
    """The engine side of the ``SchedulerOutputs`` contract, with a content-checked fake KV pool."""

    def __init__(self, sched: Scheduler):
        self.sched, self.bs = sched, sched.cache_config.block_size
        self.gpu: dict[
            int, tuple
        ] = {}  # slot -> token prefix (tuple) whose last token's K/V it holds
        self.cpu: dict[int, tuple] = {}
        self.ids = itertools.count(10_000)
        self.steps = 0
        self.log: list = []

    def _move(self, pairs, src: dict, dst: dict) -> None:
        for a, b in pairs:
            for i in range(self.bs):
                if a * self.bs + i in src:
                    dst[b * self.bs + i] = src[a * self.bs + i]
                else:
                    dst.pop(b * self.bs + i, None)

    def step(self):
        out = self.sched.schedule()
        self.steps += 1
        self.log.append(out)
        self._move(out.blocks_to_swap_out, self.gpu, self.cpu)
        self._move(out.blocks_to_swap_in, self.cpu, self.gpu)
        self._move(out.blocks_to_copy, self.gpu, self.gpu)
        for s in out.scheduled:  # write K/V of every scheduled token (all before any read)
            table = s.block_table
            assert len(table) * self.bs >= s.start + s.num_tokens, (
                f"seq {s.seq.seq_id}: table too short"
            )
            for p in range(s.start, s.start + s.num_tokens):
                self.gpu[table[p // self.bs] * self.bs + p % self.bs] = tuple(
                    s.seq.token_ids[: p + 1]
                )
        for s in (
            out.scheduled
        ):  # attention reads every computed position: cached, recomputed or swapped back
            toks, table = s.seq.token_ids, s.block_table
            for p in range(s.start + s.num_tokens):
                got = self.gpu.get(table[p // self.bs] * self.bs + p % self.bs)
                assert got == tuple(toks[: p + 1]), (
                    f"seq {s.seq.seq_id} position {p}: wrong K/V in its slot"
                )
        for s in out.scheduled:
            # a prompt chunk that is not the last one: nothing to sample yet
            if not s.samples_next_token:
                continue
            group, seqs = s.seq.group, [s.seq]
            while group.sampling_params.n > len(
                group.seqs
            ):  # parallel sampling: fork at the first sample
                child = s.seq.fork(next(self.ids))
                group.seqs.append(child)
                self.sched.fork_seq(s.seq, child)
                seqs.append(child)
            for seq in seqs:
                k = group.seqs.index(seq)
                seq.append_token_id((sum(seq.token_ids) * 31 + len(seq) + k) % 97)
                if (
                    len(seq.output_token_ids) >= group.sampling_params.max_tokens
                    or len(seq) >= self.sched.config.max_model_len
                ):
                    seq.status = S.FINISHED_LENGTH
        return out

    def run(self, max_steps: int = 1000) -> int:
        while self.sched.has_unfinished_requests():
            assert self.steps < max_steps, f"no progress after {max_steps} steps: livelock"
            self.step()
        return self.steps


_ids = itertools.count()


def make(rid, prompt, max_tokens, bs=4, n=1):
    prompt = list(range(1, prompt + 1)) if isinstance(prompt, int) else list(prompt)
    return SequenceGroup(
        rid, [Sequence(next(_ids), prompt, bs)], SamplingParams(n=n, max_tokens=max_tokens)
    )


def sched(
    num_gpu_blocks,
    bs=4,
    max_model_len=32,
    mode="recompute",
    num_cpu_blocks=0,
    watermark=0.01,
    prefix=False,
    **kw,
):
    return Scheduler(
        SchedulerConfig(max_model_len=max_model_len, preemption_mode=mode, **kw),
        CacheConfig(
            block_size=bs,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            watermark=watermark,
            enable_prefix_caching=prefix,
        ),
    )


def assert_all_free(s: Scheduler):
    bm = s.block_manager
    assert bm.get_num_free_gpu_blocks() == s.cache_config.num_gpu_blocks, "GPU blocks leaked"
    assert bm.get_num_free_cpu_blocks() == s.cache_config.num_cpu_blocks, "CPU blocks leaked"
    assert not (s.waiting or s.running or s.swapped), "queues not empty at the end"
    assert not s.has_unfinished_requests()


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        (
            {
                "max_model_len": 4096,
                "max_num_batched_tokens": 2048,
                "enable_chunked_prefill": False,
            },
            "not chunked",
        ),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
        ({"preemption_mode": "evict"}, "recompute"),
        ({"max_model_len": 16, "max_num_batched_tokens": 16}, "max_num_seqs"),
    ],
)
def test_scheduler_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"block_size": 0}, "block_size"),
        ({"num_gpu_blocks": -1}, "num_gpu_blocks"),
        ({"num_cpu_blocks": -2}, "num_cpu_blocks"),
        ({"watermark": 1.0}, "watermark"),
    ],
)
def test_cache_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        CacheConfig(**kwargs)


def test_config_rejects_swap_without_cpu_blocks_and_scheduler_an_unsized_pool():
    with pytest.raises(ValueError, match="num_cpu_blocks > 0"):
        EngineConfig(scheduler=SchedulerConfig(preemption_mode="swap"), cache=CacheConfig())
    with pytest.raises(ValueError, match="exceeds the model's 2048 positions"):
        EngineConfig(scheduler=SchedulerConfig(max_model_len=4096))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=0.0)
    with pytest.raises(ValueError, match="num_gpu_blocks must be set"):
        Scheduler(SchedulerConfig(), CacheConfig())
    assert (
        SchedulerConfig(max_model_len=4096, enable_chunked_prefill=False).max_num_batched_tokens
        == 4096
    )
    assert SchedulerConfig(max_model_len=4096).max_num_batched_tokens == 2048, (
        "chunked: any budget works"
    )
    assert SchedulerConfig(max_model_len=100).max_num_batched_tokens == 2048


def test_add_request_rejects_duplicates_and_wrong_block_size():
    s = sched(4)
    s.add_request(make("a", 3, 1))
    with pytest.raises(ValueError, match="already queued"):
        s.add_request(make("a", 3, 1))
    with pytest.raises(ValueError, match="block_size"):
        s.add_request(make("b", 3, 1, bs=8))
    assert len(s.waiting) == 1, "a rejected request must not be queued"


# ---------------------------------------------------------------- a prompt larger than the whole cache
def test_case7_prompt_larger_than_cache_is_ignored_and_does_not_block():
    s = sched(4)  # bs 4, 16 slots, max_model_len 32
    a, b = make("A", 20, 2), make("B", 3, 2)
    s.add_request(a)
    s.add_request(b)
    eng = FakeEngine(s)
    first = eng.step()
    assert [x.group.request_id for x in first.ignored] == ["A"]
    assert [g.seq.group.request_id for g in prefills(first)] == ["B"], "B must not wait behind A"
    assert a.seqs[0].status is S.FINISHED_IGNORED
    assert "20 tokens" in a.seqs[0].finish_message and "4 blocks" in a.seqs[0].finish_message
    assert eng.run() == 3, "B: prefill, one decode, then the loop sees nothing left"
    assert b.seqs[0].status is S.FINISHED_LENGTH and len(b.seqs[0].output_token_ids) == 2
    assert_all_free(s)


def test_case7_prompt_over_max_model_len_is_ignored():
    s = sched(64, max_model_len=32)
    a = make("A", 33, 1)
    s.add_request(a)
    out = s.schedule()
    assert [x.group for x in out.ignored] == [a] and "max_model_len=32" in a.seqs[0].finish_message
    assert_all_free(s)


@pytest.mark.parametrize(
    "prompt, new, status, generated",
    [
        (16, 1, S.FINISHED_LENGTH, 1),  # 16 + 1 - 1 = 16 slots: fits
        (15, 2, S.FINISHED_LENGTH, 2),  # 15 + 2 - 1 = 16 slots: fits
        (16, 2, S.FINISHED_KV_EXHAUSTED, 1),  # 17 slots: the second token has no slot
    ],
)
def test_case7_a_request_needs_prompt_plus_new_minus_one_slots(prompt, new, status, generated):
    s = sched(4)
    g = make("X", prompt, new)
    s.add_request(g)
    FakeEngine(s).run(max_steps=10)
    assert g.seqs[0].status is status
    assert len(g.seqs[0].output_token_ids) == generated
    assert_all_free(s)


# ---------------------------------------------------------------- the only running sequence cannot grow
def test_case8_alone_and_cannot_grow_finishes_kv_exhausted():
    s = sched(2)  # 8 slots
    g = make("X", 6, 10)
    s.add_request(g)
    eng = FakeEngine(s)
    assert eng.run(max_steps=10) == 4, "prefill + 2 decodes fill 8 slots; step 4 reports exhaustion"
    seq = g.seqs[0]
    assert seq.status is S.FINISHED_KV_EXHAUSTED and len(seq.output_token_ids) == 3
    assert "KV cache exhausted" in seq.finish_message and "2 blocks" in seq.finish_message
    assert [x.group.request_id for x in eng.log[-1].exhausted] == ["X"]
    assert s.num_preemptions == 0, "no preempt/re-prefill loop"
    assert sum(len(prefills(o)) for o in eng.log) == 1
    assert_all_free(s)


def test_case8_two_requests_the_later_one_is_preempted_and_both_finish():
    s = sched(2)
    a, b = make("A", 3, 6), make("B", 3, 6)
    s.add_request(a)
    s.add_request(b)
    eng = FakeEngine(s)
    eng.run(max_steps=30)
    preempted = [x.group.request_id for o in eng.log for x in o.preempted]
    assert preempted == ["B"], "the victim is the most recently admitted request, once"
    assert [x.group for x in eng.log[2].preempted] == [b]
    assert [g.seq.group.request_id for g in decodes(eng.log[2])] == ["A"]
    reprefill = [g for o in eng.log for g in prefills(o) if g.seq.group is b][1]
    assert (reprefill.start, reprefill.num_tokens) == (0, 5), "prompt 3 + 2 generated recomputed"
    for g in (a, b):
        assert g.seqs[0].status is S.FINISHED_LENGTH and len(g.seqs[0].output_token_ids) == 6
    assert eng.steps == 11 and s.num_recomputes == 1
    assert_all_free(s)


# ---------------------------------------------------------------- a swapped-out sequence comes back
def test_case10_swapped_out_request_comes_back_after_the_other_finishes():
    s = sched(4, mode="swap", num_cpu_blocks=4)
    a, b = make("A", 7, 6), make("B", 7, 6)
    s.add_request(a)
    s.add_request(b)
    eng = FakeEngine(s)
    eng.run(max_steps=30)
    out_step = [i for i, o in enumerate(eng.log) if o.blocks_to_swap_out]
    in_step = [i for i, o in enumerate(eng.log) if o.blocks_to_swap_in]
    assert out_step == [2] and [x.group for x in eng.log[2].preempted] == [b]
    assert len(eng.log[2].blocks_to_swap_out) == 2
    assert (
        in_step == [6]
        and [x.group for x in eng.log[6].swapped_in] == [b]
        and len(eng.log[6].blocks_to_swap_in) == 2
    )
    finished_a = next(
        i
        for i, o in enumerate(eng.log)
        if any(g.seq.group is a for g in o.scheduled) and a.seqs[0].is_finished and i >= 5
    )
    assert in_step[0] > finished_a, "B comes back only after A finished"
    assert s.num_swap_outs == s.num_swap_ins == 1 and s.num_recomputes == 0
    for g in (a, b):
        assert g.seqs[0].status is S.FINISHED_LENGTH and len(g.seqs[0].output_token_ids) == 6
    assert a.seqs[0].output_token_ids == b.seqs[0].output_token_ids, (
        "same prompt, same tokens after the swap"
    )
    assert_all_free(s)


def test_swap_falls_back_to_recompute_when_cpu_pool_is_full():
    s = sched(4, mode="swap", num_cpu_blocks=1)  # B's 2 blocks do not fit in 1 CPU block
    a, b = make("A", 7, 6), make("B", 7, 6)
    s.add_request(a)
    s.add_request(b)
    FakeEngine(s).run(max_steps=30)
    assert s.num_swap_outs == 0 and s.num_recomputes == 1
    assert all(len(g.seqs[0].output_token_ids) == 6 for g in (a, b))
    assert_all_free(s)


# ---------------------------------------------------------------- step contents
def test_schedule_refuses_a_running_sequence_without_a_new_token():
    s = sched(16)
    s.add_request(make("A", 5, 4))
    s.schedule()
    with pytest.raises(RuntimeError, match="append the sampled token"):
        s.schedule()
    assert len(s.running) == 1 and s.block_manager.get_num_free_gpu_blocks() == 14, (
        "state unchanged"
    )


def test_mixed_step_and_num_computed_tokens_contract():
    s = sched(16)
    a = make("A", 5, 4)
    s.add_request(a)
    eng = FakeEngine(s)
    out = eng.step()
    (entry,) = prefills(out)
    assert (entry.start, entry.num_tokens, entry.token_ids) == (0, 5, [1, 2, 3, 4, 5])
    assert a.seqs[0].num_computed_tokens == 5, "the scheduler marks scheduled tokens computed"
    s.add_request(make("B", 6, 2))
    out = eng.step()
    assert [g.seq.group.request_id for g in decodes(out)] == ["A"]
    assert [g.seq.group.request_id for g in prefills(out)] == ["B"], (
        "a prefill and decodes share the step"
    )
    assert out.num_batched_tokens == 1 + 6 and decodes(out)[0].start == 5
    seq_a, seq_b = out.scheduled
    assert seq_a.seq is a.seqs[0] and len(seq_a.block_table) == 2 and len(seq_b.block_table) == 2


def test_token_and_seq_budgets_are_fcfs():
    s = sched(
        64,
        max_model_len=16,
        max_num_batched_tokens=16,
        max_num_seqs=2,
        enable_chunked_prefill=False,
    )
    for rid, p in [("A", 10), ("B", 7), ("C", 3), ("D", 2)]:
        s.add_request(make(rid, p, 3))
    out = s.schedule()
    assert [g.seq.group.request_id for g in prefills(out)] == ["A"], (
        "B (7) > 6 tokens left; C may not overtake"
    )
    assert out.num_batched_tokens == 10


def test_prefix_cached_tokens_cost_no_budget():
    s = sched(64, max_model_len=16, max_num_batched_tokens=16, max_num_seqs=8, prefix=True)
    s.add_request(make("X", range(100, 116), 1))
    FakeEngine(s).run()
    s.add_request(make("Y", range(100, 116), 1))  # 12 tokens cached (the last block is recomputed)
    s.add_request(make("Z", range(200, 212), 1))
    out = s.schedule()
    assert [(g.seq.group.request_id, g.start, g.num_tokens) for g in prefills(out)] == [
        ("Y", 12, 4),
        ("Z", 0, 12),
    ], "4 + 12 tokens fit the 16-token budget only if cached tokens are free"


# ---------------------------------------------------------------- watermark (seed error E9)
def test_watermark_keeps_blocks_free_at_admission_only():
    s = sched(100, bs=1, max_model_len=200, watermark=0.1)  # keeps int(0.1 * 100) = 10 blocks free
    too_big, fits = make("big", 91, 1, bs=1), make("fits", 90, 1, bs=1)
    s.add_request(too_big)
    s.add_request(fits)
    fits.sampling_params.max_tokens = 5
    eng = FakeEngine(s)
    out = eng.step()
    assert [x.group for x in out.ignored] == [too_big] and "keeps 10 free" in too_big.seqs[
        0
    ].finish_message
    assert [g.seq.group for g in prefills(out)] == [fits]
    s.add_request(make("more", 1, 1, bs=1))
    assert prefills(eng.step()) == [], "admission stops while fewer than 10 blocks would stay free"
    # running requests may use the reserve: decodes grow into the last 10 blocks without preemption
    s2 = sched(100, bs=1, max_model_len=200, watermark=0.1)
    g = make("grow", 90, 11, bs=1)
    s2.add_request(g)
    FakeEngine(s2).run()
    assert g.seqs[0].status is S.FINISHED_LENGTH and s2.num_preemptions == 0


# ---------------------------------------------------------------- abort
@pytest.mark.parametrize("stage", ["waiting", "running", "swapped", "recomputed", "finished"])
def test_abort_frees_everything_at_any_stage(stage):
    s = sched(4, mode="swap" if stage == "swapped" else "recompute", num_cpu_blocks=4)
    a, b = make("A", 7, 6), make("B", 7, 6)
    s.add_request(a)
    s.add_request(b)
    eng = FakeEngine(s)
    if stage != "waiting":
        for _ in range(3):  # step 3 preempts B (swap or recompute)
            eng.step()
    target = {"waiting": b, "running": a, "swapped": b, "recomputed": b, "finished": b}[stage]
    if stage == "swapped":
        assert b.seqs[0] in s.swapped
    if stage == "recomputed":
        assert b.seqs[0] in s.waiting and b.seqs[0].num_computed_tokens == 0
    if stage == "finished":
        b = target
        eng.run()
        assert not s.abort_request("B"), "aborting a finished request changes nothing"
        assert_all_free(s)
        return
    assert s.abort_request(target.request_id)
    assert target.seqs[0].status is S.FINISHED_ABORTED
    eng.run()
    assert_all_free(s)


# ---------------------------------------------------------------- parallel sampling
def test_forked_request_with_copy_on_write_and_preemption():
    s = sched(6, max_model_len=32)
    a, b = make("A", 5, 6, n=2), make("B", 3, 6)
    s.add_request(a)
    s.add_request(b)
    eng = FakeEngine(s)
    eng.run(max_steps=60)
    assert any(o.blocks_to_copy for o in eng.log), (
        "the forks' shared partial block is copied on write"
    )
    assert len(a.seqs) == 2 and all(len(x.output_token_ids) == 6 for x in a.seqs)
    assert a.seqs[0].output_token_ids != a.seqs[1].output_token_ids
    assert s.num_preemptions >= 1
    assert_all_free(s)


# ---------------------------------------------------------------- random runs (hypothesis)
# (prompt length, max_tokens, arrival step, shared head id, n, abort at step or None)
request = st.tuples(
    st.integers(1, 14),
    st.integers(1, 8),
    st.integers(0, 6),
    st.integers(0, 2),
    st.sampled_from([1, 1, 1, 2]),
    st.one_of(st.none(), st.integers(0, 12)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(request, min_size=1, max_size=8),
    bs=st.sampled_from([2, 4]),
    n_gpu=st.integers(2, 8),
    n_cpu=st.integers(0, 8),
    mode=st.sampled_from(["recompute", "swap"]),
    prefix=st.booleans(),
    watermark=st.sampled_from([0.0, 0.2]),
)
def test_random_arrivals_and_aborts_all_finish_and_free_everything(
    reqs, bs, n_gpu, n_cpu, mode, prefix, watermark
):
    if mode == "swap" and n_cpu == 0:
        n_cpu = 2
    s = sched(
        n_gpu,
        bs=bs,
        max_model_len=16,
        mode=mode,
        num_cpu_blocks=n_cpu,
        watermark=watermark,
        prefix=prefix,
        max_num_seqs=4,
        max_num_batched_tokens=16,
    )
    eng = FakeEngine(s)
    groups = []
    arrivals = sorted((arr, i, p, m, share, n) for i, (p, m, arr, share, n, _) in enumerate(reqs))
    aborts = {f"r{i}": at for i, (*_, at) in enumerate(reqs) if at is not None}
    bound = 20 + sum(4 * (p + m) for p, m, *_ in reqs)
    for t in itertools.count():
        for rid, at in aborts.items():
            if at == t:
                s.abort_request(
                    rid
                )  # any stage: waiting, running, swapped, preempted, finished, unknown
        while arrivals and arrivals[0][0] <= t:
            _, i, p, m, share, n = arrivals.pop(0)
            prompt = [5 + share] * min(p, 4) + [20 + i] * max(
                0, p - 4
            )  # shared heads exercise prefix caching
            groups.append(make(f"r{i}", prompt, m, bs=bs, n=n))
            s.add_request(groups[-1])
        if not arrivals and not s.has_unfinished_requests():
            break
        assert t < bound, f"no progress after {bound} steps"
        out = eng.step()
        assert len(out.scheduled) <= 4
        assert out.num_batched_tokens <= 16 or len(out.scheduled) == 1, "token budget exceeded"
    for g in groups:
        for seq in g.seqs:
            assert seq.status in (
                S.FINISHED_LENGTH,
                S.FINISHED_IGNORED,
                S.FINISHED_KV_EXHAUSTED,
                S.FINISHED_ABORTED,
            ), seq
            if seq.status is S.FINISHED_ABORTED:
                assert g.request_id in aborts
            elif seq.status is S.FINISHED_LENGTH:
                assert len(seq.output_token_ids) == g.sampling_params.max_tokens or len(seq) == 16
            else:
                assert seq.finish_message, "ignored / exhausted requests carry their reason"
    assert_all_free(s)


def test_swapped_queue_stays_in_arrival_order_when_several_are_swapped_out():
    s = sched(4, mode="swap", num_cpu_blocks=12, watermark=0.0)
    groups = [
        make(r, 4, 8) for r in "ABCD"
    ]  # 4 tokens each: 1 full block, the next token needs a 2nd
    for g in groups:
        s.add_request(g)
    eng = FakeEngine(s)
    eng.step()  # all four prefill: the pool is full
    out = eng.step()  # A grows into D's block, B into C's: D then C are swapped out (latest first)
    assert [x.group for x in out.preempted] == [groups[3], groups[2]], (
        "the most recently admitted is preempted first"
    )
    assert [x.group for x in s.swapped] == [groups[2], groups[3]], (
        "swapped is oldest first (C before D)"
    )
    eng.run(max_steps=60)
    assert [g.seqs[0].status for g in groups] == [S.FINISHED_LENGTH] * 4
    assert_all_free(s)
