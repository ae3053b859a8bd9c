"""Decode's roofline, a model: the bytes a decode step must read and the time they take at a GPU's published
HBM bandwidth. ``python -m paged bench kernel --roofline [--out DIR]``.

**Model, not measured.** For ``B`` sequences of context ``L``, ``H`` query heads over ``H_kv`` KV heads of
dim ``D`` in ``e`` bytes, a decode step reads ``2 B L H_kv D e`` bytes of K and V and moves ``2 B H D e``
of query and output (``paged_course.bench.kernel.bytes_moved``; block-table reads not counted). No kernel
can take less than bytes / peak bandwidth: that floor is what this module prints, at the benchmark's
sweep shapes (a Llama-3-8B layer: 32 query heads over 8 KV heads of dim 128, fp16), for the A100, H100
and H200 at their datasheet bandwidths (NVIDIA A100 Tensor Core GPU datasheet: 2,039 GB/s for the 80 GB
SXM module; H100 Tensor Core GPU datasheet: 3.35 TB/s for H100 SXM; H200 Tensor Core GPU datasheet:
4.8 TB/s). Every line it prints says "model, not measured".

**Beside a measurement.** When a GPU run of ``python -m paged bench kernel`` exists (``DIR/kernel.json``,
else the newest committed ``docs/gpu/*/kernel.json``), each shape also gets the kernels that run
measured on that GPU, their time as a multiple of the model's floor for that GPU, and their fraction of
its peak. Writes ``roofline.json`` and ``roofline.md`` into ``--out``.
"""

from __future__ import annotations

import json
from pathlib import Path

from paged_course.bench.kernel_shapes import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    ROOT,
    SWEEP,
    bytes_moved,
    peak_bandwidth_gbps,
)

GPUS = {  # name as the datasheets give it -> the device name torch reports
    "A100 SXM 80GB": "NVIDIA A100-SXM4-80GB",
    "H100 SXM": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
}
MODEL = "model, not measured"


def model_rows(shapes=None, gpus=GPUS) -> list[dict]:
    """``{"batch", "context", "bytes", "floor_us": {gpu: us}}`` per shape: bytes / datasheet bandwidth."""
    shapes = shapes or [(b, c) for b in SWEEP["batch"] for c in SWEEP["context"]]
    rows = []
    for batch, context in shapes:
        moved = bytes_moved(batch, context, HEADS, KV_HEADS, HEAD_DIM, 2)
        floor = {g: moved / (peak_bandwidth_gbps(name) * 1e9) * 1e6 for g, name in gpus.items()}
        rows.append({"batch": batch, "context": context, "bytes": moved, "floor_us": floor})
    return rows


def measured_run(folder: Path | None = None) -> tuple[Path, dict] | None:
    """``(path, results)`` of the GPU kernel benchmark in ``folder/kernel.json``, else of the newest committed
    run under ``docs/gpu/*/``; None when there is none (a CPU run does not count)."""
    here = Path(folder) / "kernel.json" if folder else None
    if here is not None and here.exists() and _gpu(here):
        return here, _gpu(here)
    runs = [
        (r["time"] or "", str(p), p, r)
        for p in (ROOT / "docs" / "gpu").glob("*/kernel.json")
        if (r := _gpu(p))
    ]
    return max(runs)[2:] if runs else None


def _gpu(path: Path) -> dict | None:
    record = json.loads(path.read_text())
    if record.get("results", {}).get("mode") != "gpu":
        return None
    return {**record["results"], "time": record["environment"].get("time")}


def _measured_us(results: dict) -> dict[tuple[int, int], dict[str, float]]:
    """``{(batch, context): {kernel: microseconds}}`` at block size 16 (older runs timed the teaching
    kernel only, as ``paged_ms``)."""
    out = {}
    for r in results.get("sweep", []):
        if r["block_size"] == 16:
            ms = r.get("ms") or {"teaching": r["paged_ms"], **(r.get("peers_ms") or {})}
            out[(r["batch"], r["context"])] = {k: v * 1e3 for k, v in ms.items()}
    return out


