"""Teaching kernels of chapter 04, kept beside the course (the engine runs none of them).

* :func:`teaching_decode` -- the first, readable paged-attention decode kernel: one program per
  (sequence, KV head[, split]), one KV block per loop step, broadcast-multiply-and-sum scores
  (``decode_teaching.py``). Same signature and errors as :func:`paged.kernels.paged_attention_decode`,
  the tuned kernel that the engine runs; :func:`launch_teaching_decode` skips the checks.
* :func:`softmax`, :func:`online_softmax` -- the warm-up row-softmax kernels (``row_softmax.py``).
* :func:`online_softmax_update`, :func:`merge_splits` -- the online-softmax state in PyTorch: one block
  folded in, split-K partials merged (``softmax_state.py``; chapter 04 falls back on them).
* :func:`reshape_and_cache` -- write new keys/values into the KV pool by slot mapping (``cache_ops.py``;
  the engine does the same write with ``index_copy_`` in ``paged/worker/kv_cache.py``).

They import ``paged.kernels._triton`` first, so the interpreter is set up (``TRITON_INTERPRET=1`` without
a GPU) before any of them is defined.

Sub-package ``kernel_lab`` owns these teaching kernels; it imports only the engine and never another
``paged_course`` sub-package.
"""

from .cache_ops import reshape_and_cache
from .decode_teaching import launch_teaching_decode, teaching_decode
from .row_softmax import online_softmax, softmax
from .softmax_state import merge_splits, online_softmax_update

__all__ = [
    "launch_teaching_decode",
    "merge_splits",
    "online_softmax",
    "online_softmax_update",
    "reshape_and_cache",
    "softmax",
    "teaching_decode",
]
