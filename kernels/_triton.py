"""Triton availability and mode, decided once, before any kernel in this package is defined.

* A CUDA GPU and Triton: kernels compile for the GPU.
* No CUDA GPU (this course's CPU setting): ``TRITON_INTERPRET=1`` is set *before* any ``@triton.jit``
  runs, because Triton reads the variable when a kernel is decorated, not when it is launched. Every
  program of the grid then runs one after another in Python/NumPy: slow, tiny shapes only, but the
  same kernel source. Autotuning and ``triton.testing.do_bench`` need a GPU and are never used here.
* No Triton at all (macOS and Windows have no wheels): ``HAS_TRITON`` is False, the kernel modules
  still import, and every entry point raises :class:`TritonUnavailableError` naming the reason.
* ``PAGED_TRITON_COMPILE_ONLY=1`` in the environment (set by the compile report,
  ``paged_course.bench.kernel_compile``, in a child process of its own): no interpreter even without a GPU,
  so the kernels are decorated in compiled mode and can be compiled for a GPU target (``triton.compile``),
  never launched. ``MODE`` is then ``"compile only"``.

Every kernel module does ``from ._triton import triton, tl, HAS_TRITON`` first.
"""

from __future__ import annotations

import functools
import os
import platform
import sys

import torch

HAS_CUDA: bool = torch.cuda.is_available()
COMPILE_ONLY: bool = os.environ.get("PAGED_TRITON_COMPILE_ONLY", "0") not in ("", "0")
if COMPILE_ONLY:
    os.environ.pop("TRITON_INTERPRET", None)  # a parent process may have set it for itself
elif not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first @triton.jit in this process


def _reimport_triton_for_interpreter() -> None:
    """Triton decorates its own helpers (``tl.zeros``, ``tl.sum``, ``tl.cdiv``...) when it is imported; if
    that happened before ``TRITON_INTERPRET=1`` was set, they are compiled-mode objects that the
    interpreter cannot call. Drop the Python modules of triton (not its native extension) so that the
    next import re-decorates them in interpreter mode. CPU-only processes only."""
    try:
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    if isinstance(getattr(standard, "zeros", None), InterpretedFunction):
        return  # imported in interpreter mode already
    for name in [
        n
        for n in sys.modules
        if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")
    ]:
        del sys.modules[name]


if not HAS_CUDA and not COMPILE_ONLY and "triton" in sys.modules:
    _reimport_triton_for_interpreter()

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    REASON = ""
except ImportError as err:  # pragma: no cover - Linux CI always has triton

    class _Missing:
        """Stands in for ``triton`` / ``triton.language`` so kernel modules still import."""

        def __getattr__(self, name):
            return None

    triton = _Missing()
    tl = _Missing()
    HAS_TRITON = False
    REASON = (
        f"Triton is not installed ({err}). Triton publishes wheels for Linux only (this machine runs "
        f"{platform.system() or 'an unknown OS'}); without it the Triton kernels cannot run. The PyTorch "
        "references in paged_course.reference compute the same results."
    )

INTERPRET: bool = HAS_TRITON and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
MODE: str = (
    "unavailable"
    if not HAS_TRITON
    else "interpreter (CPU)"
    if INTERPRET
    else "compile only"
    if COMPILE_ONLY and not HAS_CUDA
    else "compiled (GPU)"
)


class TritonUnavailableError(RuntimeError):
    """Raised by every kernel entry point when Triton cannot run on this machine."""


def require_triton() -> None:
    """Raise :class:`TritonUnavailableError` with the reason when Triton is missing."""
    if not HAS_TRITON:
        raise TritonUnavailableError(REASON)


# ``triton.jit`` when Triton is present; otherwise the plain function (never launched)
jit = triton.jit if HAS_TRITON else (lambda fn: fn)


def upcast_bf16_in_interpreter(launch):
    """Wrap a launcher ``launch(query, key_cache, value_cache, ...)``: in the interpreter, bf16 inputs run
    as fp32 copies and the output is cast back (Triton issue 11584: there bf16 ``tl.dot`` multiplies raw
    bit patterns); everywhere else the call goes through unchanged."""

    @functools.wraps(launch)
    def wrapper(query, key_cache, value_cache, *args, **kwargs):
        if INTERPRET and query.dtype == torch.bfloat16:
            out = launch(query.float(), key_cache.float(), value_cache.float(), *args, **kwargs)
            return out.to(torch.bfloat16)
        return launch(query, key_cache, value_cache, *args, **kwargs)

    return wrapper


def kernel_device(*tensors: torch.Tensor) -> torch.device:
    """Check that the tensors share one device Triton can use here, and return it.

    Compiled mode needs CUDA tensors; the interpreter needs CPU tensors.
    """
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(
            f"all tensors must be on one device, got {sorted(str(d) for d in devices)}"
        )
    device = devices.pop()
    if INTERPRET and device.type != "cpu":
        raise ValueError(
            f"Triton runs in interpreter mode here, so tensors must be on the CPU, got {device}"
        )
    if not INTERPRET and device.type != "cuda":
        raise ValueError(f"compiled Triton kernels need CUDA tensors, got {device}")
    return device
