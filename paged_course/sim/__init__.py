"""Trace-driven simulators (no model): fragmentation and scheduling at any scale."""
