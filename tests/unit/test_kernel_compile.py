"""The compile report (``python -m paged bench kernel --compile``, ``paged_course/bench/kernel_compile.py``).

Quick tests check its parts on hand-made input: which ``tl.load`` a PTX load belongs to, the widths it reads,
occupancy arithmetic, every check and the table. The ``slow`` tests (run by ``.ci/run`` after the report)
compile for real in a compile-only child process and prove that the checks bite: a planted spill (a decode
tile of 512 tokens) and a planted compile error the interpreter accepts (a KV tile of 8 tokens: ``tl.dot``
needs 16 on a GPU) both fail, while the engine's own configuration passes.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from paged import kernels
from paged.kernels.launch_config import GPUS
from paged_course.bench import kernel_asm
from paged_course.bench import kernel_compile as kc
from paged_course.bench import kernel_compile_report as kreport

if not kernels.HAS_TRITON:  # pragma: no cover - Linux always has triton
    pytest.skip(kernels.REASON, allow_module_level=True)

SOURCE = textwrap.dedent(
    """\
    def kernel(K, BT, O):
        physical = tl.load(BT + 3)
        k = tl.load(
            K
            + physical * 16,
        )
        tl.store(O, k)
    """
)


class _Fn:  # what load_sites reads of a JITFunction: .fn, the Python function
    def __init__(self, path):
        namespace = {}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        self.fn = namespace["kernel"]


def test_loads_are_attributed_to_their_tl_load_by_line_info(tmp_path):
    path = tmp_path / "k.py"
    path.write_text(SOURCE)
    sites = kernel_asm.load_sites(_Fn(path))
    assert sorted(sites) == [(2, 2, "BT"), (3, 6, "K")]
    ptx = textwrap.dedent(
        f"""\
        .loc 1 2 16
        ld.global.b32 {{ %r1 }}, [ %rd1 + 0 ];
        .loc 1 5 13
        @%p1 cp.async.cg.shared.global [ %r2 + 0 ], [ %rd2 + 0 ], 0x10, %r3;
        @%p1 cp.async.ca.shared.global [ %r2 + 0 ], [ %rd2 + 0 ], 0x4, %r3;
        .loc 1 3 9
        @%p2 ld.global.v4.b32 {{ %r4, %r5, %r6, %r7 }}, [ %rd3 + 0 ];
        ld.global.v2.b16 {{ %h1, %h2 }}, [ %rd3 + 0 ];
        cp.async.commit_group;
        .loc 1 9 1
        ld.global.b16 {{ %h3 }}, [ %rd4 + 0 ];
        mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{ %r1 }}, {{ %r2 }}, {{ %r3 }}, {{ %r4 }};
        .loc 2 3 1
        wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {{ %r1 }}, %rd1, %rd2;
        ld.global.b32 {{ %r9 }}, [ %rd5 + 0 ];
        .file 1 "{path}"
        .file 2 "/elsewhere/standard.py"
        """
    )
    ops = kernel_asm.ptx_memory_ops(ptx, str(path), sites)
    # K: the v4.b32 load and the 16-byte cp.async (16 bytes), the v2.b16 load and the 4-byte cp.async;
    # "other": line 9 and a line of another file are no tl.load of the kernel
    assert ops["loads"]["K"] == {"16": 2, "4": 2} and ops["loads"]["BT"] == {"4": 1}
    assert ops["loads"]["other"] == {"2": 1, "4": 1}
    assert (ops["cp_async"], ops["mma"], ops["wgmma"], ops["tma"]) == (2, 1, 1, 0)


def test_loads_inside_a_helper_the_kernel_calls_count_under_the_helpers_names(tmp_path):
    """Chapter 04's teaching kernel reads K and V inside a ``@jit`` helper of its file (``walk_blocks``)."""
    path = tmp_path / "k.py"
    path.write_text(
        "def walk(K, V, n):\n"
        "    return tl.load(K + n) + tl.load(V + n)\n"
        "\n"
        "\n"
        "def kernel(K, V, BT, O):\n"
        "    physical = tl.load(BT)\n"
        "    tl.store(O, walk(K, V, physical))\n"
        "\n"
        "\n"
        "def unused(Q):\n"
        "    return tl.load(Q)\n"
    )
    assert sorted(kernel_asm.load_sites(_Fn(path))) == [(2, 2, "K"), (2, 2, "V"), (6, 6, "BT")]


