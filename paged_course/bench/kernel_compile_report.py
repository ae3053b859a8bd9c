"""The compile report's checks and text: what ``kernel_compile`` measured, judged and written out.

:func:`check` names each failure (a compile error, a spill, a K/V tile load narrower than 16 bytes, fewer
16-byte K/V loads or ``cp.async`` than the committed report); :func:`markdown`, :func:`report_markdown`
and :func:`dump` write ``kernels.md`` and ``kernels.json``. It reads rows (dicts) only: it compiles
nothing and imports nothing of the course.
"""

from __future__ import annotations

import json

TARGETS = {"A100": 80, "H200": 90}  # GPU of paged.kernels.GPUS -> compute capability (sm_80, sm_90)
KV_OPERANDS = ("K", "V")  # the kernels' pointer arguments whose loads are K/V tiles


def kv_loads(row: dict) -> dict:
    """``{"wide": 16-byte K/V loads (vector loads and cp.async), "narrow": narrower ones}``."""
    wide = narrow = 0
    for operand in KV_OPERANDS:
        for width, n in row.get("loads", {}).get(operand, {}).items():
            if int(width) >= 16:
                wide += n
            else:
                narrow += n
    return {"wide": wide, "narrow": narrow}


def error_text(exc: BaseException) -> str:
    """A compile error with its causes (an error inside a ``@triton.jit`` helper such as ``attend_tile`` is
    the cause of the call site's error), at most about 4,000 characters (its start and its end)."""
    chain = [exc]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    text = "\n".join(f"{type(e).__name__}: {e}".strip() for e in chain)
    return text if len(text) <= 4000 else f"{text[:2000]}\n...\n{text[-2000:]}"


def error_summary(error: str) -> str:
    """A compile error in one line: its first line (where) and its last (why)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1]}"


def check(rows: list[dict], baseline: list[dict] | None = None) -> list[str]:
    """The report's failures, one line each: compile errors, spills, narrow or missing K/V tile loads,
    and fewer 16-byte K/V loads or ``cp.async`` than ``baseline`` (rows of the committed report)."""
    problems = []
    before = {r["id"]: r for r in baseline or [] if "error" not in r}
    for row in rows:
        name = row["id"]
        if "error" in row:
            problems.append(f"{name}: compile error: {error_summary(row['error'])}")
            continue
        if row["stack_bytes"] > 0:
            problems.append(
                f"{name}: spills: {row['stack_bytes']} bytes of stack at {row['registers']} registers"
            )
        kv = kv_loads(row)
        if row["kernel"] != "merge" and kv["wide"] == 0:
            problems.append(f"{name}: no 16-byte K/V tile load found (loads: {row['loads']})")
        if kv["narrow"]:
            problems.append(
                f"{name}: {kv['narrow']} K/V tile loads narrower than 16 bytes (loads: {row['loads']})"
            )
        old = before.get(name)
        if old is not None:
            for label, now, then in (
                ("16-byte K/V loads", kv["wide"], kv_loads(old)["wide"]),
                ("cp.async copies", row["cp_async"], old["cp_async"]),
            ):
                if now < then:
                    problems.append(f"{name}: {now} {label}, the committed report has {then}")
    return problems


COLUMNS = (
    "| kernel | GPU | dtype | head dim | group | block | tile | warps / stages | registers | stack B "
    "| shared KB | K/V loads 16 B / narrower | cp.async | TMA | mma / wgmma | programs per SM |\n"
    + "|---" * 16
    + "|\n"
)


def markdown(rows: list[dict]) -> str:
    """One markdown table row per compiled kernel (:data:`COLUMNS`)."""
    lines = []
    for r in rows:
        lead = f"| {r['kernel']} | {r['gpu']} (sm_{TARGETS[r['gpu']]}) | {r['dtype']} | {r['head_dim']} | "
        lead += "- | - | " if r["kernel"] == "merge" else f"{r['group']} | {r['block_size']} | "
        if "error" in r:
            lines.append(lead + f"compile error: {error_summary(r['error'])[:120]} |" + " |" * 9)
            continue
        launch, kv, occ = r["launch"], kv_loads(r), r["occupancy"]
        rows_, cols = launch.get("BLOCK_M", launch.get("GROUP_P2")), launch.get("BLOCK_N")
        tile = f"{rows_} x {cols or launch.get('BLOCK_SIZE')}"
        if r["kernel"] == "merge":
            tile = f"{r['num_splits']} splits"
        lines.append(
            lead
            + f"{tile} | {r['num_warps']} / {r['num_stages']} | {r['registers']} | {r['stack_bytes']} | "
            f"{r['shared_bytes'] / 1024:.1f} | {kv['wide']} / {kv['narrow']} | {r['cp_async']} | "
            f"{r['tma']} | {r['mma']} / {r['wgmma']} | {occ['programs_per_sm']} ({occ['limited_by']}) |"
        )
    return COLUMNS + "\n".join(lines) + "\n"


REPORT_INTRO = """# What the compiler made of the engine's Triton kernels

