"""Graded: chapter 01, the waste accounting and the paged manager (exercises/ex01_fragmentation.py).

Each piece is compared with a plain loop written here (slot by slot, block by block) on seeded random
inputs with ragged lengths, exact block multiples and two block sizes, then run inside the real
simulator (``paged_course.sim.fragmentation.simulate``) and compared with the simulator's own run. The
manager's two regions are tested apart: each test of one region gives the class the other region's
reference (written here), so a mistake in one never fails the other's checks.
"""

from __future__ import annotations

import numpy as np
import pytest

from paged.core.block_manager import AllocStatus
from paged_course.sim.fragmentation import simulate
from paged_course.sim.workload import Trace, chat_trace

KINDS = ("real", "reserved", "internal")


# ---- references written out slot by slot / block by block ------------------------------------------------


def _ref_kinds(tokens: int, final: int, held: int) -> tuple[int, int, int]:
    """Walk the held slots one by one: a token now, a future token of this request, or never one."""
    counts = [0, 0, 0]
    for slot in range(held):
        counts[0 if slot < tokens else 1 if slot < final else 2] += 1
    return tuple(counts)


def _ceil_blocks(num_tokens: int, block_size: int) -> int:
    blocks = 0
    while blocks * block_size < num_tokens:
        blocks += 1
    return blocks


def ref_can_allocate(self, num_tokens):
    need = _ceil_blocks(num_tokens, self.block_size)
    if self.num_blocks - need < self.watermark_blocks:
        return AllocStatus.NEVER
    return (
        AllocStatus.OK
        if self.num_free_blocks - need >= self.watermark_blocks
        else AllocStatus.LATER
    )


def ref_grow(self, req, num_tokens):
    if _ceil_blocks(num_tokens, self.block_size) == self.held[req]:
        return []
    victims = []
    while self.num_free_blocks == 0:
        newest = list(self.held)[-1]
        self.num_free_blocks += self.held.pop(newest)
        victims.append(newest)
        if newest == req:
            return victims
    self.held[req] += 1
    self.num_free_blocks -= 1
    return victims


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    """The first index where two equal-length arrays differ (0 when they agree)."""
    return int(np.flatnonzero(a != b)[0]) if not np.array_equal(a, b) else 0


def _with(cls, **methods):
    """The learner's class with some methods replaced by the references above."""
    return type(cls.__name__, (cls,), methods)


# ---- ch01.ex1: slot_kinds ------------------------------------------------------------------------------


