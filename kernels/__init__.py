"""The engine's Triton kernels for paged attention, imported as ``paged.kernels`` (the folder is ``kernels/``).

* :func:`paged_attention_decode` -- decode attention through block tables: the GQA group in ``tl.dot``'s
  rows, KV tiles spanning several blocks, software pipelining, split-K with a chosen split count
  (``paged_attention.py``; the split merge in ``split_merge.py``); same signature as the PyTorch reference
  in ``paged_course.reference``. :func:`launch_decode` is the same without input validation (no host
  sync), for the engine's step loop; :func:`validate_decode_inputs` is the one boundary check
  (``decode_inputs.py``).
* :func:`launch_prefill` -- every prompt chunk of a step in one launch: new tokens attend causally to their
  own chunk and to their cached context, through block tables (``prefill_attention.py``).
* ``launch_config.py`` -- the launch configs per GPU (:data:`GPUS`: A100, H100, H200), used by every
  launch and by the compile report: :func:`choose_num_splits` (the split rule), ``decode_config``,
  ``prefill_config``.

The teaching kernels of chapter 04 (the first decode kernel, the row softmax, ``reshape_and_cache``) live
in ``paged_course.kernel_lab``. Without a CUDA GPU the package sets ``TRITON_INTERPRET=1`` before defining
any kernel, so the kernels run (slowly) on CPU tensors; without Triton (macOS, Windows) every entry point
raises :class:`TritonUnavailableError` with the reason; ``PAGED_TRITON_COMPILE_ONLY=1`` (the compile report's
child process) compiles for a GPU without one and launches nothing. ``MODE`` says which applies.
"""

from ._triton import (
    HAS_CUDA,
    HAS_TRITON,
    INTERPRET,
    MODE,
    REASON,
    TritonUnavailableError,
    require_triton,
)
from .decode_inputs import validate_decode_inputs
from .launch_config import GPUS, GpuSpec, choose_num_splits
from .paged_attention import launch_decode, paged_attention_decode
from .prefill_attention import launch_prefill

__all__ = [
    "HAS_CUDA",
    "HAS_TRITON",
    "INTERPRET",
    "MODE",
    "REASON",
    "TritonUnavailableError",
    "require_triton",
    "paged_attention_decode",
    "launch_decode",
    "validate_decode_inputs",
    "choose_num_splits",
    "GPUS",
    "GpuSpec",
    "launch_prefill",
]
