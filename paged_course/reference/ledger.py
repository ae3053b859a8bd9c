"""The seed claims ledger: every claim (C1-C7) and error (E1-E11) of the two articles the course checks
(``docs/sources.md``: the fragmentation article and the implementation article), measured.

``CLAIMS`` holds, per id, what the article states (and where), the chapter that measures it and the source
of the correct statement (paper section, or vLLM file with the release it was read in). The
``measure_*`` functions (``ledger_measure``, re-exported here) compute the numbers from this package at
sizes that run in a second or two on a laptop CPU; chapter 08 calls them, fills in the rows that need
the engine or a GPU, and prints the table with ``ledger_markdown``.

    python -m paged_course.reference.ledger [--bench DIR]  # the table as Markdown; DIR: JSON of `python -m paged bench`

Paper: Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
SOSP 2023 (arXiv 2309.06180). vLLM paths are from 0.10.2, the last release holding both the v0 and the
v1 engine (0.11.0 removed v0's ``vllm/core/`` and its worker: ``vllm/worker/`` keeps only
``worker_base.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_course.reference.ledger_measure import (
    PREFIX_LENS,
    block_size_study,
    capacity_at_scale,
    measure_all,
    measure_block_tables,
    measure_chained_keys,
    measure_cow,
    measure_fragmentation,
    measure_memory,
    measure_online_softmax,
    measure_watermark,
    seed_online_softmax,
)


@dataclass(frozen=True)
class Claim:
    """One ledger row's fixed part: ``seed`` (the seed's statement), ``chapter`` ("01".."08"), ``source``."""

    id: str
    seed: str
    chapter: str
    source: str


_ROWS = [
    (
        "C1",
        "before vLLM 20-40% of KV memory holds tokens; vLLM 80-96% (fragmentation article §1, §4.1)",
        "01",
        "paper §1, Fig. 2 (20.4-38.2%)",
    ),
    (
        "C2",
        "waste split: internal 40-60%, external 10-20%, reserved 5-10% (fragmentation article §1.2)",
        "01",
        "paper §3 (kinds, no split); fragmentation article §1.2 (its definitions)",
    ),
    (
        "C3",
        "paged waste per sequence <= block_size - 1 slots (fragmentation article §3.2)",
        "01",
        "paper §4.3",
    ),
    (
        "C4",
        "KV per 2048-token sequence: Llama-7B ~1.1 GB, 13B ~1.7 GB (fragmentation article §4.2)",
        "01",
        "config.json; vLLM v0 vllm/worker/cache_engine.py (0.10.2)",
    ),
    (
        "C5",
        "100 requests sharing a system prompt save 60-90% (500-2000-token prompts; implementation article §3.2)",
        "05",
        "paper §6.4, §4.4",
    ),
    (
        "C6",
        "throughput rises with concurrency (1.14x at 1; baseline OOM at 32+; fragmentation article §4.3)",
        "07/08",
        "the article's A100 table, unsourced",
    ),
    (
        "C7",
        "block size 16 is the best trade-off (fragmentation article §5)",
        "08",
        "paper §7.2, Fig. 18b",
    ),
    (
        "E1",
        "online softmax: prev_max undefined; output / output.sum() (fragmentation article §3.4)",
        "04",
        "Milakov & Gimelshein 2018; paper §4.1",
    ),
    (
        "E2",
        "paged kernel only 2-5% slower than contiguous (implementation article §3.1)",
        "04/08",
        "paper §7.1, Fig. 18a (20-26%)",
    ),
    (
        "E3",
        "one MD5 over the whole system prompt is the cache key (implementation article §3.2)",
        "05",
        "vLLM v1 vllm/v1/core/kv_cache_utils.py (0.8.5, 0.10.2)",
    ),
    (
        "E4",
        "9-token system prompt, block 16, 'saves 33%'; '~100x' prompt speed-up (implementation article §3.2)",
        "05",
        "paper §4.4; vLLM v1 vllm/v1/core/block_pool.py (0.10.2)",
    ),
    (
        "E5",
        "COW happens in variable-length attention / speculative decoding (implementation article §3.3)",
        "05",
        "vLLM v0 vllm/core/block/naive_block.py (cow_block_if_not_appendable, 0.10.2), the fork in 0.6.3; paper §4.4",
    ),
    (
        "E6",
        "each layer has its own block table; file paths (implementation article §3.4)",
        "03",
        "vLLM v0 vllm/worker/cache_engine.py, vllm/attention/ (0.10.2)",
    ),
    (
        "E7",
        "Llama-70B needs ~5.2 GB per 2048-token sequence (fragmentation article §4.2)",
        "01",
        "Llama-2-70B config.json (8 KV heads)",
    ),
    (
        "E8",
        "KV bytes = blocks x block_size x 2 x 4096 x 32 x 128 x 2 (fragmentation article §7.3)",
        "01",
        "vLLM v0 vllm/worker/cache_engine.py (0.10.2)",
    ),
    (
        "E9",
        "watermark: falling below it triggers preemption (fragmentation article §3.2)",
        "02/06",
        "vLLM v0 vllm/core/block_manager.py (SelfAttnBlockSpaceManager.can_allocate, 0.10.2)",
    ),
    (
        "E10",
        "16 is best 'because of shared memory' (fragmentation article §5)",
        "08",
        "paper §7.2",
    ),
    (
        "E11",
        "A100 numbers (1,200 vs 5,800 tokens/s) without source (fragmentation article §4.1, §4.3)",
        "07/08",
        "fragmentation article §4.3 (no source given)",
    ),
]
CLAIMS: dict[str, Claim] = {row[0]: Claim(*row) for row in _ROWS}


@dataclass
class Row:
    """A filled ledger row: the claim, the measured value (or sourced correction) and a verdict."""

    claim: Claim
    measured: str
    verdict: str  # "holds", "partly", "corrected", "sourced (no GPU here)", ...


def ledger_markdown(rows: list[Row]) -> str:
    """The ledger as a Markdown table (``|`` in cells escaped)."""

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = [
        "| # | seed says | measured here | verdict | chapter | source |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.claim.id} | {cell(r.claim.seed)} | {cell(r.measured)} | {cell(r.verdict)} | "
        f"{r.claim.chapter} | {cell(r.claim.source)} |"
        for r in rows
    ]
    return "\n".join(lines)


def missing_rows(rows: list[Row]) -> list[str]:
    """Ids of ``CLAIMS`` without a row, or whose row has an empty measured value."""
    filled = {r.claim.id for r in rows if r.measured.strip()}
    return [cid for cid in CLAIMS if cid not in filled]


__all__ = [
    "CLAIMS",
    "Claim",
    "PREFIX_LENS",
    "Row",
    "bandwidth_row",
    "block_size_study",
    "build_rows",
    "capacity_at_scale",
    "ledger_markdown",
    "measure_all",
    "measure_block_tables",
    "measure_chained_keys",
    "measure_cow",
    "measure_fragmentation",
    "measure_memory",
    "measure_online_softmax",
    "measure_watermark",
    "missing_rows",
    "seed_online_softmax",
]


def _bs_summary(rows: list[dict]) -> str:
    ref = next(r["tokens_per_step"] for r in rows if r["block_size"] == 16)
    return ", ".join(
        f"{r['block_size']}: {r['utilization']:.0%}/{r['tokens_per_step'] / ref:.2f}x"
        for r in rows
        if r["block_size"] in (1, 16, 64, 128, 256)
    )


def _below(value: float, bound: float) -> str:
    """``"< bound"`` for rounding-level values (their last digit differs between CPUs), else the value."""
    return f"< {bound:.0e}" if value < bound else f"{value:.1e}"


def bandwidth_row(sweep: list[dict]) -> dict | None:
    """The ``bench kernel`` sweep row that gives the kernel's bandwidth: largest batch, context 4,096,
    block 16 (else the row nearest the roofline); None when the rows carry no ``pct_peak``."""
    rows = [r for r in sweep if r.get("pct_peak") is not None]
    if not rows:
        return None
    big = max(r["batch"] for r in rows)
    main = [r for r in rows if r["batch"] == big and r["context"] == 4096 and r["block_size"] == 16]
    return main[0] if main else max(rows, key=lambda r: r["pct_peak"])


def build_rows(m: dict) -> list[Row]:
    """One ``Row`` per claim from ``measure_all()`` output plus optional ``m["concurrency"]`` (rows of
    ``paged_course.bench.engine.concurrency_sweep``, each may carry ``same_tokens``), ``m["device"]`` (where they
    ran) and ``m["kernel"]`` (the ``results`` of a GPU ``bench kernel`` run). Missing optional parts
    become sourced corrections."""
    f, mem, pre = m["fragmentation"], m["memory"], {p["system_len"]: p for p in m["prefix"]}
    gb = {k: v / 1e9 for k, v in mem["per_sequence"].items()}
    share = {k: f[k]["token_share"] for k in ("static", "contiguous", "paged")}
    split = {k: f[k] for k in ("static", "contiguous")}
    wm, sm, bt, ch = m["watermark"], m["softmax"], m["block_tables"], m["chained"]
    bs = m["block_size"]
    short = {r["block_size"]: r["tokens_per_step"] for r in bs["short"]}
    loss = 1 - short[max(short)] / short[16]
    rows = {
        "C1": (
            f"token share: static {share['static']:.1%}, contiguous {share['contiguous']:.1%}, "
            f"paged {share['paged']:.1%}",
            "holds (paged above the seed's 80-96%)",
        ),
        "C2": (
            "share of pool, static / contiguous, seed's kinds: internal (all unused reservation) "
            + " / ".join(f"{s['reserved_share'] + s['internal_share']:.0%}" for s in split.values())
            + ", external "
            + " / ".join(f"{s['external_share']:.0%}" for s in split.values())
            + ", beam-search copies none in the trace; paper's kinds: reserved "
            + " / ".join(f"{s['reserved_share']:.0%}" for s in split.values())
            + ", internal "
            + " / ".join(f"{s['internal_share']:.0%}" for s in split.values()),
            "holds for contiguous reservation with the seed's definitions; trace-dependent",
        ),
        "C3": (f"largest empty tail {f['paged_max_tail']} slots (block 16)", "holds"),
        "C4": (f"Llama-2-7B {gb['llama-2-7b']:.2f} GB, 13B {gb['llama-2-13b']:.2f} GB", "holds"),
        "C5": (
            "block saving "
            + ", ".join(f"{n}: {pre[n]['block_saving']:.0%}" for n in (500, 1000, 2000))
            + f" (100 requests, + {m['prefix'][0]['question_len']}-token question each)",
            "holds (the shared share of each prompt)",
        ),
        "E1": (
            f"relative error: corrected online softmax {_below(sm['blockwise_err'], 1e-6)}, "
            f"seed's sketch {sm['seed_err']:.2f}",
            "corrected",
        ),
        "E3": (
            f"chained per-block keys share {ch['shared_tokens']} of 40 common tokens; whole-prompt hash shares "
            f"{ch['whole_prompt_hash_shares']}",
            "corrected",
        ),
        "E4": (
            f"9-token prefix saves {pre[9]['block_saving']:.0%} of blocks; prefill speed-up bound "
            f"{pre[1000]['speedup_bound']:.1f}x at 1000 tokens",
            "corrected",
        ),
        "E5": (
            f"COW copies after fork + append: partial last block {m['cow'][20]}, full last block {m['cow'][32]}",
            "corrected",
        ),
        "E6": (
            f"{bt['block_tables']} block tables for {bt['sequences']} sequences x {bt['layers']} layers",
            "corrected",
        ),
        "E7": (
            f"Llama-2-70B (GQA, 8 KV heads) {gb['llama-2-70b']:.2f} GB; without GQA {gb['70b-without-gqa']:.2f} GB",
            "corrected",
        ),
        "E8": (
            f"{mem['block_bytes'] / 2**20:.0f} MiB per 16-token block; seed formula "
            f"{mem['seed_block_bytes'] // mem['block_bytes']}x too large",
            "corrected",
        ),
        "E9": (
            f"{wm['free_blocks']} free of 100 blocks, watermark 5: prompts of 10 / 7 / 96 blocks get "
            + " / ".join(wm["admission"][n].upper() for n in (10, 7, 96))
            + "; simulated preemptions by watermark "
            + ", ".join(f"{k}: {v}" for k, v in wm["preemptions"].items()),
            "corrected (it prevents preemption)",
        ),
        "C7": (
            "util/throughput vs 16, chat: "
            + _bs_summary(bs["chat"])
            + "; short: "
            + _bs_summary(bs["short"]),
            "partly: 16-128 alike on chat, large blocks much worse on short requests; below 16 only the "
            "kernel (GPU) can tell",
        ),
        "E10": (
            f"block 256 loses {loss:.0%} of simulated throughput vs 16 on the short trace; blocks below 16 "
            "lose nothing in memory, so their cost is kernel time (GPU)",
            "corrected (paper §7.2: kernel parallelism vs fragmentation and sharing)",
        ),
    }
    conc, where = m.get("concurrency"), m.get("device", "cpu")
    if conc:
        same = all(
            r.get("same_tokens") is True for r in conc
        )  # only when the sweep compared tokens
        pairs = ", ".join(
            f"{r['concurrency']}: {r['paged_tok_s']:.0f}/{r['hf_tok_s']:.0f}" for r in conc
        )
        rises = conc[-1]["paged_tok_s"] > conc[0]["paged_tok_s"]
        ahead = [r["concurrency"] for r in conc if r["paged_tok_s"] > r["hf_tok_s"]]
        rows["C6"] = (
            f"tok/s paged/generate by concurrency {pairs} ({where}, 4-layer model"
            f"{', same tokens' if same else ''})",
            ("rises with concurrency" if rises else "does not rise here")
            + (
                f"; ours ahead at {', '.join(map(str, ahead))}"
                if ahead
                else "; generate ahead throughout"
            ),
        )
        rows["E11"] = (
            f"own table on {where} (C6 row); the seed's A100 figures are neither sourced nor reproduced",
            "corrected (own measurements)",
        )
    else:
        rows["C6"] = (
            "not run (needs the engine benchmark)",
            "sourced: paper §6.2, 2-4x at equal latency",
        )
        rows["E11"] = ("not run; the seed's A100 figures have no source", "sourced")
    kernel = m.get("kernel")
    if kernel and kernel.get("mode") == "gpu":
        worst = max(r["paged_over_contiguous"] for r in kernel["sweep"])
        bw = bandwidth_row(kernel["sweep"])
        which = "the teaching kernel" if "steps" not in kernel else "the tuned kernel"
        where = (
            (
                f", in {which} at {bw['pct_peak']:.1f}% of peak HBM bandwidth (batch {bw['batch']}, "
                f"context {bw['context']}, block {bw['block_size']})"
            )
            if bw
            else f", in {which}"
        )
        rows["E2"] = (
            f"paged / contiguous kernel time up to {worst:.2f} on {kernel['device']}{where}",
            (
                "measured on a latency-bound kernel: says little about paging at the bandwidth roofline "
                "(the tuned kernel's figure needs a GPU run of it)"
                if "steps" not in kernel
                else "measured on the tuned kernel"
            ),
        )
    else:
        rows["E2"] = (
            "no GPU in this run; paper: 20-26% higher attention-kernel latency than "
            "FasterTransformer",
            "sourced correction (paper §7.1)",
        )
    return [Row(CLAIMS[cid], *rows[cid]) for cid in CLAIMS]


def main(argv: list[str] | None = None) -> int:
    """``python -m paged_course.reference.ledger [--bench DIR] [--kernel FILE]``: print the ledger as Markdown (DIR: a
    ``bench`` JSON folder; FILE: a GPU run's ``kernel.json``, e.g. ``docs/gpu/h200-2026-11-30/kernel.json``,
    which wins over DIR's)."""
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="python -m paged_course.reference.ledger", description=main.__doc__
    )
    parser.add_argument(
        "--bench",
        type=Path,
        help="folder with engine.json / kernel.json from python -m paged bench",
    )
    parser.add_argument(
        "--kernel", type=Path, help="a GPU run's kernel.json for the E2 row (wins over --bench's)"
    )
    args = parser.parse_args(argv)
    measured = measure_all()
    for name in ("engine", "kernel"):
        path = args.bench / f"{name}.json" if args.bench else None
        if path is not None and path.exists():
            record = json.loads(path.read_text())
            if name == "engine":
                measured["concurrency"] = record["results"].get("concurrency")
                measured["device"] = record["environment"]["device"]
            else:
                measured["kernel"] = record["results"]
    if args.kernel is not None:
        measured["kernel"] = json.loads(args.kernel.read_text())["results"]
    print(ledger_markdown(build_rows(measured)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
