"""Reading what Triton compiled: the PTX and the cubin of one kernel, on a machine without a GPU.

:func:`load_sites` finds a kernel's ``tl.load`` calls in its source (and the pointer argument each starts
from); :func:`ptx_memory_ops` counts the PTX's global loads by operand and width (matched through the ``.loc``
line info), ``cp.async`` and TMA copies and tensor-core instructions; :func:`cubin_resources` reads
registers, stack and static shared memory with the ``cuobjdump`` inside the triton wheel;
:func:`occupancy` turns those into programs per SM. Plain parsing and arithmetic: it compiles nothing and
imports nothing of the course (``kernel_compile`` calls it).
"""

from __future__ import annotations

import ast
import inspect
import math
import os
import re
import subprocess
import tempfile
from pathlib import Path


def load_sites(fn) -> list[tuple[int, int, str]]:
    """``(first line, last line, operand)`` of each ``tl.load`` in a kernel's source, innermost first:
    the operand is the pointer argument its address starts from (``K + physical * stride ...`` -> ``"K"``).

    The loads of the ``@jit`` helpers the kernel calls from the same file count too (chapter 04's teaching
    kernel reads K and V inside ``walk_blocks``), under the helper's own parameter names: the course names
    a K or V pointer ``K`` / ``V`` in every kernel and helper."""
    path = inspect.getsourcefile(fn.fn)
    tree = ast.parse(Path(path).read_text())
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    todo, seen, sites = [fn.fn.__name__], set(), []
    while todo:
        name = todo.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        for node in ast.walk(funcs[name]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                todo.append(node.func.id)  # a helper defined in this file, read in its turn
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "load"
                and node.args
            ):
                base = node.args[0]
                while isinstance(base, (ast.BinOp, ast.Subscript, ast.Call, ast.Attribute)):
                    base = (
                        base.left if isinstance(base, ast.BinOp) else getattr(base, "value", base)
                    )
                    base = base.func if isinstance(base, ast.Call) else base
                sites.append((node.lineno, node.end_lineno, getattr(base, "id", "?")))
    return sorted(sites, key=lambda s: s[1] - s[0])


_VEC = re.compile(r"\.v(\d+)")
_BITS = re.compile(r"\.[bsuf](\d+)$")


def ptx_memory_ops(ptx: str, source: str, sites: dict) -> dict:
    """Count the PTX's global loads (by operand and width in bytes), ``cp.async`` copies, TMA copies and
    matrix instructions. A load belongs to the ``tl.load`` whose source lines hold the ``.loc`` (line info)
    it carries; one the compiler moved elsewhere (a scalar merged into later code) counts as ``"other"``."""
    files = {
        m.group(1): os.path.realpath(m.group(2))
        for m in re.finditer(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M)
    }
    source = os.path.realpath(source)
    loads: dict[str, dict[str, int]] = {}
    counts = {"cp_async": 0, "tma": 0, "mma": 0, "wgmma": 0}
    here = None
    for raw in ptx.splitlines():
        line = raw.strip()
        if line.startswith(".loc"):
            f, row = line.split()[1:3]
            here = int(row) if files.get(f) == source else None
            continue
        op = line.split("@", 1)[-1].split()[1:2] if line.startswith("@") else line.split()[:1]
        op = op[0] if op else ""
        width = None
        if op.startswith("ld.global"):
            vec = _VEC.search(op)
            bits = _BITS.search(op)
            width = (int(vec.group(1)) if vec else 1) * (int(bits.group(1)) // 8 if bits else 0)
        elif op.startswith("cp.async.bulk.tensor"):
            counts["tma"] += 1
        elif re.match(r"cp\.async\.c[ag]\.shared\.global", op):
            counts["cp_async"] += 1
            width = int(line.rstrip(";").split(",")[2].strip(), 0)
        elif op.startswith("mma.sync"):
            counts["mma"] += 1
        elif op.startswith("wgmma.mma_async"):
            counts["wgmma"] += 1
        if width is not None:
            operand = next((v for lo, hi, v in sites if here and lo <= here <= hi), "other")
            by_width = loads.setdefault(operand, {})
            by_width[str(width)] = by_width.get(str(width), 0) + 1
    return {"loads": loads, **counts}


def cubin_resources(cubin: bytes) -> dict:
    """``REG``, ``STACK``, ``SHARED`` (static), ``LOCAL`` of the cubin's kernel, by the wheel's cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {k: int(v) for k, v in found.items()}


def occupancy(spec, registers: int, shared: int, num_warps: int) -> dict:
    """Programs of ``num_warps`` warps one SM holds, by each limit (registers are allocated per warp in
    units of 256; each program costs 1 KB of shared memory reserved by the driver on sm_80 and later)."""
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    limits = {
        "registers": spec.regs_per_sm // per_warp // num_warps,
        "shared memory": spec.smem_per_sm // (shared + 1024),
        "warps": spec.max_warps_per_sm // num_warps,
    }
    by = min(limits, key=limits.get)
    return {"programs_per_sm": limits[by], "limited_by": by, "limits": limits}
