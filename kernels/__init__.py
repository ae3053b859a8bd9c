"""Triton kernels for paged attention, imported as ``paged.kernels``."""
