"""Decode's roofline (``python -m paged bench kernel --roofline``): a model, labelled as one everywhere.

The byte floor at the datasheet bandwidths, the table alone when no GPU run exists, and beside a GPU run's
measured times (and the compile report's row for that GPU) when one does.
"""

from __future__ import annotations

import json

import pytest

from paged_course.bench import kernel_roofline as kr


def test_floor_is_bytes_over_datasheet_bandwidth():
    rows = {(r["batch"], r["context"]): r for r in kr.model_rows()}
    r = rows[(64, 4096)]
    # K and V: 2 x 64 x 4096 x 8 x 128 x 2 bytes; query and output: 2 x 64 x 32 x 128 x 2
    assert r["bytes"] == 2 * 64 * 4096 * 8 * 128 * 2 + 2 * 64 * 32 * 128 * 2 == 1_074_790_400
    assert r["floor_us"]["H200"] == pytest.approx(1_074_790_400 / 4800e9 * 1e6)  # 223.9 us
    assert r["floor_us"]["H100 SXM"] == pytest.approx(1_074_790_400 / 3350e9 * 1e6)
    assert r["floor_us"]["A100 SXM 80GB"] == pytest.approx(1_074_790_400 / 2039e9 * 1e6)
    assert len(rows) == 12, "every batch x context of the benchmark's sweep"


def test_without_a_gpu_run_every_number_is_a_model(tmp_path, monkeypatch):
    monkeypatch.setattr(kr, "ROOT", tmp_path)
    report = kr.roofline(tmp_path)
    assert "measured" not in report and report["label"] == "model, not measured"
    text = kr.markdown(report)
    header = text.splitlines()[2]
    assert header.count("(model, not measured)") == 3 and "measured on" not in header
    assert text.rstrip().endswith("No GPU run: every number above is a model, not measured.")
    assert kr.main(tmp_path) == 0 and (tmp_path / "roofline.md").read_text() == text


def test_beside_a_gpu_run_with_its_compiled_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(kr, "ROOT", tmp_path)
    sweep = [{"batch": 64, "context": 4096, "block_size": 16, "ms": {"tuned": 0.25, "sdpa": 0.3}}]
    record = {
        "environment": {"time": "2027-01-01T00:00:00"},
        "results": {"mode": "gpu", "device": "NVIDIA H200", "peak_hbm_gbps": 4800, "sweep": sweep},
    }
    (tmp_path / "kernel.json").write_text(json.dumps(record))
    row = {
        "id": "decode:H200:float16:d128:g4:bs16",
        "gpu": "H200",
        "registers": 120,
        "stack_bytes": 0,
        "shared_bytes": 40140,
        "cp_async": 35,
        "occupancy": {"programs_per_sm": 4, "limited_by": "registers"},
    }
    (tmp_path / "kernels.json").write_text(json.dumps({"rows": [row]}))
    report = kr.roofline(tmp_path)
    at = {(r["batch"], r["context"]): r for r in report["rows"]}[(64, 4096)]
    assert at["measured_us"] == {"tuned": 250.0, "sdpa": 300.0}
    assert at["times_floor"]["tuned"] == pytest.approx(250.0 / at["floor_us"]["H200"])
    text = kr.markdown(report)
    assert "measured on NVIDIA H200, µs" in text.splitlines()[2]
    assert "| tuned 250.0, sdpa 300.0 | tuned 1.12x, sdpa 1.34x |" in text
    assert "120 registers, 0 bytes of stack" in text and "4 programs per SM (registers)" in text
