"""Pictures for chapter 08 (measuring it): block-size study, throughput against concurrency, capacity.

Each function draws into new axes (or the ``ax`` given) and returns the axes; the data come from
``paged.ledger`` (``block_size_study``, ``capacity_at_scale``) and ``paged.bench.engine``
(``concurrency_sweep`` rows: ``concurrency``, ``paged_tok_s``, ``hf_tok_s``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np


def plot_block_size_study(studies: dict[str, list[dict]], reference: int = 16, axes=None):
    """Two panels per trace name: slot utilization, and simulated throughput relative to ``reference``.

    ``studies`` maps a trace name to ``paged.ledger.block_size_study`` rows.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for name, rows in studies.items():
        sizes = [r["block_size"] for r in rows]
        ref = next(r["tokens_per_step"] for r in rows if r["block_size"] == reference)
        axes[0].plot(sizes, [100 * r["utilization"] for r in rows], marker="o", label=name)
        axes[1].plot(sizes, [r["tokens_per_step"] / ref for r in rows], marker="o", label=name)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.axvline(reference, color="gray", linestyle=":", linewidth=1)
        ax.set_xlabel("block size (tokens)")
        ax.legend(fontsize=8)
    axes[0].set(ylabel="% of allocated slots holding tokens", title="memory: internal waste grows with the block")
    axes[1].axhline(1.0, color="gray", linewidth=0.8)
    axes[1].set(ylabel=f"tokens per step / block {reference}",
                title="simulated throughput (kernel cost not modelled)")
    return axes


def plot_kernel_block_sizes(rows: list[dict], ax=None):
    """GPU kernel time per block size from ``bench kernel`` JSON rows (``results["sweep"]``)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    for (batch, context) in sorted({(r["batch"], r["context"]) for r in rows}):
        sel = sorted((r for r in rows if (r["batch"], r["context"]) == (batch, context)), key=lambda r: r["block_size"])
        ax.plot([r["block_size"] for r in sel], [r["paged_ms"] * 1e3 for r in sel], marker="o",
                label=f"batch {batch}, context {context}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="block size (tokens)", ylabel="kernel time (us)", yscale="log", title="paged decode kernel (GPU)")
    ax.legend(fontsize=7)
    return ax


def plot_concurrency(rows: list[dict], ax=None, device: str = "cpu"):
    """Useful tokens per second against concurrency: this engine vs transformers ``generate``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    levels = [r["concurrency"] for r in rows]
    ax.plot(levels, [r["paged_tok_s"] for r in rows], marker="o", label="paged engine (LLM.generate)")
    ax.plot(levels, [r["hf_tok_s"] for r in rows], marker="s", label="transformers generate (static batch)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set(xlabel="requests at once", ylabel="generated tokens / s", title=f"throughput against concurrency ({device})")
    ax.legend(fontsize=8)
    return ax


def plot_capacity(cap: dict, label: str = "", ax=None):
    """Requests that fit at once in one KV budget: static pre-allocation vs paged (5th-95th percentile bar)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    values = [cap["static"], cap["paged_mean"]]
    err = np.array([[0, cap["paged_mean"] - cap["paged_p5"]], [0, cap["paged_p95"] - cap["paged_mean"]]])
    ax.bar(["static\n(max_seq_len slots each)", "paged\n(blocks for the real length)"], values, yerr=err,
           capsize=6, color=["#8d99ae", "#2a9d8f"])
    for i, v in enumerate(values):
        ax.text(i + 0.3, v, f"{v:.0f}", ha="center", va="bottom")
    ax.set(ylabel="requests at once", title=label or "maximum concurrency in one KV budget")
    return ax
