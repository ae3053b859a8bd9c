"""publish: turning the course's sources into what learners get.

Owns ``sync`` (exercises/ generated from solutions/), ``notebooks`` (executing and checking the chapters),
the notebook watchdogs (``kernel_watch``, ``nbval_watch``), chapter time budgets (``runtimes``) and the
student release (``release``). It may import ``grading`` (the release ships the grader's config) but never
``bench``, ``sim``, ``viz`` or ``tools``.
"""
