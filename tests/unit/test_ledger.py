"""The seed claims ledger (reference/ledger.py): each measurement's exact value on a fixed input, and a full table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paged_course.reference import ledger
from paged_course.reference.memory import KNOWN_MODELS
from paged_course.sim.workload import Trace, chat_trace


@pytest.fixture(scope="module")
def measured() -> dict:
    return ledger.measure_all()


def test_every_claim_and_error_has_a_row(measured):
    assert list(ledger.CLAIMS) == [f"C{i}" for i in range(1, 8)] + [
        f"E{i}" for i in range(1, 12)
    ], "the ledger must list C1-C7 and E1-E11 in order"
    rows = ledger.build_rows(measured)
    assert ledger.missing_rows(rows) == [], (
        "every claim needs a measured value or a sourced correction"
    )
    table = ledger.ledger_markdown(rows)
    assert table.count("\n") == 2 + 18 - 1, "header, separator and 18 rows"
    assert "no GPU in this run" in table, (
        "without kernel JSON, E2 must say so rather than invent a number"
    )
    assert "corrected online softmax < 1e-06" in table, (
        "rounding-level errors print as a bound (CPU-independent)"
    )


def test_memory_numbers_c4_e7_e8():
    mem = ledger.measure_memory()
    assert mem["per_sequence"]["llama-2-7b"] == 2**30, (
        "Llama-2-7B: 0.5 MiB per token x 2048 = 1 GiB"
    )
    assert mem["per_sequence"]["llama-2-13b"] == 1_677_721_600
    assert mem["per_sequence"]["llama-2-70b"] == 671_088_640, "Llama-2-70B has 8 KV heads (GQA)"
    assert mem["block_bytes"] == 8 * 2**20 and mem["seed_block_bytes"] // mem["block_bytes"] == 128


def test_prefix_rows_use_the_prefix_benchmark(measured):
    # C5/E4 come from paged_course.bench.prefix.shared_prompt_savings: 100 prompts = system prompt + 50-token
    # question, block 16; the system prompt's full blocks are held once with caching.
    rows = {r["system_len"]: r for r in measured["prefix"]}
    assert sorted(rows) == list(ledger.PREFIX_LENS)
    for n, r in rows.items():
        assert r["blocks_without"] == 100 * -(-(n + 50) // 16)
        assert r["blocks_with"] == n // 16 + 100 * (-(-(n + 50) // 16) - n // 16)
    assert rows[9]["block_saving"] == 0.0, (
        "E4: a 9-token prefix fills no block of 16 and saves nothing"
    )


def test_chained_keys_and_cow_and_block_tables():
    keys = ledger.measure_chained_keys()
    assert keys["shared_blocks"] == 2 and keys["whole_prompt_hash_shares"] == 0
    assert keys["same_block_other_prefix"] is False, (
        "equal tokens after another prefix must get another key"
    )
    assert ledger.measure_cow(20) == 1, "fork + append into a shared partial block copies it once"
    assert ledger.measure_cow(32) == 0, "a full last block is never written again: no copy"
    assert ledger.measure_block_tables(3, 4)["block_tables"] == 3, (
        "one block table per sequence, all layers"
    )


def test_watermark_admission_answers():
    trace = chat_trace(300, seed=0, max_seq_len=2048)
    r = ledger.measure_watermark(trace, pool_slots=8192, watermarks=(0.0, 0.05))
    assert r["free_blocks"] == 12 and r["admission"] == {10: "later", 7: "ok", 96: "never"}
    assert r["preemptions"][0.05] <= r["preemptions"][0.0], (
        "a watermark must not add preemptions here"
    )


def test_online_softmax_seed_sketch_is_wrong_and_ours_exact():
    r = ledger.measure_online_softmax()
    assert r["blockwise_err"] < 1e-5, "the corrected online softmax equals exact attention"
    assert r["seed_err"] > 0.05, "the seed's normalization by output.sum() is not attention"
    q, k, v = (
        torch.ones(4, dtype=torch.float64),
        torch.zeros(8, 4, dtype=torch.float64),
        torch.eye(8, 4).double(),
    )
    # equal scores: exact attention is the mean of v's rows, [0.125]*4; the sketch divides by its own sum
    assert torch.allclose(
        ledger.seed_online_softmax(q, k, v, 3), torch.full((4,), 0.25, dtype=torch.float64)
    )


def test_block_size_study_on_a_hand_trace():
    trace = Trace.from_lengths([10, 10], [7, 7])  # final length 17 each, both fit at once
    rows = ledger.block_size_study(trace, pool_slots=1024, block_sizes=(1, 16, 32))
    util = {r["block_size"]: r["utilization"] for r in rows}
    assert util[1] == 1.0, "block 1: no slack"
    assert [r["steps"] for r in rows] == [8, 8, 8] and all(r["preemptions"] == 0 for r in rows)
    assert util[32] < util[16] < 1.0, "a larger block leaves more of its last block empty"


def test_capacity_at_scale_static_and_paged():
    spec = KNOWN_MODELS["llama-2-7b"]  # 0.5 MiB per token, 8 MiB per 16-token block
    trace = Trace.from_lengths(
        [100] * 100, [28] * 100, max_seq_len=4096
    )  # 128 tokens = 8 blocks each
    cap = ledger.capacity_at_scale(trace, spec, budget_bytes=4 * 2**30 + 10, block_size=16)
    assert cap["static"] == 2, "4 GiB / (4096 tokens x 0.5 MiB)"
    assert cap["budget_blocks"] == 512 and cap["paged_mean"] == 64 == cap["paged_p5"], (
        "512 blocks / 8 per request"
    )
    assert cap["paged_token_share"] == 1.0 and cap["static_token_share"] == pytest.approx(
        128 / 4096
    )
    with pytest.raises(ValueError, match="trace too short"):
        ledger.capacity_at_scale(
            Trace.from_lengths([100] * 10, [28] * 10, max_seq_len=4096), spec, 4 * 2**30
        )


def test_capacity_is_vectorized_for_a_million_requests():
    trace = chat_trace(1_000_000, seed=0, max_seq_len=4096)
    cap = ledger.capacity_at_scale(trace, KNOWN_MODELS["llama-2-7b"], 60 * 2**30)
    assert cap["static"] == 30 and 200 < cap["paged_mean"] < 400
    assert cap["paged_p5"] <= cap["paged_mean"] <= cap["paged_p95"]
    assert np.isclose(cap["mean_final_len"], trace.final_len.mean())


def test_throughput_and_kernel_rows_come_from_the_benchmarks(measured):
    measured = dict(measured)
    measured["concurrency"] = [
        {"concurrency": 1, "paged_tok_s": 10.0, "hf_tok_s": 12.0, "same_tokens": True},
        {"concurrency": 64, "paged_tok_s": 200.0, "hf_tok_s": 90.0, "same_tokens": True},
    ]
    measured["device"] = "cpu"
    measured["kernel"] = {
        "mode": "gpu",
        "device": "H100",
        "sweep": [{"paged_over_contiguous": 1.031}, {"paged_over_contiguous": 1.012}],
    }
    rows = {r.claim.id: r for r in ledger.build_rows(measured)}
    assert "1: 10/12, 64: 200/90" in rows["C6"].measured and "same tokens" in rows["C6"].measured
    assert rows["C6"].verdict == "rises with concurrency; ours ahead at 64"
    assert "up to 1.03 on H100" in rows["E2"].measured, (
        "E2 reports the worst paged/contiguous ratio of the GPU run"
    )
    measured["concurrency"][0].pop("same_tokens")
    assert "same tokens" not in ledger.build_rows(measured)[5].measured, (
        "no token check, no 'same tokens' claim"
    )


def test_e2_names_the_bandwidth_of_the_kernel_it_was_measured_on(measured):
    def row(batch, context, block, ratio, pct):
        return {
            "batch": batch,
            "context": context,
            "block_size": block,
            "paged_over_contiguous": ratio,
            "pct_peak": pct,
        }

    sweep = [
        row(1, 4096, 16, 1.002, 0.4),
        row(64, 4096, 8, 1.024, 12.2),
        row(64, 4096, 16, 1.0, 11.5),
        row(64, 8192, 16, 1.0, 11.52),
    ]
    assert ledger.bandwidth_row(sweep) is sweep[2], "largest batch, context 4,096, block 16"
    assert ledger.bandwidth_row(sweep[:2]) is sweep[1], (
        "without that row: the one nearest the roofline"
    )
    assert ledger.bandwidth_row([{"paged_over_contiguous": 1.0}]) is None, (
        "no pct_peak, no bandwidth claim"
    )
    e2 = {
        r.claim.id: r
        for r in ledger.build_rows(
            {**measured, "kernel": {"mode": "gpu", "device": "H200", "sweep": sweep}}
        )
    }["E2"]
    assert (
        "up to 1.02 on H200, in the teaching kernel at 11.5% of peak HBM bandwidth (batch 64, context "
        "4096, block 16)" in e2.measured
    ), "a run without the lab's steps is the teaching kernel's, and the row says so"
    assert "latency-bound" in e2.verdict and "needs a GPU run" in e2.verdict, (
        "the overhead's context is stated"
    )
    tuned = {"mode": "gpu", "device": "H200", "sweep": sweep, "steps": []}
    e2 = {r.claim.id: r for r in ledger.build_rows({**measured, "kernel": tuned})}["E2"]
    assert (
        "in the tuned kernel at 11.5%" in e2.measured
        and e2.verdict == "measured on the tuned kernel"
    )


def test_c2_reports_the_seeds_definitions(measured):
    c2 = {r.claim.id: r for r in ledger.build_rows(measured)}["C2"]
    f = measured["fragmentation"]["contiguous"]
    unused = f"{f['reserved_share'] + f['internal_share']:.0%}"
    assert (
        "internal (all unused reservation) " in c2.measured
        and f"/ {unused}, external" in c2.measured
    ), (
        "the seed's internal waste is the whole unused reservation (reserved + internal in the simulator)"
    )
    assert "seed's definitions" in c2.verdict