Static: every kernel the engine launches, compiled for an A100 (sm_80) and an H200 (sm_90; an H100 SXM
has the same SM count and shared memory, so the same launch configs) on a machine without a GPU, with
the specialisation a launch on that GPU gets. Nothing was run: there are no times here. Written by
`python -m paged bench kernel --compile --update-static` (`paged_course/bench/kernel_compile.py`);
CI recompiles and fails on a compile error, a spill, a K/V tile load narrower than 16 bytes, or fewer
16-byte K/V loads or `cp.async` than this report.

Columns: *tile* is the launch's rows x KV tokens (the GQA group padded to 16 rows for decode, query tokens
for prefill); *stack B* is local memory per thread (register spills); *shared KB* what a program
allocates; *K/V loads* count the PTX's load instructions of K and V tiles (static counts, not executions),
by width; *cp.async* asynchronous copies into shared memory (Triton's software pipelining); *mma /
wgmma* tensor-core instructions (Ampere's warp-level `mma.sync`, Hopper's warp-group `wgmma`);
*programs per SM* the most that fit by registers (64 K per SM, allocated per warp in units of 256),
shared memory (plus 1 KB per program reserved by the driver) and warps (64 per SM), and which limit
binds: arithmetic on the compiler's numbers, not a measurement.
"""


def report_markdown(report: dict) -> str:
    """The committed report's text: the engine's kernels, then chapter 04's lab kernels, then the checks."""
    text = (
        REPORT_INTRO
        + f"\nTriton {report['triton']}; the steps compiled: {report['steps_text']}.\n\n"
    )
    text += "## The engine's kernels\n\n" + markdown(report["rows"])
    if report.get("lab"):
        text += (
            "\n## Chapter 04's kernels (not checked)\n\nAt the decode step of batch 64, context "
            "4,096, fp16, 32 query heads over 8 KV heads of dim 128, block size 16. *tuned, no hints* is "
            "the tuned kernel compiled without `tt.divisibility` (Triton then knows nothing of its "
            "pointers' alignment).\n\n" + markdown(report["lab"])
        )
    problems = report["problems"]
    text += "\n## Checks\n\n" + (
        "\n".join(f"- FAIL {p}" for p in problems) if problems else "All pass."
    )
    return text + "\n"


def dump(report: dict) -> str:
    """The report as JSON with one line per row (readable diffs when a kernel changes)."""
    lines = []
    for key, value in report.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join(f"  {json.dumps(v, sort_keys=True)}" for v in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def text_table(rows: list[dict]) -> str:
    """A compact plain-text table of compiled kernels (chapter 04): one line per kernel and GPU."""
    head = (
        f"{'kernel':<28}{'GPU':<14}{'registers':>10}{'stack B':>9}{'shared KB':>11}"
        f"{'K/V loads 16 B / narrower':>27}{'cp.async':>10}{'mma / wgmma':>13}  programs per SM"
    )
    lines = [head]
    for r in rows:
        where = f"{r['gpu']} (sm_{TARGETS[r['gpu']]})"
        if "error" in r:
            lines.append(
                f"{r['kernel']:<28}{where:<14}  does not compile: {error_summary(r['error'])}"
            )
            continue
        kv, occ = kv_loads(r), r["occupancy"]
        loads, mma = f"{kv['wide']} / {kv['narrow']}", f"{r['mma']} / {r['wgmma']}"
        lines.append(
            f"{r['kernel']:<28}{where:<14}{r['registers']:>10}{r['stack_bytes']:>9}"
            f"{r['shared_bytes'] / 1024:>11.1f}{loads:>27}{r['cp_async']:>10}{mma:>13}"
            f"  {occ['programs_per_sm']} ({occ['limited_by']})"
        )
    return "\n".join(lines)
