"""Plots and widgets used by the chapters, one module per topic (matplotlib and ipywidgets)."""
