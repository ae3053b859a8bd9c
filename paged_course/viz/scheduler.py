"""Pictures of the scheduler for chapter 06: timelines, memory over time, and a step-by-step widget.

- ``plot_timelines``: a Gantt chart, one row per request, coloured by state (waiting, running,
  preempted = waiting again after recompute preemption, swapped) from a ``paged_course.sim.scheduling.ScheduleResult``.
- ``plot_memory``: KV slots held and tokens computed per step, over time, for several runs.
- ``Stepper``: a tiny real ``Scheduler`` driven one ``schedule()`` call at a time by a fake model;
  ``Stepper.draw()`` shows its queues and its GPU pool (``paged_course.viz.kv_pool.plot_pool``).
- ``stepper_widget``: buttons around a ``Stepper`` (static fallback: the first steps side by side).

Every function returns the matplotlib figure (or the widget).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from paged.config import CacheConfig, SchedulerConfig
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from paged_course.engine_views import decodes, prefills
from paged_course.viz.kv_pool import plot_pool

STATE_COLORS = {
    "waiting": "#d9d9d9",
    "running": "#2ca02c",
    "preempted": "#ff7f0e",
    "swapped": "#9467bd",
}


def plot_timelines(res, ax=None, max_requests: int | None = 40, title: str | None = None):
    """Gantt chart of ``res.timelines`` (first ``max_requests`` requests by arrival)."""
    rids = sorted(
        res.timelines,
        key=lambda r: (
            res.requests[r]["arrival_s"],
            int(r.lstrip("r") or 0) if r.lstrip("r").isdigit() else 0,
        ),
    )[:max_requests]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, min(0.16 * len(rids), 6) + 1.2))
    for row, rid in enumerate(rids):
        for state in STATE_COLORS:
            spans = [(a, b - a) for a, b, s in res.timelines[rid] if s == state]
            if spans:
                ax.broken_barh(spans, (row - 0.4, 0.8), color=STATE_COLORS[state], linewidth=0)
    ax.set_ylim(len(rids) - 0.5, -0.5)
    ax.set_yticks([])
    ax.set_ylabel(f"requests ({len(rids)})")
    ax.set_xlabel("time (s, cost model)")
    ax.set_title(
        title or f"{res.name}: {res.total_s:.1f} s, {res.throughput:.0f} tokens/s",
        fontsize=9,
        loc="left",
    )
    ax.legend(
        [Patch(color=c) for c in STATE_COLORS.values()],
        list(STATE_COLORS),
        fontsize=7,
        loc="upper right",
    )
    return ax.figure


def plot_memory(results: dict, axes=None):
    """KV token slots held (top) and tokens computed per step (bottom) against time, one line per run."""
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
    for name, res in results.items():
        t = [s["time"] for s in res.steps]
        axes[0].step(t, [s["used_slots"] for s in res.steps], where="post", label=name, linewidth=1)
        axes[1].step(t, [s["tokens"] for s in res.steps], where="post", label=name, linewidth=0.8)
    total = max((r.num_slots for r in results.values()), default=0)
    if total:
        axes[0].axhline(total, color="black", linestyle=":", linewidth=1, label="KV pool size")
    axes[0].set_ylabel("KV slots held")
    axes[1].set_ylabel("tokens per step")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("time (s, cost model)")
    axes[0].legend(fontsize=7, frameon=False)
    return axes[0].figure


class Stepper:
    """A tiny scheduler to step by hand: requests ``(name, prompt_len, new_tokens, arrival_step)``.

    Each ``step()`` adds the requests arriving at that step, calls ``schedule()``, applies the fake
    model (one token per scheduled sequence) and returns a one-line log of what happened.
    ``scheduler_cls``: the engine's ``Scheduler`` or a subclass (the learner's, chapter 06).
    """

    def __init__(
        self,
        requests,
        block_size: int = 4,
        num_gpu_blocks: int = 8,
        num_cpu_blocks: int = 0,
        preemption_mode: str = "recompute",
        watermark: float = 0.0,
        max_model_len: int = 64,
        scheduler_cls=Scheduler,
    ):
        self.requests = list(requests)
        self.sched = scheduler_cls(
            SchedulerConfig(
                max_num_seqs=8,
                max_model_len=max_model_len,
                preemption_mode=preemption_mode,
                max_num_batched_tokens=max(max_model_len, 64),
            ),
            CacheConfig(
                block_size=block_size,
                num_gpu_blocks=num_gpu_blocks,
                num_cpu_blocks=num_cpu_blocks,
                watermark=watermark,
            ),
        )
        self.groups: dict[str, SequenceGroup] = {}
        self.step_no, self.log = 0, []
        self.max_model_len = max_model_len

    def step(self) -> str:
        for i, (name, prompt_len, new, at) in enumerate(self.requests):
            if at == self.step_no:
                prompt = [100 * (i + 1) + j for j in range(prompt_len)]
                g = SequenceGroup(
                    name,
                    [Sequence(i, prompt, self.sched.cache_config.block_size)],
                    SamplingParams(max_tokens=new),
                )
                self.groups[name] = g
                self.sched.add_request(g)
        out = self.sched.schedule()
        for s in out.scheduled:
            # a prompt's last chunk or a decode: the fake model appends one token
            if s.samples_next_token:
                s.seq.append_token_id(1)
                if len(s.seq.output_token_ids) >= s.seq.group.sampling_params.max_tokens:
                    s.seq.status = SequenceStatus.FINISHED_LENGTH
        self.sched.free_finished()
        self.step_no += 1
        parts = [f"step {self.step_no}:"]
        if prefills(out):
            parts.append(
                "prefill "
                + ", ".join(f"{g.seq.group.request_id}({g.num_tokens})" for g in prefills(out))
            )
        if decodes(out):
            parts.append("decode " + ", ".join(g.seq.group.request_id for g in decodes(out)))
        for label, seqs in (
            ("preempted", out.preempted),
            ("swapped in", out.swapped_in),
            ("ignored", out.ignored),
            ("exhausted", out.exhausted),
        ):
            if seqs:
                parts.append(f"{label} " + ", ".join(seq.group.request_id for seq in seqs))
        self.log.append(" ".join(parts) if len(parts) > 1 else parts[0] + " nothing to run")
        return self.log[-1]

    def queues(self) -> dict[str, list[str]]:
        return {
            "waiting": [s.group.request_id for s in self.sched.waiting],
            "running": [s.group.request_id for s in self.sched.running],
            "swapped": [s.group.request_id for s in self.sched.swapped],
            "finished": [n for n, g in self.groups.items() if g.is_finished],
        }

    def draw(self, ax=None):
        """The GPU pool (colour = request) with the queues and the last log line as the title."""
        bm, bs = self.sched.block_manager, self.sched.cache_config.block_size
        tables = {}
        for name, g in self.groups.items():
            seq = g.seqs[0]
            on_gpu = seq.status is SequenceStatus.RUNNING
            tables[name] = (
                bm.get_block_table(seq) if on_gpu else [],
                seq.num_computed_tokens if on_gpu else 0,
            )
        fig = plot_pool(tables or {"-": ([], 0)}, bm.num_gpu_blocks, bs, ax=ax)
        ax = fig.axes[0] if ax is None else ax
        q = self.queues()
        text = "\n".join(f"{k}: {' '.join(v) or '-'}" for k, v in q.items())
        ax.set_title("")  # replace plot_pool's title with the step log and the queues
        ax.set_title(
            (self.log[-1] if self.log else "before step 1") + "\n" + text, fontsize=7, loc="left"
        )
        return fig


def plot_steps(stepper: Stepper, num_steps: int, cols: int = 4):
    """Static fallback: run ``num_steps`` steps and draw the pool after each, side by side."""
    rows = -(-num_steps // cols)
    nb = stepper.sched.block_manager.num_gpu_blocks
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, (0.3 * nb + 2.2) * rows))
    for i, ax in enumerate(list(getattr(axes, "flat", [axes]))):
        if i < num_steps:
            stepper.step()
            stepper.draw(ax=ax)
            ax.get_legend() and ax.get_legend().remove()
        else:
            ax.axis("off")
    fig.tight_layout()
    return fig


def stepper_widget(make_stepper, static_steps: int = 8):
    """Buttons "step" and "reset" around ``make_stepper()`` (a function returning a fresh ``Stepper``).

    Without ipywidgets, returns ``plot_steps`` of the first ``static_steps`` steps.
    """
    try:
        import ipywidgets as widgets
    except ImportError:
        return plot_steps(make_stepper(), static_steps)
    from IPython.display import display

    state = {"stepper": make_stepper()}
    out, log = widgets.Output(), widgets.Textarea(layout=widgets.Layout(width="95%", height="90px"))
    step_btn, reset_btn = (
        widgets.Button(description="schedule() once"),
        widgets.Button(description="reset"),
    )

    def redraw():
        with out:
            out.clear_output(wait=True)
            fig = state["stepper"].draw()
            display(fig)
            plt.close(fig)
        log.value = "\n".join(reversed(state["stepper"].log))

    def on_step(_):
        if state["stepper"].sched.has_unfinished_requests() or state["stepper"].step_no <= max(
            r[3] for r in state["stepper"].requests
        ):
            state["stepper"].step()
        redraw()

    def on_reset(_):
        state["stepper"] = make_stepper()
        redraw()

    step_btn.on_click(on_step)
    reset_btn.on_click(on_reset)
    redraw()
    return widgets.VBox([widgets.HBox([step_btn, reset_btn]), log, out])