def test_occupancy_arithmetic():
    """116 registers x 128 threads: 3,840 per warp (15 units of 256), 17 warps per SM -> 4 programs;
    39,168 + 1,024 bytes of shared memory: 4 programs in 164 KB; 16 by warps."""
    occ = kernel_asm.occupancy(GPUS["A100"], 116, 39168, 4)
    assert occ["limits"] == {"registers": 4, "shared memory": 4, "warps": 16}
    assert occ["programs_per_sm"] == 4
    spilled = kernel_asm.occupancy(GPUS["H200"], 255, 57344, 4)
    assert spilled["limits"]["registers"] == 2 and spilled["limited_by"] == "registers"
    assert kernel_asm.occupancy(GPUS["H200"], 24, 2048, 4)["limited_by"] == "warps"


def _row(**kw) -> dict:
    row = {
        "id": "decode:A100:float16:d128:g4:bs16",
        "kernel": "decode",
        "gpu": "A100",
        "dtype": "float16",
        "head_dim": 128,
        "group": 4,
        "block_size": 16,
        "launch": {"BLOCK_M": 16, "BLOCK_N": 64},
        "num_warps": 4,
        "num_stages": 3,
        "num_splits": 1,
        "registers": 116,
        "stack_bytes": 0,
        "shared_bytes": 39168,
        "loads": {"K": {"16": 16}, "V": {"16": 16}, "BT": {"4": 3}},
        "cp_async": 35,
        "tma": 0,
        "mma": 32,
        "wgmma": 0,
        "occupancy": kernel_asm.occupancy(GPUS["A100"], 116, 39168, 4),
    }
    return {**row, **kw}


def test_checks_name_every_failure_and_pass_a_good_row():
    good = _row()
    assert kreport.check([good], [good]) == []
    assert kreport.kv_loads(good) == {"wide": 32, "narrow": 0}, "block-table gathers do not count"
    found = kreport.check(
        [
            _row(id="a", stack_bytes=16, registers=255),
            _row(id="b", loads={"K": {"16": 8, "2": 4}, "V": {"16": 8}}),
            _row(id="c", loads={"BT": {"4": 3}}),
            {"id": "d", "kernel": "decode", "error": "CompilationError: tl.dot needs N >= 16"},
            _row(id="e", loads={"K": {"16": 8}, "V": {"16": 8}}, cp_async=19),
        ],
        [_row(id="e")],
    )
    assert found[0] == "a: spills: 16 bytes of stack at 255 registers"
    assert found[1].startswith("b: 4 K/V tile loads narrower than 16 bytes")
    assert found[2].startswith("c: no 16-byte K/V tile load found")
    assert found[3] == "d: compile error: CompilationError: tl.dot needs N >= 16"
    assert found[4:] == [
        "e: 16 16-byte K/V loads, the committed report has 32",
        "e: 19 cp.async copies, the committed report has 35",
    ]
    merge = _row(id="m", kernel="merge", loads={"LSE": {"4": 9}, "O_PART": {"16": 8}})
    assert kreport.check([merge]) == [], "the merge kernel reads no K/V tile"


def test_row_ids_and_table():
    assert kc.row_id(_row()) == "decode:A100:float16:d128:g4:bs16"
    merge = _row(kernel="merge", num_splits=26, launch={"SPLITS_P2": 32})
    assert kc.row_id(merge) == "merge:A100:float16:d128:s26", "the merge kernel sees no group"
    text = kreport.markdown(
        [_row(), {**merge, "id": "m"}, {**_row(), "error": "CompilationError: x"}]
    )
    lines = text.splitlines()
    assert lines[0].startswith("| kernel | GPU |") and len(lines) == 5
    assert (
        "| decode | A100 (sm_80) | float16 | 128 | 4 | 16 | 16 x 64 | 4 / 3 | 116 | 0 | 38.2 |"
        in lines[2]
    )
    assert "| 32 / 0 | 35 | 0 | 32 / 0 | 4 (registers) |" in lines[2]
    assert "| - | - | 26 splits |" in lines[3] and "compile error: CompilationError: x" in lines[4]


def test_every_engine_configuration_is_compiled():
    configs = kc.engine_configs()
    assert len(configs) == 2 * 2 * 2 * 3 * 2 == 48
    assert {c["gpu"] for c in configs} == {"A100", "H200"} and kc.TARGETS == {
        "A100": 80,
        "H200": 90,
    }
    assert {(c["group"], c["block_size"]) for c in configs} == {
        (g, b) for g in (1, 4, 8) for b in (16, 32)
    }


