"""``python -m paged doctor`` checks the toolchain; ``python -m paged info`` prints versions and the device.

doctor prints OS, Python, torch, transformers, Triton, the device and the Triton mode (GPU, interpreter
on CPU, or unavailable on macOS/Windows), then compiles and runs a tiny vector-add kernel to prove the
toolchain works. Exit code 0 when everything the course needs works on this machine (Triton missing on
macOS/Windows is reported but is not an error: those chapters' Triton cells are skipped there).
"""

from __future__ import annotations

import os
import platform
import sys
import time


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken on import
        return None


def environment() -> dict[str, str]:
    """Versions and the device, as printed by ``info``: the benchmarks' record
    (:func:`paged_course.bench.environment`) in words."""
    from paged_course.bench import environment as record

    env = record()
    if env["cuda_devices"]:
        device = f"cuda ({env['device']}, {env['cuda_devices']} visible)"
    else:
        device = f"cpu ({env['cpu_count']} cores; no CUDA GPU)"
    return {
        "os": f"{env['os']} ({env['machine']})",
        "python": env["python"],
        "paged": env["paged"] or "?",
        "torch": env["torch"],
        "transformers": env["transformers"] or "missing",
        "triton": env["triton"] or "missing",
        "numpy": env["numpy"] or "missing",
        "device": device,
    }


def triton_mode() -> tuple[str, str]:
    """``(mode, explanation)``; mode is ``"gpu"``, ``"interpreter"`` or ``"unavailable"``."""
    import torch

    if _version("triton") is None:
        where = (
            "Triton has no wheels for this OS"
            if platform.system() != "Linux"
            else "pip install triton"
        )
        return "unavailable", (
            f"triton is not installed ({where}); Triton cells and tests are skipped, "
            "every other cell runs"
        )
    if torch.cuda.is_available():
        return "gpu", "kernels compile for the GPU"
    return (
        "interpreter",
        "no CUDA GPU: TRITON_INTERPRET=1 runs kernels in Python on CPU (tiny shapes only)",
    )


def run_vector_add(n: int = 1000) -> float:
    """Compile and run ``z = x + y`` with Triton; return the max abs error (raises if Triton fails)."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated, so set it first
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
        tl.store(z_ptr + offsets, x + y, mask=mask)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(n, generator=gen).to(device) for _ in range(2))
    z = torch.full_like(x, float("nan"))
    add_kernel[(triton.cdiv(n, 256),)](x, y, z, n, BLOCK=256)
    return float((z - (x + y)).abs().max())


def _print_env() -> None:
    for key, value in environment().items():
        print(f"{key:<13} {value}")


def info_main(argv: list[str]) -> int:
    _print_env()
    return 0


def main(argv: list[str]) -> int:
    _print_env()
    mode, why = triton_mode()
    print(f"{'triton mode':<13} {mode}: {why}")
    if mode == "unavailable":
        print(
            "\nOK for every chapter except the Triton cells (run those on Linux, e.g. Colab or a GPU box)."
        )
        return 0
    start = time.perf_counter()
    try:
        err = run_vector_add()
    except Exception as exc:  # report any toolchain failure in words, not a traceback
        print(f"{'kernel':<13} FAILED: vector add raised {type(exc).__name__}: {exc}")
        print(
            "Reinstall with `pip install -e .[dev]` (torch 2.13.0 + the triton it pins) and run again."
        )
        return 1
    ok = err == 0.0
    print(
        f"{'kernel':<13} vector add of 1000 floats ({mode}): max error {err:g}, "
        f"{time.perf_counter() - start:.2f} s -> {'OK' if ok else 'WRONG RESULT'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