def _requests(rule: str, seed: int, n: int = 300):
    """Random (tokens now, final tokens, held slots) with hand-picked block-boundary cases in front."""
    rng = np.random.default_rng(seed)
    final = rng.integers(1, 400, size=n)
    tokens = 1 + (rng.random(n) * final).astype(np.int64)  # 1 .. final
    edges = [
        (1, 1),
        (16, 16),
        (16, 40),
        (17, 33),
        (1, 16),
        (15, 17),
        (32, 32),
        (33, 64),
        (4, 5),
        (8, 8),
    ]
    tokens[: len(edges)], final[: len(edges)] = zip(*edges)
    if rule == "static":
        held = np.full(n, 512)
    elif rule == "contiguous":
        held = final + rng.integers(0, 200, size=n)  # prompt + max_tokens >= final
        held[:3] = final[:3]
    else:
        bs = int(rule.split()[-1])
        held = -(-tokens // bs) * bs
    return tokens, final, held


@pytest.mark.exercise("ch01.ex1", points=3)
@pytest.mark.parametrize("rule", ["static", "contiguous", "paged bs 4", "paged bs 16"])
def test_slot_kinds_slot_by_slot(impl, rule):
    ex = impl("ex01_fragmentation")
    tokens, final, held = _requests(rule, seed=len(rule))
    got = ex.slot_kinds(tokens, final, held)
    assert len(got) == 3, "slot_kinds returns (real, reserved, internal)"
    got = [np.asarray(a) for a in got]
    expected = np.array(
        [_ref_kinds(t, f, h) for t, f, h in zip(tokens.tolist(), final.tolist(), held.tolist())]
    ).T
    for name, g, e in zip(KINDS, got, expected):
        assert g.shape == tokens.shape, f"{name}: one count per request"
        i = int(np.flatnonzero(g != e)[0]) if not np.array_equal(g, e) else 0
        assert int(g[i]) == int(e[i]), (
            f"{name} slots ({rule}): a request with {tokens[i]} tokens now, "
            f"{final[i]} at its end and {held[i]} held slots"
        )
    assert (got[0] + got[1] + got[2] == held).all(), "real + reserved + internal = the held slots"


@pytest.mark.exercise("ch01.ex1", points=2)
@pytest.mark.parametrize("block_size", [4, 16])
def test_slot_kinds_in_the_simulator(impl, block_size):
    ex = impl("ex01_fragmentation")
    trace = chat_trace(150, seed=block_size, max_seq_len=512, mean_prompt=60, mean_output=90)
    for manager in ("static", "contiguous", "paged"):
        ref = simulate(trace, 6144, manager, block_size)
        mine = simulate(trace, 6144, manager, block_size, slot_kinds=ex.slot_kinds)
        for name in KINDS:
            a, b = getattr(ref, name), getattr(mine, name)
            step = _first_difference(a, b)
            assert int(b[step]) == int(a[step]), (
                f"{manager} manager, block_size {block_size}: {name} slots of all "
                f"running requests together at step {step} of the run"
            )


# ---- ch01.ex2: can_allocate ----------------------------------------------------------------------------


@pytest.mark.exercise("ch01.ex2", points=2)
def test_can_allocate_by_hand(impl):
    ex = impl("ex01_fragmentation")
    m = ex.PagedManager(20, 4, watermark=0.1)  # keeps 2 blocks free
    m.allocate(0, 49)  # 13 blocks held, 7 free
    why = {
        8: "2 blocks leave 5 free",
        20: "5 blocks leave exactly the 2 watermark blocks",
        21: "6 blocks would leave 1 (fewer than the watermark)",
        72: "18 blocks fit an empty pool beside the 2",
        73: "19 blocks never fit beside the 2 watermark blocks, even in an empty pool of 20",
    }
    for n, expected in (
        (8, AllocStatus.OK),
        (20, AllocStatus.OK),
        (21, AllocStatus.LATER),
        (72, AllocStatus.LATER),
        (73, AllocStatus.NEVER),
    ):
        assert m.can_allocate(n) == expected, (
            f"{n} tokens, 7 of 20 blocks free, watermark 2: {why[n]}"
        )
    assert (m.held, m.num_free_blocks) == ({0: 13}, 7), "can_allocate changes nothing"


@pytest.mark.exercise("ch01.ex2", points=3)
@pytest.mark.parametrize("block_size", [4, 16])
def test_can_allocate_against_the_watermark_rule(impl, block_size):
    ex = impl("ex01_fragmentation")
    rng = np.random.default_rng(block_size)
    for _ in range(300):
        num_blocks = int(rng.choice([1, 7, 20, 64, 250]))
        watermark = float(rng.choice([0.0, 0.01, 0.05, 0.1, 0.3]))
        m = ex.PagedManager(num_blocks, block_size, watermark)
        used = int(rng.integers(0, num_blocks + 1))
        if used:
            m.allocate(100, used * block_size - int(rng.integers(0, block_size)))
        anywhere = int(rng.integers(1, (num_blocks + 2) * block_size))
        num_tokens = int(rng.choice([1, block_size, block_size + 1, anywhere]))
        expected = ref_can_allocate(m, num_tokens)
        before = (dict(m.held), m.num_free_blocks)
        got = m.can_allocate(num_tokens)
        assert got == expected, (
            f"admission of {num_tokens} tokens (block_size {block_size}) into {num_blocks} blocks with "
            f"{m.num_free_blocks} free and watermark_blocks {m.watermark_blocks}: expected {expected}, got {got}"
        )
        assert (dict(m.held), m.num_free_blocks) == before, "can_allocate changes nothing"


def _tight_traces():
    """Small traces on tight pools: waiting, watermark rejections, preemptions and truncations."""
    out = []
    for seed, bs in ((1, 4), (2, 16), (3, 4)):
        trace = chat_trace(
            80, seed=seed, max_seq_len=256, mean_prompt=30, mean_output=50, arrival_rate=0.5
        )
        out.append((trace, 40 * bs, bs, 0.1))
    out.append(
        (
            Trace.from_lengths([6, 3, 30, 9], [20, 5, 4, 9], arrival=[0, 0, 1, 2], max_seq_len=40),
            16,
            4,
            0.0,
        )
    )
    out.append(
        (
            Trace.from_lengths([5, 50, 3, 12], [9, 2, 30, 4], arrival=[0, 0, 3, 3], max_seq_len=60),
            48,
            4,
            0.25,
        )
    )
    return out


def _same_run(ref, mine, what: str) -> None:
    assert mine.rejected.tolist() == ref.rejected.tolist(), (
        f"{what}: the requests rejected at arrival (NEVER)"
    )
    for name in ("running", "waiting", "real", "reserved", "internal"):
        a, b = getattr(ref, name), getattr(mine, name)
        assert len(b) == len(a), f"{what}: the run's length in steps"
        step = _first_difference(a, b)
        assert int(b[step]) == int(a[step]), f"{what}: {name} at step {step} of the run"
    assert mine.preemptions == ref.preemptions, f"{what}: preemptions in the whole run"
    assert mine.truncated.tolist() == ref.truncated.tolist(), (
        f"{what}: requests cut short (alone, out of blocks)"
    )


@pytest.mark.exercise("ch01.ex2", points=2)
def test_admission_in_the_simulator(impl):
    ex = impl("ex01_fragmentation")
    manager = _with(ex.PagedManager, grow=ref_grow)
    for k, (trace, pool, bs, wm) in enumerate(_tight_traces()):
        ref = simulate(trace, pool, "paged", bs, wm)
        mine = simulate(trace, pool, "paged", bs, wm, paged_manager=manager)
        _same_run(ref, mine, f"trace {k} (pool {pool} slots, block_size {bs}, watermark {wm})")


# ---- ch01.ex3: grow ------------------------------------------------------------------------------------


@pytest.mark.exercise("ch01.ex3", points=2, all_or_nothing=True)
@pytest.mark.parametrize("block_size", [4, 16])
def test_grow_takes_a_block_only_when_the_last_one_is_full(impl, block_size):
    ex = impl("ex01_fragmentation")
    m = _with(ex.PagedManager, can_allocate=ref_can_allocate)(10, block_size, 0.0)
    m.allocate(7, block_size - 1)
    for tokens in range(block_size, 3 * block_size + 2):
        assert m.grow(7, tokens) == [], "a block is free: nobody is preempted"
        expected = _ceil_blocks(tokens, block_size)
        assert m.held[7] == expected, (
            f"with block_size {block_size}, {tokens} tokens live in {expected} blocks, "
            f"the request holds {m.held[7]}"
        )
        assert m.num_free_blocks == 10 - expected, "every block taken leaves the free count"


@pytest.mark.exercise("ch01.ex3", points=3, all_or_nothing=True)
def test_grow_preempts_the_most_recently_admitted(impl):
    ex = impl("ex01_fragmentation")
    cls = _with(ex.PagedManager, can_allocate=ref_can_allocate)
    m = cls(5, 4, 0.0)
    for req, tokens in (
        (3, 8),
        (1, 3),
        (5, 4),
        (2, 4),
    ):  # admission order 3, 1, 5, 2: the pool is full
        m.allocate(req, tokens)
    assert m.grow(1, 4) == [] and m.held[1] == 1, (
        "the last block of request 1 still has room: nothing happens"
    )
    assert m.grow(3, 9) == [2], "no free block: the request admitted last (2) is preempted"
    assert m.held == {3: 3, 1: 1, 5: 1} and m.num_free_blocks == 0, (
        "the victim's block goes to the grower; the others keep theirs"
    )
    assert m.grow(5, 5) == [5], "the grower is itself the newest: it is preempted and takes nothing"
    assert m.held == {3: 3, 1: 1} and m.num_free_blocks == 1, (
        "the preempted grower's block is free again"
    )
    m.allocate(8, 4)
    assert m.grow(8, 5) == [8], "the newest request preempts itself rather than an older one"
    assert m.grow(1, 5) == [] and m.held == {3: 3, 1: 2} and m.num_free_blocks == 0, (
        "the block it released serves the next grower"
    )
    alone = cls(2, 4, 0.0)
    alone.allocate(0, 8)
    assert alone.grow(0, 9) == [0] and alone.held == {} and alone.num_free_blocks == 2, (
        "alone with no free block: the request preempts itself and releases its blocks"
    )


class _Model:
    """Plain model of the paged manager: running requests as a list in admission order."""

    def __init__(self, num_blocks: int, bs: int):
        self.num_blocks, self.bs, self.running = num_blocks, bs, []  # [req, blocks]

    def free_blocks(self) -> int:
        return self.num_blocks - sum(b for _, b in self.running)

    def grow(self, req: int, tokens: int) -> list[int]:
        entry = next(e for e in self.running if e[0] == req)
        if _ceil_blocks(tokens, self.bs) == entry[1]:
            return []
        victims = []
        while self.free_blocks() == 0:
            victims.append(self.running.pop()[0])
            if victims[-1] == req:
                return victims
        entry[1] += 1
        return victims


@pytest.mark.exercise("ch01.ex3", points=3, all_or_nothing=True)
@pytest.mark.parametrize("block_size", [1, 4])
def test_grow_on_random_histories(impl, block_size):
    ex = impl("ex01_fragmentation")
    cls = _with(ex.PagedManager, can_allocate=ref_can_allocate)
    rng = np.random.default_rng(10 + block_size)
    for history in range(30):
        num_blocks = int(rng.integers(3, 12))
        m, model, tokens, nxt = (
            cls(num_blocks, block_size, 0.0),
            _Model(num_blocks, block_size),
            {},
            0,
        )
        for step in range(80):
            if rng.random() < 0.3 and model.free_blocks() > 0:  # admit a new request
                n = int(rng.integers(1, model.free_blocks() * block_size + 1))
                m.allocate(nxt, n)
                model.running.append([nxt, _ceil_blocks(n, block_size)])
                tokens[nxt], nxt = n, nxt + 1
            elif model.running:  # one running request gains a token
                req = model.running[int(rng.integers(len(model.running)))][0]
                tokens[req] += 1
                expected = model.grow(req, tokens[req])
                got = m.grow(req, tokens[req])
                assert got == expected, (
                    f"history {history}, step {step}: request {req} grows to {tokens[req]} "
                    f"tokens: preempted {expected} expected, got {got}"
                )
            held = {r: b for r, b in model.running}
            assert m.held == held and m.num_free_blocks == model.free_blocks(), (
                f"history {history}, step {step}: blocks held {held} with {model.free_blocks()} free expected, "
                f"got {m.held} with {m.num_free_blocks} free"
            )


@pytest.mark.exercise("ch01.ex3", points=2, all_or_nothing=True)
def test_growth_and_preemption_in_the_simulator(impl):
    ex = impl("ex01_fragmentation")
    manager = _with(ex.PagedManager, can_allocate=ref_can_allocate)
    for k, (trace, pool, bs, wm) in enumerate(_tight_traces()):
        ref = simulate(trace, pool, "paged", bs, wm)
        mine = simulate(trace, pool, "paged", bs, wm, paged_manager=manager)
        _same_run(ref, mine, f"trace {k} (pool {pool} slots, block_size {bs}, watermark {wm})")


# ---- every position of a batch, the inputs left alone, the promise at scale ------------------------------


@pytest.mark.exercise("ch01.ex1", points=2)
def test_slot_kinds_at_every_position_leaves_its_inputs_alone(impl):
    ex = impl("ex01_fragmentation")
    # (tokens, final, held): no waste, all reserved, all internal, a paged tail, a static reservation
    cases = [(1, 1, 1), (4, 9, 9), (5, 5, 8), (17, 20, 32), (3, 40, 512), (16, 16, 16), (9, 12, 10)]
    base = np.array(cases, dtype=np.int64)
    for shift in range(len(cases)):
        rows = np.roll(base, shift, axis=0)
        tokens, final, held = (rows[:, k].copy() for k in range(3))
        kept = tokens.copy(), final.copy(), held.copy()
        got = ex.slot_kinds(tokens, final, held)
        for name, arr, was in zip(("tokens", "final", "held"), (tokens, final, held), kept):
            assert np.array_equal(arr, was), (
                f"slot_kinds changed its input {name} (int64 arrays reach it without a copy): "
                f"{was.tolist()} became {arr.tolist()}"
            )
        for name, g in zip(KINDS, got):
            assert isinstance(g, np.ndarray) and g.dtype == np.int64 and g.shape == tokens.shape, (
                f"{name}: an int64 array shaped like tokens, got {type(g).__name__} "
                f"{getattr(g, 'dtype', '')} {getattr(g, 'shape', '')}"
            )
        for i, (t, f, h) in enumerate(rows.tolist()):
            want = _ref_kinds(t, f, h)
            have = tuple(int(g[i]) for g in got)
            assert have == want, (
                f"request at position {i} of {len(cases)} (tokens {t}, final {f}, held {h}): "
                f"(real, reserved, internal) {have}, expected {want}"
            )


@pytest.mark.exercise("ch01.ex2", points=2)
@pytest.mark.parametrize("block_size", [1, 4])
def test_can_allocate_at_every_size_and_free_count(impl, block_size):
    # every request size from 1 token to past the pool, against every fill of small pools
    ex = impl("ex01_fragmentation")
    for num_blocks in range(1, 7):
        for watermark in (0.0, 0.2, 0.5):
            for used in range(num_blocks + 1):
                m = ex.PagedManager(num_blocks, block_size, watermark)
                if used:
                    m.allocate(100, used * block_size)
                before = (dict(m.held), m.num_free_blocks)
                for num_tokens in range(1, (num_blocks + 2) * block_size + 1):
                    expected = ref_can_allocate(m, num_tokens)
                    got = m.can_allocate(num_tokens)
                    assert got == expected, (
                        f"{num_tokens} tokens (block_size {block_size}), {num_blocks} blocks of which "
                        f"{m.num_free_blocks} free, watermark_blocks {m.watermark_blocks}: expected "
                        f"{expected}, got {got}"
                    )
                assert (dict(m.held), m.num_free_blocks) == before, "can_allocate changes nothing"


@pytest.mark.exercise("ch01.ex3", points=2, all_or_nothing=True)
@pytest.mark.timeout(60)
def test_preemption_time_does_not_grow_with_the_running_requests(impl):
    # The newest request is the last key of held: finding it costs the same with 100,000 running requests as
    # with 1,000 (compare the time per preemption at both sizes; absolute times mean nothing on a busy machine).
    import time

    ex = impl("ex01_fragmentation")
    cls = _with(ex.PagedManager, can_allocate=ref_can_allocate)
    ops, small, large = 300, 1_000, 100_000

    def seconds(n: int) -> float:
        best = float("inf")
        for _ in range(3):
            m = cls(n, 1, 0.0)
            for req in range(n):  # the pool is full: n requests of one block each
                m.allocate(req, 1)
            start = time.perf_counter()
            for k in range(ops):  # request 0 grows; each step preempts the newest request
                victims = m.grow(0, k + 2)
                assert victims == [n - 1 - k], (
                    f"request 0 grows: the newest, {n - 1 - k}, is preempted"
                )
            best = min(best, time.perf_counter() - start)
        return best

    ratio = float("inf")
    for _ in range(3):
        ratio = min(ratio, seconds(large) / max(seconds(small), 1e-9))
        if ratio < 12:
            break
    assert ratio < 12, (
        f"a preemption among {large:,} running requests takes {ratio:.0f}x as long as among {small:,}: "
        "finding the newest walks held (list(held), sorted, max); next(reversed(held)) is constant time"
    )