def test_committed_report_passes_its_own_checks_and_covers_every_configuration():
    report = json.loads((kc.STATIC / "kernels.json").read_text())
    rows = report["rows"]
    assert report["problems"] == [] and kreport.check(rows, rows) == []
    ids = {r["id"] for r in rows}
    for c in kc.engine_configs():
        for kernel in ("decode", "decode_split", "prefill"):
            assert kc.row_id({**c, "kernel": kernel}) in ids
    assert {r["gpu"] for r in rows if r["kernel"] == "merge"} == {"A100", "H200"}
    lab = {r["kernel"] for r in report["lab"]}
    assert {"teaching", "tuned", "tuned, no hints"} <= lab
    assert (kc.STATIC / "kernels.md").read_text() == kreport.report_markdown(report)


# ---------------------------------------------------------------------------- compiled for real


def _variant(override: dict | None, name: str) -> dict:
    args = {"step": "decode", "gpu": "A100", "dtype": "float16", "head_dim": 128, "group": 4}
    return {
        "call": f"{kc.__name__}:variant_rows",
        "kwargs": {**args, "block_size": 16, "override": override, "name": name},
    }


@pytest.mark.slow
def test_planted_spill_and_planted_compile_error_fail_the_report():
    """The engine's decode configuration passes; a tile of 512 tokens spills; a KV tile of 8 tokens is a
    compile error (``tl.dot`` needs every dimension >= 16 on a GPU) although the interpreter runs it and
    gets the right answer."""
    from paged.kernels import launch_decode
    from paged_course.reference import paged_attention_gather

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 32, generator=gen)
    key_cache, value_cache = torch.randn(2, 6, 16, 2, 32, generator=gen).unbind(0)
    tables = torch.tensor([[0, 1, 2], [5, 4, 3]], dtype=torch.int32)
    lens = torch.tensor([40, 19], dtype=torch.int32)
    interpreted = launch_decode(
        query, key_cache, value_cache, tables, lens, None, 1, {"BLOCK_N": 8}
    )
    exact = paged_attention_gather(query, key_cache, value_cache, tables, lens)
    assert (interpreted - exact).abs().max() < 1e-4, "the interpreter accepts a KV tile of 8 tokens"

    rows = kc.compile_in_children(
        [
            _variant(None, "engine"),
            _variant({"BLOCK_N": 512, "num_stages": 1}, "planted-spill"),
            _variant({"BLOCK_N": 8}, "planted-dot-8"),
        ]
    )
    by_name = {r["variant"]: r for r in rows}
    assert kreport.check([by_name["engine"]]) == []
    spill = kreport.check([by_name["planted-spill"]])
    assert spill and "spills" in spill[0], spill
    error = kreport.check([by_name["planted-dot-8"]])
    assert len(error) == 1 and "compile error: CompilationError: at " in error[0], error
    assert error[0].endswith("K >= 16"), "the second tl.dot (P V) has K = BLOCK_N = 8"


@pytest.mark.parametrize(
    "argv", [["sim", "--compile"], ["kernel", "--jobs", "2"], ["kernel", "--update-static"]]
)
def test_compile_flags_belong_to_bench_kernel(argv, capsys):
    from paged_course.bench import main

    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2 and "--compile" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("step", ["decode", "decode_split", "prefill"])
def test_the_jit_on_this_gpu_compiles_what_the_report_says(step):
    """On a GPU: the engine's launches compiled by Triton's own JIT for this device (``warmup``: compile,
    no launch) do not spill, and with the report's Triton version on an A100 / H100 / H200 they have the
    committed report's registers and shared memory (so the report cannot drift from a real launch)."""
    from paged.kernels.launch_config import device_spec

    spec = device_spec(torch.device("cuda"))
    shape = {"dtype": "float16", "head_dim": 128, "group": 4, "block_size": 16}
    report = json.loads((kc.STATIC / "kernels.json").read_text())
    rows = {r["id"]: r for r in report["rows"]}
    gpu = {"A100": "A100", "H100": "H200", "H200": "H200"}.get(spec.name)
    for fn, grid, args, kwargs in kc.engine_step(step, **shape, device="cuda"):
        compiled = fn.warmup(*args, grid=grid, **kwargs)
        compiled._init_handles()
        assert compiled.n_spills == 0, f"{fn.fn.__name__} spills on {spec.name}"
        name = "merge" if fn.fn.__name__ == "_merge_splits_kernel" else step
        num_splits = dict(zip(fn.arg_names, args)).get("num_splits")
        row = rows.get(kc.row_id({**shape, "gpu": gpu, "kernel": name, "num_splits": num_splits}))
        same = report["triton"] == kc._triton_version() and spec.arch == kc.TARGETS.get(gpu)
        if row is not None and same:
            assert compiled.n_regs == row["registers"], (
                row["id"],
                compiled.n_regs,
                row["registers"],
            )
            assert compiled.metadata.shared <= row["shared_bytes"], row["id"]
