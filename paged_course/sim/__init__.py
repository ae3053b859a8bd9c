"""sim: trace-driven simulators (no model): fragmentation and scheduling at any scale.

Owns the synthetic traces (``workload``), the fragmentation simulator (``fragmentation``, its event loops in
``fragmentation_events``) and the scheduling simulator (``scheduling``), the step-order and KV checks, and
data helpers computed on the real block manager (``prefix_savings``). Each simulator's result is named for
what it holds (``FragmentationResult``: per-step slot counts; ``ScheduleResult``: timelines and per-step
cost) and summarises itself with ``summary()``, whose ``steps``, ``preemptions`` and ``recomputed_tokens``
mean the same in both. It returns data and draws nothing: it may import the engine (``paged``) but never
``bench``, ``viz``, ``grading``, ``publish`` or ``tools``.
"""
