"""Learner stubs (generated from solutions/; edit the marked regions)."""
