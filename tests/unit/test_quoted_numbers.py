"""Every number that README.md and docs/results.md quote (and docs/instructor.md's GPU figures) is the one
its committed source holds.

The sources are committed files, never a fresh (and noisy) measurement: the GPU run in ``docs/gpu/``
(``kernel.json``, ``engine.json``, ``demo.log``), the CPU benchmark run in ``docs/cpu/`` (``python -m paged
bench ... --out``), and the executed chapters' outputs (``chapters/*.ipynb``, which nbval checks against the
code). Each check reads the value from its source, formats it the way the document does, and looks for it on
the document's line that carries an anchor phrase, so a changed result, a re-run benchmark or an edited
sentence that no longer matches fails here with both numbers.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "docs" / "gpu" / "h200-2026-11-30"
CPU = ROOT / "docs" / "cpu" / "xeon-2vcpu-2026-12-02"
DOCS = {
    "README.md": ROOT / "README.md",
    "docs/results.md": ROOT / "docs" / "results.md",
    "docs/instructor.md": ROOT / "docs" / "instructor.md",
}


@cache
def text(doc: str) -> str:
    return DOCS[doc].read_text()


def line(doc: str, anchor: str) -> str:
    """The one line (a table row, a bullet, a sentence's line) of ``doc`` that holds ``anchor``."""
    found = [ln for ln in text(doc).splitlines() if anchor in ln]
    assert len(found) == 1, (
        f"{doc}: {len(found)} lines hold {anchor!r}, the check needs exactly one"
    )
    return found[0]


def paragraph(doc: str, anchor: str) -> str:
    """The paragraph or bullet of ``doc`` (lines up to a blank line or the next bullet) that holds ``anchor``."""
    blocks = re.split(r"\n\s*\n|\n(?=- )", text(doc))
    found = [" ".join(b.split()) for b in blocks if anchor in " ".join(b.split())]
    assert len(found) == 1, f"{doc}: {len(found)} paragraphs hold {anchor!r}"
    return found[0]


def quotes(where: str, doc: str, *values: str) -> None:
    missing = [v for v in values if v not in where]
    assert not missing, (
        f"{doc} no longer quotes its source: {missing} not found in:\n  {where}\n"
        "(update the document from the committed result, or the result's source)"
    )


@cache
def gpu(name: str) -> dict:
    return json.loads((GPU / f"{name}.json").read_text())["results"]


@cache
def cpu(name: str) -> dict:
    return json.loads((CPU / f"{name}.json").read_text())["results"]


def best_cpu_seconds(system: dict) -> float:
    """CPU seconds of a system's best (fastest) timed call."""
    return system["cpu_seconds"][system["runs"].index(min(system["runs"]))]


@cache
def outputs(chapter: str) -> str:
    """The text outputs of an executed chapter notebook, joined."""
    (path,) = (ROOT / "chapters").glob(f"{chapter}_*.ipynb")
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("text") or out.get("data", {}).get("text/markdown") or ""
            parts.append("".join(data) if isinstance(data, list) else data)
    return "\n".join(parts)


def output_number(chapter: str, pattern: str) -> str:
    """The first group of ``pattern`` in the chapter's outputs."""
    m = re.search(pattern, outputs(chapter))
    assert m is not None, f"chapter {chapter}'s outputs no longer match {pattern!r}"
    return m.group(1)


# ---------------------------------------------------------------------------- the committed GPU run
def test_the_kernel_numbers_are_the_h200_runs():
    sweep = gpu("kernel")["sweep"]
    ratios = [r["paged_over_contiguous"] for r in sweep]
    span = f"{min(ratios):.3f}-{max(ratios):.3f}x"
    at = {(r["batch"], r["context"], r["block_size"]): r for r in sweep}
    row = at[64, 4096, 16]
    pct = f"{row['pct_peak']:.1f}%"
    sdpa = row["paged_ms"] / row["peers_ms"]["sdpa"]
    split = gpu("kernel")["split_k"]
    wins = f"{sum(r['speedup_best_vs_single'] > 1 for r in split)}/{len(split)}"
    readme = line("README.md", "| Triton decode kernel on an H200")
    quotes(readme, "README.md", span, pct, f"SDPA ~{sdpa:.0f}x faster", f"wins {wins} configs")
    quotes(
        paragraph("docs/results.md", "**Paging overhead (E2)**"),
        "docs/results.md",
        span,
        f"at most {100 * (max(ratios) - 1):.1f}%",
    )
    bandwidth = paragraph("docs/results.md", "**Bandwidth**")
    quotes(
        bandwidth,
        "docs/results.md",
        f"{pct} of the H200's peak HBM bandwidth at batch 64, context 4,096",
        f"{row['paged_gbps']:.0f} GB/s at block 16",
        f"{at[64, 4096, 8]['paged_gbps']:.0f} GB/s at block 8",
        f"{1e3 * row['peers_ms']['sdpa']:.0f} us where ours took {1e3 * row['paged_ms']:,.0f} us",
    )
    best = max(split, key=lambda r: r["speedup_best_vs_single"])
    quotes(
        paragraph("docs/results.md", "**Split-K**"),
        "docs/results.md",
        f"{wins.replace('/', ' of ')} configs",
        f"up to {best['speedup_best_vs_single']:.1f}x at batch {best['batch']}",
        f"context {best['context']:,} ({best['best_splits']} splits)",
    )


def test_the_block_size_ratios_are_the_h200_runs():
    t = {(r["batch"], r["context"], r["block_size"]): r["paged_ms"] for r in gpu("kernel")["sweep"]}

    def span(batches, block):
        got = [t[b, c, block] / t[b, c, 16] for b in batches for c in (1024, 4096, 8192)]
        return f"{min(got):.2f}-{max(got):.2f}x"

    quotes(
        paragraph("docs/results.md", "**Block size**"),
        "docs/results.md",
        f"block 8 takes {span((1, 8), 8)} the time of block 16",
        f"block 32 {span((1, 8), 32)}",
        f"block 32 takes {span((32, 64), 32)}",
    )


def test_the_engine_numbers_are_the_h200_runs():
    engine = gpu("engine")
    sweep = {r["concurrency"]: r["paged_tok_s"] / r["hf_tok_s"] for r in engine["concurrency"]}
    demo = re.search(
        r"paged engine throughput (\d+\.\d+)x of it", (GPU / "demo.log").read_text()
    ).group(1)
    readme = line("README.md", "| engine on an H200")
    quotes(
        readme,
        "README.md",
        f"{engine['ratio_vs_static']:.2f}x / {demo}x",
        f"{sweep[16]:.2f}x / {sweep[64]:.2f}x / {sweep[128]:.2f}x",
    )
    results = paragraph("docs/results.md", "**Engine** (`bench engine`")
    ov = engine["overhead"]
    quotes(
        results,
        "docs/results.md",
        f"paged {engine['paged']['tok_s']:,.0f} tok/s vs static `generate` "
        f"{engine['static_generate']['tok_s']:,.0f} ({engine['ratio_vs_static']:.2f}x)",
        f"{ov['overhead_share']:.1%} at {ov['num_seqs']} sequences",
        f"{1e3 * (ov['wall_seconds'] - ov['phases']['forward']) / ov['steps']:.1f} ms per step against a "
        f"{1e3 * ov['phases']['forward'] / ov['steps']:.1f} ms forward",
        f"({sweep[1]:.2f}x, {sweep[2]:.2f}x)",
        f"ahead at 4 and 8 ({sweep[4]:.2f}x)",
        f"{sweep[16]:.2f}x at 16, {sweep[64]:.2f}x at 64, {sweep[128]:.2f}x at 128",
        f"Demo workload: {demo}x",
    )
    assert f"{sweep[4]:.2f}" == f"{sweep[8]:.2f}", "the text quotes one ratio for 4 and 8 requests"
    guide = paragraph("docs/instructor.md", "**08 · Measuring it.**")
    sweep_kernel = gpu("kernel")["sweep"]
    worst = max(r["paged_over_contiguous"] for r in sweep_kernel)
    at = {(r["batch"], r["context"], r["block_size"]): r for r in sweep_kernel}
    quotes(
        guide,
        "docs/instructor.md",
        f"ahead at 4 and 8 ({sweep[4]:.2f}x)",
        f"{sweep[128]:.2f}x at 128",
        f"at most {100 * (worst - 1):.1f}% in the teaching kernel",
        f"{at[64, 4096, 16]['pct_peak']:.1f}% of HBM bandwidth",
    )


# ---------------------------------------------------------------------------- chapter outputs
def test_the_real_token_shares_are_chapter_01s():
    shares = [
        output_number("01", rf"{kind}\s+real-token share (\d+\.\d)%")
        for kind in ("static", "contiguous", "paged")
    ]
    readme = line("README.md", "| KV memory holding real tokens")
    quotes(readme, "README.md", " / ".join(f"{s}%" for s in shares))


def test_the_capacity_at_scale_is_chapter_08s():
    static = output_number("08", r"static \(4096 slots each\): (\d+) requests at once")
    paged = float(output_number("08", r"paged: (\d+\.\d) requests at once on average"))
    ratio = output_number("08", r"paged / static: (\d+\.\dx)")
    readme = line("README.md", "| Llama-2-7B requests at once on an 80 GB GPU")
    quotes(readme, "README.md", f"{static} vs {paged:.0f} ({ratio})")
    capacity = paragraph("docs/results.md", "Capacity at scale (chapter 08")
    p5, p95 = re.search(r"5th-95th percentile (\d+)-(\d+)", outputs("08")).groups()
    blocks, gb = re.search(r"KV budget (\d+\.\d)\d* GB = ([\d,]+) blocks", outputs("08")).group(
        2, 1
    )
    fills = re.findall(r"real tokens fill (\d+\.\d%)", outputs("08"))
    quotes(
        capacity,
        "docs/results.md",
        f"leaves {gb} GB = {blocks} blocks of 16 tokens",
        f"(real tokens fill {fills[0]} of them)",
        f"real tokens fill {fills[1]} of the blocks",
        f"hold **{static}** requests",
        f"**{paged}** on average (5th-95th percentile {p5}-{p95}",
        f"{ratio}.",
    )


def test_the_prefix_saving_is_chapter_05s():
    row = re.search(
        r"^\s*1000\s+\d+\s+\d+\s+(\d+)\.\d%\s+\d+\s+\d+\s+(\d+\.\dx)", outputs("05"), re.M
    )
    assert row is not None, "chapter 05's savings table has no 1000-token row"
    readme = line("README.md", "| 100 requests sharing a 1,000-token system prompt")
    quotes(readme, "README.md", f"{row.group(1)}% (prefill bound {row.group(2)})")


def test_the_block_size_study_is_chapter_08s():
    c7 = output_number("08", r"C7: (util/throughput vs 16, chat: .*)")
    chat, short = c7.split("; short: ")
    pick = lambda part, block: re.search(rf"\b{block}: \d+%/(\d\.\d\dx)", part).group(1)  # noqa: E731
    readme = line("README.md", "| simulated throughput at block 128 / 256 vs 16")
    quotes(
        readme,
        "README.md",
        f"{pick(chat, 128)} / {pick(chat, 256)}; {pick(short, 128)} / {pick(short, 256)}",
    )


def test_the_ledger_counts_are_chapter_08s():
    table = [
        row.split(" | ") for row in outputs("08").splitlines() if re.match(r"\| [CE]\d+ \|", row)
    ]
    assert len(table) == 18, f"chapter 08's ledger has {len(table)} rows"
    kinds = {"hold": 0, "depend": 0, "corrected": 0, "measured": 0}
    for cells in table:
        claim, verdict = cells[0].strip("| "), cells[3]
        if claim.startswith("C"):
            kinds["hold" if re.fullmatch(r"holds( \(.*\))?", verdict) else "depend"] += 1
        else:
            kinds["measured" if verdict.startswith("measured") else "corrected"] += 1
    readme = line("README.md", "| seed claims C1-C7 and errors E1-E11")
    quotes(
        readme,
        "README.md",
        f"{kinds['hold']} hold, {kinds['depend']} depend on the workload, "
        f"{kinds['corrected'] + kinds['measured']} corrected or measured",
    )


@pytest.mark.parametrize("doc", list(DOCS))
def test_no_gpu_claim_contradicts_the_committed_run(doc):
    """The committed GPU run exists: no document may say no GPU figure was measured, nor that E2 is only a
    sourced correction, while others quote the run."""
    body = " ".join(text(doc).split())
    for phrase in (
        "No GPU was available",
        "E2 | paged kernel only 2-5% slower than contiguous (implementation "
        "article §3.1) | no GPU in this run",
    ):
        assert phrase not in body, f"{doc} says {phrase!r}, but docs/gpu/ holds a GPU run"


def test_the_learner_command_serves_the_repository_root():
    """`jupyter lab DIR` serves only DIR: the learner's command must let JupyterLab open chapters/ and
    exercises/ side by side (it serves the folder it starts in)."""
    commands = re.findall(r"`(jupyter lab[^`]*)`", text("README.md"))
    assert commands, "the README names no JupyterLab command"
    for command in commands:
        args = [a for a in command.split()[2:] if not a.startswith("-")]
        assert not args, (
            f"README: {command!r} serves {args[0]} only; exercises/ would be out of reach"
        )


# ---------------------------------------------------------------------------- the committed CPU run
def _systems(w: dict) -> str:
    return f"{w['ratio_vs_static']:.2f}x / {w['ratio_vs_generate_batch']:.2f}x / {w['ratio_vs_vllm']:.2f}x"


def test_the_engine_comparison_is_the_cpu_runs():
    e = cpu("engine")
    readme = line("README.md", "| engine vs transformers and vLLM")
    o = e["overhead"]
    quotes(
        readme,
        "README.md",
        f"({e['requests']}/{e['requests']}, {e['big']['requests']}/{e['big']['requests']})",
        f"Llama 4 x 256, {e['requests']} requests): {_systems(e)}",
        f"Llama 8 x 512, {e['big']['requests']} requests: {_systems(e['big'])}",
        f"{best_cpu_seconds(e['vllm']):.2f} CPU-s in its {e['vllm']['seconds']:.2f} s",
        f"our engine {best_cpu_seconds(e['paged']):.2f} CPU-s in its {e['paged']['seconds']:.2f} s",
        f"{o['share']['forward']:.1%} of our step is the model's forward, the rest {o['overhead_share']:.1%} at "
        f"{o['num_seqs']} running sequences",
    )
    for w, anchor in ((e, "| engine, reference workload"), (e["big"], "| engine, big workload")):
        row = line("docs/results.md", anchor)
        p, st, gb, v = w["paged"], w["static_generate"], w["generate_batch"], w["vllm"]
        quotes(
            row,
            "docs/results.md",
            f"paged {p['seconds']:.2f} s ({p['tok_s']:,.0f} tok/s, {best_cpu_seconds(p):.2f} CPU-s)",
            f"{st['seconds']:.2f} s (paged {w['ratio_vs_static']:.2f}x)",
            f"{gb['seconds']:.2f} s ({w['ratio_vs_generate_batch']:.2f}x)",
            f"vLLM {v['seconds']:.2f} s (paged {w['ratio_vs_vllm']:.2f}x; {best_cpu_seconds(v):.2f} CPU-s",
            f"{w['requests']}/{w['requests']} identical",
        )
        assert all(
            w[k]["agreement"]["equal"] == w["requests"]
            for k in ("static_generate", "generate_batch", "vllm")
        ), "the documents say every system produced identical tokens"
    step = line("docs/results.md", f"| engine step, {o['num_seqs']} running sequences")
    quotes(
        step,
        "docs/results.md",
        *(f"{name} {share:.1%}" for name, share in o["share"].items() if share >= 0.001),
        f"overhead {o['overhead_share']:.1%}",
    )
    sweep = line("docs/results.md", "| engine, concurrency (prompt 64, output 32)")
    quotes(
        sweep,
        "docs/results.md",
        *(
            f"{r['concurrency']}: {r['paged_tok_s']:,.0f}/{r['hf_tok_s']:,.0f}"
            for r in e["concurrency"]
        ),
    )


def test_the_chunked_prefill_latencies_are_the_cpu_runs():
    lat = cpu("engine")["latency"]
    eng, on, off = lat["engine"], lat["engine"]["on"], lat["engine"]["off"]
    assert eng["same_tokens"], "the documents say the tokens were equal in every run"
    readme = line("README.md", "| chunked prefill (on by default)")
    quotes(
        readme,
        "README.md",
        f"budget {eng['budget']} vs whole prompts (median of {eng['repeats']} runs",
        f"p99 inter-token latency {1e3 * on['itl_p99']:.1f} vs {1e3 * off['itl_p99']:.1f} ms "
        f"({eng['itl_p99_ratio']:.2f}x lower)",
        f"throughput {100 * eng['throughput_change']:.1f}% per wall-clock second "
        f"({100 * eng['cpu_throughput_change']:.1f}% per CPU second)",
        f"p99 time to first token {1e3 * on['ttft_p99']:.0f} vs {1e3 * off['ttft_p99']:.0f} ms",
    )
    row = line("docs/results.md", "| engine, chunked prefill")
    quotes(
        row,
        "docs/results.md",
        f"ITL p50 {1e3 * on['itl_p50']:.1f} vs {1e3 * off['itl_p50']:.1f} ms",
        f"p99 {1e3 * on['itl_p99']:.1f} vs {1e3 * off['itl_p99']:.1f} ms ({eng['itl_p99_ratio']:.2f}x lower)",
        f"TTFT p50 {1e3 * on['ttft_p50']:.1f} vs {1e3 * off['ttft_p50']:.1f} ms",
        f"p99 {1e3 * on['ttft_p99']:.1f} vs {1e3 * off['ttft_p99']:.1f} ms",
        f"{100 * eng['throughput_change']:+.1f}% per wall-clock second",
        f"{100 * eng['cpu_throughput_change']:+.1f}% per CPU second",
        "p99 ITL " + " / ".join(f"{1e3 * r['itl_p99']:.1f}" for r in lat["sim"]) + " ms",
    )
    off_tok_s = lat["sim"][-1]["tok_s"]
    ratios = [r["tok_s"] / off_tok_s for r in lat["sim"][1:]]
    quotes(
        row,
        "docs/results.md",
        f"throughput {lat['sim'][0]['tok_s'] / off_tok_s:.2f}x at 64",
        f"{min(ratios):.2f}-{max(ratios):.2f}x from 128 up",
    )


def test_the_component_benchmarks_are_the_cpu_runs():
    sim, al, pre, sch, k = (
        cpu("sim"),
        cpu("allocator"),
        cpu("prefix"),
        cpu("scheduler"),
        cpu("kernel"),
    )
    s = sim["summary"]
    quotes(
        line("docs/results.md", "| sim (full)"),
        "docs/results.md",
        f"{sim['num_requests']:,} requests, pool {sim['pool_slots']:,} slots",
        f"simulated in {sim['seconds']['total']:.1f} s",
        f"static {s['static']['utilization']:.1%}, contiguous {s['contiguous']['utilization']:.1%}, "
        f"paged {s['paged']['utilization']:.1%}",
        " / ".join(f"{s[m]['steps']:,}" for m in ("static", "contiguous", "paged")) + " steps",
    )
    a, m = al["allocator_vs_deque"], al["manager"]
    quotes(
        line("docs/results.md", "| allocator (full)"),
        "docs/results.md",
        f"{a['ours_single']:.0f} ns per block, {a['ratio_single']:.1f}x a bare `deque`",
        f"{a['ratio_batch']:.1f}x in batches of 64",
        " / ".join(f"{r['us_per_block']:.2f}" for r in m)
        + f" us and {m[0]['calls_per_block']:.2f} Python calls",
    )
    c = pre["allocation_cost"]
    saved = {r["system_len"]: r for r in pre["savings"]}
    quotes(
        line("docs/results.md", "| prefix (full)"),
        "docs/results.md",
        f"with {c['cached_tokens']:,} tokens cached: {c['us_on']:.1f} us against {c['us_off']:.1f} us uncached "
        f"({c['ratio']:.1f}x; {c['us_on_with_hashing']:.1f} us, {c['ratio_with_hashing']:.1f}x",
        f"hold {saved[1000]['blocks_ratio']:.1%} of the blocks, prefill bound {saved[1000]['speedup_bound']:.1f}x",
    )
    assert saved[9]["block_saving"] == 0, "the documents say a 9-token prompt saves nothing"
    quotes(
        line("docs/results.md", "| scheduler (full)"),
        "docs/results.md",
        ", ".join(f"{r['us_per_request']:.1f} us at {r['running']:,}" for r in sch["rows"]),
        f"{sch['rows'][0]['calls_per_request']:.0f} Python calls per request",
    )
    rows = k["cpu_rows"]
    quotes(
        line("docs/results.md", "| kernel (full)"),
        "docs/results.md",
        f"max error {max(r['tuned_max_err'] for r in rows):.1e} (tuned) and "
        f"{max(r['teaching_max_err'] for r in rows):.1e} (teaching)",
    )
    assert all(r["paged_equals_contiguous"] for r in rows) and k["mode"] != "gpu"


def test_the_results_ledger_is_the_ledger_of_the_committed_runs():
    """docs/results.md's ledger table is what ``python -m paged_course.reference.ledger`` prints for the committed
    CPU and GPU runs (the measurements of chapters 01-06 are recomputed: they are exact)."""
    from paged_course.reference import ledger

    measured = ledger.measure_all()
    measured["concurrency"] = cpu("engine")["concurrency"]
    measured["device"] = "cpu"
    measured["kernel"] = gpu("kernel")
    want = ledger.ledger_markdown(ledger.build_rows(measured)).splitlines()
    have = set(text("docs/results.md").splitlines())
    missing = [row for row in want if row not in have]
    assert not missing, (
        "docs/results.md's ledger differs from the committed runs' ledger:\n" + "\n".join(missing)
    )
