"""Triton kernels for paged attention, imported as ``paged.kernels`` (the folder is ``kernels/``).

* :func:`paged_attention_decode` -- decode attention through block tables, GQA, split-K
  (``kernels/paged_attention.py``); same signature as the PyTorch reference in ``paged_course.reference``.
  :func:`launch_decode` is the same without input validation (no host sync), for hot loops.
* :func:`reshape_and_cache` -- write new keys/values into the KV pool by slot mapping (``cache_ops.py``).
* :func:`softmax`, :func:`online_softmax` -- the warm-up row-softmax kernels (``row_softmax.py``).

Without a CUDA GPU the package sets ``TRITON_INTERPRET=1`` before defining any kernel, so the kernels run
(slowly) on CPU tensors; without Triton (macOS, Windows) every entry point raises
:class:`TritonUnavailableError` with the reason. ``MODE`` says which of the three applies.
"""

from ._triton import HAS_CUDA, HAS_TRITON, INTERPRET, MODE, REASON, TritonUnavailableError, require_triton
from .cache_ops import reshape_and_cache
from .paged_attention import launch_decode, paged_attention_decode, validate_decode_inputs
from .row_softmax import online_softmax, softmax

__all__ = [
    "HAS_CUDA", "HAS_TRITON", "INTERPRET", "MODE", "REASON", "TritonUnavailableError", "require_triton",
    "paged_attention_decode", "launch_decode", "validate_decode_inputs", "reshape_and_cache",
    "softmax", "online_softmax",
]
