r"""What the compiler makes of every Triton kernel the engine launches, for an A100 (sm_80) and an H200 (sm_90),
on a machine without a GPU: ``python -m paged bench kernel --compile [--out DIR] [--jobs N] [--update-static]``.

**How.** Triton compiles for a GPU without one: ``triton.compile(ASTSource(...), target=GPUTarget("cuda",
80, 32))`` produces PTX and a cubin, and the ``cuobjdump`` inside the triton wheel reads the cubin's
registers, stack (spills) and static shared memory. The kernels must be decorated in compiled mode, and
without CUDA ``paged.kernels`` forces the interpreter at import, so the compiling happens in child
processes started with ``PAGED_TRITON_COMPILE_ONLY=1``. A child runs the engine's own attention step
(``paged.worker.attention.paged_attention_forward`` on ``AttentionMetadata.build``'s tensors, with the
decode and prefill functions the engine's ``Parts`` pick for a CUDA device) with every kernel launch
captured instead of run, and :func:`compiling_for` (setting ``paged.kernels.launch_config.compile_target``)
telling the launches which GPU they configure themselves for. Each captured launch then goes through the
JIT's own binder (the function Triton builds to specialise a launch: 16-byte aligned pointers and
integers divisible by 16 get ``tt.divisibility = 16``, an integer equal to 1 becomes a constant) and the
JIT's own option parser, for that GPU's target. So the signature, the specialisation, the tile sizes and ``num_warps`` /
``num_stages`` are those a launch on that GPU would compile: nothing here restates them.

**What.** Every configuration the engine launches: fp16 and bf16, head dim 64 and 128, GQA group 1, 4
and 8 (32 query heads), block size 16 and 32, for the decode kernel single-pass (batch 64, context
4,096) and split-K (batch 1, context 8,192) with its merge kernel, and for the prefill kernel (two
chunks of a step). Per compiled kernel: registers per thread, stack bytes (local memory: spills), shared
memory (the launch's dynamic allocation plus static), global loads by width and by the tensor they read
(from the PTX's ``.loc`` line info, matched to the kernel's ``tl.load`` calls), ``cp.async`` and TMA
(``cp.async.bulk.tensor``) copies, ``mma.sync`` and ``wgmma`` instructions, and the programs an SM can
hold by registers, shared memory and warps (occupancy: arithmetic on the compiler's numbers and the
SM's limits from ``paged.kernels.GPUS``, not a measurement). Writes ``kernels.json`` and ``kernels.md``
into ``--out``; ``--update-static`` also into ``docs/gpu/static/`` (the committed report).

**Checks** (exit 1, each failure named): a compile error; a spill (stack > 0); a K or V tile load
narrower than 16 bytes (block-table gathers and scalars are narrow by nature and do not count); fewer
16-byte K/V loads or fewer ``cp.async`` than the committed report at the same configuration (unless
``--update-static``).

This module captures, specialises and compiles; reading the PTX and cubin is ``kernel_asm``'s job, the
checks and the report's text ``kernel_compile_report``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paged_course.bench.kernel_asm import cubin_resources, load_sites, occupancy, ptx_memory_ops
from paged_course.bench.kernel_compile_report import (
    TARGETS,
    check,
    dump,
    error_text,
    report_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "docs" / "gpu" / "static"
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)
GROUPS = (1, 4, 8)
BLOCK_SIZES = (16, 32)
HEADS = 32
NUM_BLOCKS = 8  # the pool's size is no part of a kernel's specialisation: tables reuse these blocks
STEPS = {  # step -> (context length, new tokens) of each sequence
    "decode": [(4096, 1)] * 64,  # batch 64 fills the GPU: one pass
    "decode_split": [(8192, 1)],  # batch 1: split-K and the merge kernel
    "prefill": [(1024, 512), (384, 384)],  # a chunk with cached context and a whole prompt
}
# the report's order: the engine's kernels (by kernel, then GPU), then chapter 04's (by GPU)
_ORDER = {"decode": 0, "decode_split": 1, "merge": 2, "prefill": 3}
_ORDER.update({"teaching": 4, "tuned": 5, "tuned, no hints": 6})  # then the learner's kernel


@contextlib.contextmanager
def compiling_for(spec):
    """Within the block every launch configures itself for ``spec`` (a ``GpuSpec``), through
    ``paged.kernels.launch_config.compile_target``: compile-only processes only (the report captures the
    launches and compiles them for that GPU; nothing runs)."""
    from paged.kernels import launch_config
    from paged.kernels._triton import COMPILE_ONLY

    if not COMPILE_ONLY:
        raise RuntimeError(
            "compiling_for needs PAGED_TRITON_COMPILE_ONLY=1 (a compile-only process)"
        )
    previous, launch_config.compile_target = launch_config.compile_target, spec
    try:
        yield spec
    finally:
        launch_config.compile_target = previous


def engine_configs() -> list[dict]:
    """Every (GPU, dtype, head dim, group, block size) the report compiles the engine's steps at."""
    return [
        {"gpu": gpu, "dtype": dtype, "head_dim": d, "group": g, "block_size": bs}
        for gpu in TARGETS
        for dtype in DTYPES
        for d in HEAD_DIMS
        for g in GROUPS
        for bs in BLOCK_SIZES
    ]