def roofline(folder: Path | None = None) -> dict:
    """The model at every sweep shape, with the measured times beside it where a GPU run exists."""
    rows, run = model_rows(), measured_run(folder)
    report = {"label": MODEL, "gpus": {g: peak_bandwidth_gbps(n) for g, n in GPUS.items()}}
    if run is not None:
        path, results = run
        device, measured = results["device"], _measured_us(results)
        peak = results.get("peak_hbm_gbps") or peak_bandwidth_gbps(device)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        report["measured"] = {"path": str(shown), "device": device, "time": results["time"]}
        report["compiled"] = compiled_decode(folder, device)
        for row in rows:
            floor = row["bytes"] / (peak * 1e9) * 1e6 if peak else None
            row["device_floor_us"] = floor
            row["measured_us"] = measured.get((row["batch"], row["context"]), {})
            row["times_floor"] = {k: us / floor for k, us in row["measured_us"].items() if floor}
    report["rows"] = rows
    return report


def compiled_decode(folder: Path | None, device: str) -> dict | None:
    """The compile report's row of the tuned decode kernel at the benchmark's configuration (fp16, head
    dim 128, group 4, block 16, one pass) for ``device``'s target: ``folder/kernels.json`` (written by
    ``--compile`` in the same run), else the committed ``docs/gpu/static/kernels.json``."""
    gpu = "A100" if "A100" in device else "H200" if ("H100" in device or "H200" in device) else None
    paths = [Path(folder) / "kernels.json"] if folder else []
    paths.append(ROOT / "docs" / "gpu" / "static" / "kernels.json")
    for path in paths:
        if gpu and path.exists():
            rows = json.loads(path.read_text())["rows"]
            found = [r for r in rows if r["id"] == f"decode:{gpu}:float16:d128:g4:bs16"]
            if found:
                return found[0]
    return None


def markdown(report: dict) -> str:
    """The roofline table; the model's columns are headed as a model in every row's header."""
    gpus = list(report["gpus"])
    head = "| batch | context | bytes read (MB) | " + " | ".join(
        f"floor on {g} at {report['gpus'][g]:,.0f} GB/s, µs ({MODEL})" for g in gpus
    )
    measured = report.get("measured")
    if measured:
        head += f" | measured on {measured['device']}, µs | measured / floor on that GPU"
    lines = [head + " |", "|---" * (head.count("|")) + "|"]
    for r in report["rows"]:
        cells = [str(r["batch"]), f"{r['context']:,}", f"{r['bytes'] / 1e6:,.1f}"]
        cells += [f"{r['floor_us'][g]:,.1f}" for g in gpus]
        if measured:
            cells.append(", ".join(f"{k} {v:,.1f}" for k, v in r["measured_us"].items()) or "-")
            cells.append(", ".join(f"{k} {v:.2f}x" for k, v in r["times_floor"].items()) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    title = f"## Decode's roofline ({MODEL}): 32 query heads over 8 KV heads of dim 128, fp16\n\n"
    note = (
        f"\nMeasured: {measured['device']}, {measured['time']} ({measured['path']}).\n"
        if measured
        else f"\nNo GPU run: every number above is a {MODEL}.\n"
    )
    row = (report.get("compiled") or {}) if measured else {}
    if row.get("registers") is not None:
        occ = row["occupancy"]
        note += (
            f"\nThe tuned decode kernel as compiled for {row['gpu']} ({row['id']}, the compile report): "
            f"{row['registers']} registers, {row['stack_bytes']} bytes of stack, "
            f"{row['shared_bytes'] / 1024:.1f} KB of shared memory, {row['cp_async']} cp.async, "
            f"{occ['programs_per_sm']} programs per SM ({occ['limited_by']}).\n"
        )
    return title + "\n".join(lines) + "\n" + note


def main(out: Path) -> int:
    """``python -m paged bench kernel --roofline``: print and write the table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = roofline(out)
    text = markdown(report)
    (out / "roofline.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "roofline.md").write_text(text)
    print(text)
    print(f"written to {out}/roofline.json and roofline.md")
    return 0
