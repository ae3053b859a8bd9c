"""sim: trace-driven simulators (no model): fragmentation and scheduling at any scale.

Owns the synthetic traces (``workload``), the fragmentation and scheduling simulators, the step-order and KV
checks, and data helpers computed on the real block manager (``prefix_savings``). It returns data and draws
nothing: it may import the engine (``paged``) but never ``bench``, ``viz``, ``grading``, ``publish`` or ``tools``.
"""
