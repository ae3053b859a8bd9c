"""viz: plots and widgets used by the chapters, one module per topic (matplotlib and ipywidgets).

Owns drawing only: each function draws data it is given or computes it with ``sim`` / ``reference``. Nothing
here imports ``bench`` (benchmarks hand their results to ``viz``, never the other way), ``grading``,
``publish`` or ``tools``.
"""
