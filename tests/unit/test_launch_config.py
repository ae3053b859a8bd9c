"""Launch configs per GPU (``paged.kernels.launch_config``): the table the launches and the compile report share.

The table's entries, how a device is matched to them (its own SM count kept), a GPU the table does not name,
the decode and prefill configs per target (the sm_80 prefill tile that does not spill), and the split rule's
slots. No GPU needed: device properties are faked.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from paged.kernels import launch_config as lc
from paged_course.bench.kernel_compile import compiling_for

KB = 1024


def _props(name, major, minor, sms, **extra):
    return SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms, **extra)


def test_table_holds_the_datasheet_numbers():
    a100, h100, h200 = lc.GPUS["A100"], lc.GPUS["H100"], lc.GPUS["H200"]
    assert (a100.arch, a100.sms, a100.smem_per_sm, a100.smem_optin) == (80, 108, 164 * KB, 163 * KB)
    assert (h100.arch, h100.sms, h100.smem_per_sm, h100.smem_optin) == (90, 132, 228 * KB, 227 * KB)
    assert h200 == lc.GpuSpec("H200", 90, 132, 228 * KB, 227 * KB)
    assert all(g.regs_per_sm == 65536 and g.max_warps_per_sm == 64 for g in lc.GPUS.values())


@pytest.mark.parametrize(
    "props, expected",
    [
        (_props("NVIDIA A100-SXM4-80GB", 8, 0, 108), lc.GPUS["A100"]),
        (_props("NVIDIA H200", 9, 0, 132), lc.GPUS["H200"]),
        # an H100 PCIe has 114 SMs: the table's entry with the device's own SM count
        (_props("NVIDIA H100 PCIe", 9, 0, 114), lc.GpuSpec("H100", 90, 114, 228 * KB, 227 * KB)),
        (
            _props(
                "NVIDIA L4",
                8,
                9,
                58,
                shared_memory_per_multiprocessor=100 * KB,
                shared_memory_per_block_optin=99 * KB,
                regs_per_multiprocessor=65536,
                max_threads_per_multi_processor=1536,
            ),
            lc.GpuSpec("NVIDIA L4", 89, 58, 100 * KB, 99 * KB, 65536, 48),
        ),
    ],
)
def test_a_device_is_matched_to_the_table_or_described_by_its_properties(
    monkeypatch, props, expected
):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert lc._cuda_spec.__wrapped__(0) == expected


def test_decode_and_prefill_configs_per_target():
    assert lc.decode_config(128, torch.float16, None) == {
        "BLOCK_N": 64,
        "num_warps": 4,
        "num_stages": 1,
    }
    for gpu in ("A100", "H200"):
        spec = lc.GPUS[gpu]
        assert lc.decode_config(128, torch.float16, spec) == {
            "BLOCK_N": 64,
            "num_warps": 4,
            "num_stages": 3,
        }
        assert lc.decode_config(64, torch.bfloat16, spec)["BLOCK_N"] == 64
        assert lc.decode_config(128, torch.float32, spec)["BLOCK_N"] == 32
        assert lc.decode_slots(spec) == 2 * spec.sms
    small = lc.GpuSpec("small", 80, 10, 64 * KB, 48 * KB)
    assert lc.decode_config(128, torch.float16, small)["num_stages"] == 2, "3 stages need 160 KB"
    assert lc.decode_slots(None) == lc.INTERPRETER_SLOTS
    # the compile report found 64 x 64 spilling before sm_90 at 256-byte rows: 64 x 32 there
    pre = {g: lc.prefill_config(128, torch.float16, s) for g, s in lc.GPUS.items()}
    assert (pre["A100"]["BLOCK_M"], pre["A100"]["BLOCK_N"]) == (64, 32)
    assert (
        (pre["H200"]["BLOCK_M"], pre["H200"]["BLOCK_N"])
        == (64, 64)
        == (
            pre["H100"]["BLOCK_M"],
            pre["H100"]["BLOCK_N"],
        )
    )
    assert lc.prefill_config(64, torch.float16, lc.GPUS["A100"])["BLOCK_N"] == 64
    assert lc.prefill_config(256, torch.float16, lc.GPUS["H200"])["BLOCK_N"] == 32
    assert lc.prefill_config(64, torch.float16, None)["BLOCK_M"] == 16


def test_compiling_for_needs_a_compile_only_process():
    with pytest.raises(RuntimeError, match="PAGED_TRITON_COMPILE_ONLY=1"):
        with compiling_for(lc.GPUS["A100"]):
            pass
    assert lc.device_spec(torch.device("cpu")) is None, "the interpreter (or a CPU tensor): no GPU"
