"""Learner stubs, generated from solutions/ by `python -m paged course sync`."""