# ---------------------------------------------------------------------------- child: capture and compile


@contextlib.contextmanager
def captured_launches():
    """Within the block, ``kernel[grid](*args, **kwargs)`` records ``(kernel, grid, args, kwargs)`` in the
    yielded list instead of compiling and launching (compile-only processes)."""
    from triton.runtime.jit import JITFunction

    launches, original = [], JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, tuple(grid), args, kwargs))

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


def engine_step(
    step: str, dtype: str, head_dim: int, group: int, block_size: int, device: str = "cpu"
) -> list:
    """The kernel launches of one layer's attention in an engine step on CUDA, captured, not run.

    Builds the step as the engine does (``KVCache``, ``AttentionMetadata.build``) and calls the engine's
    attention function with ``query [1, H, T, D]`` as a Llama layer passes it (contiguous after rotary).
    ``device="cpu"`` in a compile-only child; ``"cuda"`` on a GPU (the same launches, real tensors)."""
    from types import SimpleNamespace

    import torch

    from paged.kernels import launch_decode, launch_prefill
    from paged.worker.attention import (
        AttentionBackend,
        AttentionMetadata,
        paged_attention_forward,
        write_kv,
    )
    from paged.worker.kv_cache import KVCache

    kv_heads, torch_dtype = HEADS // group, getattr(torch, dtype)
    kv = KVCache(2, NUM_BLOCKS, block_size, kv_heads, head_dim, torch_dtype, device)
    seqs = STEPS[step]
    tables = [[b % NUM_BLOCKS for b in range(-(-ctx // block_size))] for ctx, _ in seqs]
    meta = AttentionMetadata.build(
        tables, [ctx for ctx, _ in seqs], [q for _, q in seqs], block_size, device
    )
    backend = AttentionBackend(kv, write_kv, launch_prefill, launch_decode)  # as on CUDA
    tokens = sum(q for _, q in seqs)
    query = torch.zeros(1, HEADS, tokens, head_dim, dtype=torch_dtype, device=device)
    key = torch.zeros(1, kv_heads, tokens, head_dim, dtype=torch_dtype, device=device)
    with captured_launches() as launches:
        paged_attention_forward(
            SimpleNamespace(layer_idx=1),
            query,
            key,
            key.clone(),
            None,
            None,
            paged_metadata=meta,
            paged_backend=backend,
        )
    return launches


def specialise(launch, arch: int, hints: bool = True):
    """``(ASTSource, target, options)`` of a captured launch, as the JIT builds them at a launch on a GPU
    of compute capability ``arch`` (``hints=False`` drops every ``tt.divisibility``: what the same source
    compiles to when Triton knows nothing of its pointers' alignment)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn, _, args, kwargs = launch
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug  # as JITFunction.run
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound, specialization, options
    )
    if not hints:
        attrs = {k: [a for a in v if a[0] != "tt.divisibility"] for k, v in attrs.items()}
    return ASTSource(fn, signature, constexprs, attrs), target, options


def compile_launch(launch, gpu: str, hints: bool = True) -> dict:
    """Compile one captured launch for ``gpu`` (a key of ``paged.kernels.GPUS``) and read what came out."""
    import triton

    from paged.kernels import GPUS

    fn, grid, args, kwargs = launch
    start = time.perf_counter()
    row = {
        "function": fn.fn.__name__,
        "gpu": gpu,
        "arch": f"sm_{TARGETS[gpu]}",
        "grid": list(grid),
        "launch": {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")},
        "num_splits": dict(zip(fn.arg_names, args)).get("num_splits"),
        "hints": hints,
    }
    try:
        src, target, options = specialise(launch, TARGETS[gpu], hints)
        row["signature"] = {k: v for k, v in src.signature.items() if v != "constexpr"}
        row["divisible_by_16"] = sorted(
            fn.arg_names[k[0]] for k, v in src.attrs.items() if ["tt.divisibility", 16] in v
        )
        row["constants"] = {fn.arg_names[k[0]]: v for k, v in src.constants.items()}
        row.update(num_warps=options.num_warps, num_stages=options.num_stages)
        kernel = triton.compile(src, target=target, options=options.__dict__)
    except Exception as exc:  # noqa: BLE001 - a compile error is a result of the report
        row["error"] = error_text(exc)
        return row
    res = cubin_resources(kernel.asm["cubin"])
    shared = kernel.metadata.shared + res.get("SHARED", 0)
    row.update(
        registers=res.get("REG"),
        stack_bytes=res.get("STACK", 0) + res.get("LOCAL", 0),
        shared_bytes=shared,
        **ptx_memory_ops(kernel.asm["ptx"], inspect.getsourcefile(fn.fn), load_sites(fn)),
        occupancy=occupancy(GPUS[gpu], res.get("REG", 0), shared, options.num_warps),
        compile_s=round(time.perf_counter() - start, 2),
    )
    return row


def _kernel_name(step: str, function: str) -> str:
    return {"_merge_splits_kernel": "merge"}.get(function, step)


def compile_job(job: dict) -> list[dict]:
    """Rows for one engine configuration: every kernel of each step in :data:`STEPS`, compiled once."""
    from paged.kernels.launch_config import GPUS

    rows, seen = [], set()
    shape = {k: job[k] for k in ("dtype", "head_dim", "group", "block_size")}
    with compiling_for(GPUS[job["gpu"]]):
        for step in STEPS:
            for launch in engine_step(step, **shape):
                row = compile_launch(launch, job["gpu"])
                name = _kernel_name(step, row["function"])
                key = row_id({**shape, **row, "kernel": name})
                if key not in seen:
                    seen.add(key)
                    rows.append({"id": key, "kernel": name, **shape, **row})
                    print(_progress(rows[-1]), file=sys.stderr, flush=True)
    return rows


def row_id(row: dict) -> str:
    """A configuration's name: kernel, GPU, dtype, head dim, and the group and block size, or for the
    merge kernel (which sees neither) the padded split count."""
    base = f"{row['kernel']}:{row['gpu']}:{row['dtype']}:d{row['head_dim']}"
    if row["kernel"] == "merge":
        return base + f":s{row['num_splits']}"
    return base + f":g{row['group']}:bs{row['block_size']}"


def _progress(row: dict) -> str:
    if "error" in row:
        return f"  {row['id']}: COMPILE ERROR {row['error'][:120]}"
    return (
        f"  {row['id']}: {row['registers']} regs, stack {row['stack_bytes']}, "
        f"smem {row['shared_bytes']}, {row['compile_s']} s"
    )


def variant_rows(
    step: str,
    gpu: str,
    dtype: str,
    head_dim: int,
    group: int,
    block_size: int,
    override: dict | None = None,
    hints: bool = True,
    name: str = "variant",
) -> list[dict]:
    """The first kernel of an engine step, compiled with its launch's keyword arguments updated by
    ``override`` (what ``launch_decode(..., config=override)`` passes; e.g. other tiles or warps) and with
    or without divisibility hints: the report's rows for a what-if, a fix being tried, a planted fault."""
    from paged.kernels.launch_config import GPUS

    with compiling_for(GPUS[gpu]):
        fn, grid, args, kwargs = engine_step(step, dtype, head_dim, group, block_size)[0]
    row = compile_launch((fn, grid, args, {**kwargs, **(override or {})}), gpu, hints)
    shape = {"dtype": dtype, "head_dim": head_dim, "group": group, "block_size": block_size}
    ident = f"{name}:{row_id({**shape, **row, 'gpu': gpu, 'kernel': step})}"
    return [{"id": ident, "kernel": step, "variant": name, "override": override, **shape, **row}]


LAB_SHAPE = {
    "dtype": "float16",
    "head_dim": 128,
    "group": 4,
    "block_size": 16,
}  # a Llama-3-8B layer


def lab_rows(gpu: str, impl: str | None = "exercises") -> list[dict]:
    """Chapter 04's kernels at the engine's decode step of batch 64, context 4,096 (fp16, 32 query heads
    over 8 KV heads of dim 128, block size 16), compiled for ``gpu``: the teaching kernel
    (``paged_course.kernel_lab``), the tuned kernel with and without divisibility hints, and the learner's
    kernel of ``<impl>/ex04_fast_decode.py`` (an error row when it does not import or compile)."""
    from paged.kernels.launch_config import GPUS
    from paged_course.kernel_lab import launch_teaching_decode

    with compiling_for(GPUS[gpu]):
        tuned = engine_step("decode", **LAB_SHAPE)[0]
        query, key_cache, value_cache, block_tables, context_lens = tuned[2][:5]
        inputs = (query, key_cache, value_cache, block_tables, context_lens)
        sides = [("teaching", lambda: launch_teaching_decode(*inputs))]
        if impl:
            sides.append(("yours", lambda: _learner(impl).launch_learner_decode(*inputs)))
        launches = {"tuned": [tuned]}
        for name, call in sides:
            try:
                with captured_launches() as launches[name]:
                    call()
            except Exception as exc:  # noqa: BLE001 - a learner's file in progress is a result too
                launches[name] = f"{type(exc).__name__}: {exc}"
    rows = []
    for name, hints in (("teaching", True), ("tuned", True), ("tuned", False), ("yours", True)):
        found = launches.get(name)
        if found is None:
            continue
        label = name if hints else "tuned, no hints"
        if name == "yours" and impl != "exercises":
            label = f"{Path(impl).name}/ex04_fast_decode"
        row = compile_launch(found[0], gpu, hints) if isinstance(found, list) else {"error": found}
        rows.append({"id": f"lab:{label}:{gpu}", "kernel": label, "gpu": gpu, **LAB_SHAPE, **row})
    return rows


def compile_lab(
    impl: str | None = "exercises", gpus=tuple(TARGETS), prefill: bool = True, timeout: float = 1800
) -> list[dict]:
    """Chapter 04: :func:`lab_rows` for each of ``gpus`` and, with ``prefill``, the prefill kernel at head
    dim 128 (fp16) with the engine's tiles and with 64 x 64 (``kernel`` ``"prefill 64 x 64"``), compiled
    in one compile-only child process (this process may have decorated the kernels for the interpreter).
    About 10-30 s the first time; Triton's cache (``~/.triton/cache``) serves what it compiled before.
    Raises RuntimeError when the child fails or runs past ``timeout`` seconds."""
    jobs = [{"call": f"{__name__}:lab_rows", "kwargs": {"gpu": g, "impl": impl}} for g in gpus]
    for gpu in gpus if prefill else ():
        for override, name in ((None, "prefill"), ({"BLOCK_N": 64}, "prefill 64 x 64")):
            kwargs = {
                "step": "prefill",
                "gpu": gpu,
                **LAB_SHAPE,
                "override": override,
                "name": name,
            }
            jobs.append({"call": f"{__name__}:variant_rows", "kwargs": kwargs})
    rows = compile_in_children(jobs, processes=1, timeout=timeout)
    for row in rows:
        row["kernel"] = row.get("variant", row["kernel"])
    return rows


def _learner(impl: str):
    """``<impl>/ex04_fast_decode.py``: ``impl`` names a package of this checkout (``exercises``,
    ``solutions``) or a folder anywhere (a copy of ``solutions/`` with a planted wrong answer)."""
    import importlib

    folder = Path(impl) if Path(impl).is_absolute() else ROOT / impl
    if str(folder.parent) not in sys.path:
        sys.path.insert(0, str(folder.parent))
    return importlib.import_module(f"{folder.name}.ex04_fast_decode")


def _child(jobs_path: str, out_path: str) -> None:
    jobs = json.loads(Path(jobs_path).read_text())
    rows = []
    for job in jobs:
        rows += job_rows(job)
    Path(out_path).write_text(json.dumps(rows))


def job_rows(job: dict) -> list[dict]:
    """Dispatch one child job: an engine configuration, or ``{"call": "module:function", ...}``, a
    function of this child's choosing that returns rows (the lab's kernels, planted variants)."""
    if "call" in job:
        module, name = job["call"].split(":")
        return __import__(module, fromlist=[name]).__dict__[name](**job.get("kwargs", {}))
    return compile_job(job)


# ---------------------------------------------------------------------------- parent: run, check, write


def compile_in_children(jobs: list[dict], processes: int = 1, timeout: float = 1800) -> list[dict]:
    """Run ``jobs`` (see :func:`job_rows`) in ``processes`` child processes in compile-only mode; rows in
    job order. Raises RuntimeError with the child's output when a child fails (not for compile errors:
    those are rows)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(
        PAGED_TRITON_COMPILE_ONLY="1", TRITON_DEFAULT_FP_FUSION="1", TRITON_DISABLE_LINE_INFO="0"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # a cache of this checkout's own: a cache shared with another checkout holds kernels whose line
    # info names that checkout's files, which the K/V-load classification cannot place
    env["TRITON_CACHE_DIR"] = str(ROOT / "out" / "triton-compile-cache")
    processes = max(1, min(processes, len(jobs)))
    parts = [jobs[i::processes] for i in range(processes)]
    with tempfile.TemporaryDirectory() as tmp:
        children = []
        for i, part in enumerate(parts):
            jobs_path, out_path = Path(tmp) / f"jobs{i}.json", Path(tmp) / f"rows{i}.json"
            jobs_path.write_text(json.dumps(part))
            cmd = [sys.executable, "-m", "paged_course.bench.kernel_compile", "--child"]
            children.append(
                (
                    subprocess.Popen([*cmd, str(jobs_path), str(out_path)], env=env, cwd=ROOT),
                    out_path,
                )
            )
        deadline = time.monotonic() + timeout
        for proc, _ in children:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"compiling ran past {timeout:.0f} s: the child was stopped"
                ) from None
        failed = [proc.returncode for proc, _ in children if proc.returncode]
        if failed:
            raise RuntimeError(f"a compile child exited with {failed} (its traceback is above)")
        per_part = [json.loads(out.read_text()) for _, out in children]
    rows = {row["id"]: row for part in per_part for row in part}  # a merge kernel serves many
    return sorted(rows.values(), key=_sort_key)


def _sort_key(row: dict) -> tuple:
    config = (row["dtype"] != "float16", row["head_dim"], row.get("group"), row.get("block_size"))
    order = (list(TARGETS).index(row["gpu"]), _ORDER.get(row["kernel"], 9))
    if row["kernel"] in ("decode", "decode_split", "merge", "prefill"):
        order = order[::-1]  # the engine's kernels by kernel, then GPU; the lab's by GPU
    return (
        (*order, *config, row.get("num_splits") or 0)
        if row["kernel"] != "merge"
        else (*order, *config[:2], row.get("num_splits") or 0)
    )


STEPS_TEXT = (
    "decode: 64 sequences of context 4,096 (one pass) and 1 of context 8,192 (split-K and the merge "
    "kernel); prefill: a 512-token chunk after 512 cached tokens and a 384-token prompt, in one launch"
)


def main(out: Path, processes: int | None = None, update_static: bool = False) -> int:
    """``python -m paged bench kernel --compile``: compile, print, write, check; 0 when every check passes."""
    out = Path(out)
    baseline_path = STATIC / "kernels.json"
    baseline = json.loads(baseline_path.read_text())["rows"] if baseline_path.exists() else None
    jobs = engine_configs()
    jobs += [
        {"call": f"{__name__}:lab_rows", "kwargs": {"gpu": g, "impl": "solutions"}} for g in TARGETS
    ]
    processes = processes or max(1, min(4, os.cpu_count() or 1))
    print(
        f"compiling the engine's kernels at {len(jobs) - len(TARGETS)} configurations and chapter 04's "
        f"lab kernels for {', '.join(f'{g} (sm_{a})' for g, a in TARGETS.items())} in {processes} "
        "process(es)",
        flush=True,
    )
    start = time.perf_counter()
    rows = compile_in_children(jobs, processes)
    seconds = time.perf_counter() - start
    lab = [r for r in rows if r["id"].startswith("lab:")]
    rows = [r for r in rows if not r["id"].startswith("lab:")]
    report = {
        "what": "static: compiled for GPU targets on a machine without a GPU; nothing was run",
        "triton": _triton_version(),
        "targets": {g: f"sm_{a}" for g, a in TARGETS.items()},
        "steps_text": STEPS_TEXT,
        "compile_seconds": round(seconds, 1),
        "rows": rows,
        "lab": lab,
        "problems": check(rows, None if update_static else baseline),
    }
    text = report_markdown(report)
    for folder in [out] + ([STATIC] if update_static else []):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernels.json").write_text(dump(report))
        (folder / "kernels.md").write_text(text)
    print(text)
    print(
        f"{len(rows) + len(lab)} kernels compiled in {seconds:.0f} s; written to {out}/kernels.json, kernels.md"
    )
    problems = report["problems"]
    print("compile report: " + (f"{len(problems)} problem(s)" if problems else "all checks pass"))
    return 1 if problems else 0


def _triton_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("JOBS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
