"""The chapter widgets (01, 05, 08) and the benchmark plots: the numbers they draw, their controls, their PNGs.

Figures are drawn with matplotlib's default backend (Agg without a display); every test closes its figures.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from paged_course.bench import allocator, prefix, scheduler
from paged_course.viz.blocks import draw_prefix_savings, prefix_savings_widget
from paged_course.viz.fragmentation import fragmentation_widget
from paged_course.viz.measure import draw_block_size_choice


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_prefix_savings_block_boundary():
    """E4 in the widget: 9 shared tokens fill no block of 16 (nothing saved); 16 tokens share one block each."""
    r9 = draw_prefix_savings(9, 16, 50)
    assert (r9["blocks_without"], r9["blocks_with"], r9["block_saving"]) == (400, 400, 0.0), (
        "a partial block must never be shared between requests"
    )
    r16 = draw_prefix_savings(16, 16, 50)
    assert (r16["blocks_without"], r16["blocks_with"]) == (500, 401), (
        "100 requests x 5 blocks, 99 share block 0"
    )


def test_block_size_choice_row():
    """The ringed point is block_size_study's row; throughput is relative to block 16."""
    row16 = draw_block_size_choice(16, "short requests (Alpaca means)", 8192, num_requests=300)
    assert row16["vs_16"] == pytest.approx(1.0), "block 16 is the reference"
    row256 = draw_block_size_choice(256, "short requests (Alpaca means)", 8192, num_requests=300)
    assert row256["utilization"] < 0.5 < row16["utilization"], (
        "short requests waste most of a 256-token block"
    )


def test_widget_labels_fit():
    """JupyterLab cuts descriptions at ~80 px unless description_width is 'initial' (chapter 01's max_seq_len)."""
    pytest.importorskip("ipywidgets")
    for widget in (
        fragmentation_widget(num_requests=50, pool_slots=2048),
        prefix_savings_widget(system_len=64),
    ):
        controls = [c for c in widget.children if hasattr(c, "description") and c.description]
        assert controls, "the widget has labelled controls"
        for c in controls:
            assert c.style.description_width == "initial", f"{c.description!r} would be cut off"


def test_bench_plots_write_png(tmp_path):
    """Each benchmark's plot function writes a non-empty PNG without touching pyplot's figures."""
    before = plt.get_fignums()
    pair = {
        "ours_single": 150.0,
        "deque_single": 35.0,
        "floor_single": 80.0,
        "ours_batch": 120.0,
        "deque_batch": 45.0,
        "ratio_single": 150 / 35,
        "ratio_batch": 120 / 45,
    }
    rows = [
        {"blocks": 4096 * k, "us_per_block": 0.17 * k**0.1, "calls_per_block": 3.45}
        for k in (1, 4, 16)
    ]
    paths = [allocator.plot_results(pair, rows, tmp_path / "allocator.png")]
    cost = {
        "us_off": 9.0,
        "us_on": 55.0,
        "us_on_with_hashing": 100.0,
        "ratio": 55 / 9,
        "ratio_with_hashing": 100 / 9,
        "cached_tokens": 1488,
    }
    paths.append(
        prefix.plot_results(
            cost, [prefix.shared_prompt_savings(n) for n in (9, 100)], tmp_path / "p.png"
        )
    )
    sched = [
        {
            "running": n,
            "us_per_call_min": 3.2 * n,
            "us_per_call_median": 3.5 * n,
            "per_request_ratio_vs_64": 1.0,
        }
        for n in (64, 256)
    ]
    paths.append(scheduler.plot_results(sched, tmp_path / "scheduler.png"))
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert plt.get_fignums() == before, "benchmark plots must not leave pyplot figures open"
