"""``python -m paged demo`` tells the truth: under a small KV budget it lists the requests that did not
complete and why, computes throughput (and the ratio against transformers) only over requests completed
in full, leaves the warm-up out of its stats, and refuses bad flags through argparse (exit 2)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM, group_finish_messages
from paged_course.tools import demo


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("paged-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PAGED_CACHE", str(path))
        yield path


def _engine_run(num_requests: int, mb: float):
    """The demo's workload on a fresh engine of the same budget: outputs and stats to compare against."""
    llm = LLM(
        None,
        block_size=demo.BLOCK_SIZE,
        device="cpu",
        kv_cache_memory_bytes=int(mb * 2**20),
        verbose=False,
    )
    work = demo.workload(num_requests)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = llm.generate(
            [t for t, _ in work],
            [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in work],
            use_tqdm=False,
        )
    return outs, llm.stats(), [m for _, m in work]


def _field(out: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)} +(.*)$", out, re.M)
    assert match, f"no {name!r} line in:\n{out}"
    return match.group(1)


def test_small_budget_lists_unfinished_requests_and_times_only_completed_ones(capsys):
    assert demo.main(["--num-requests", "8", "--kv-memory-mb", "0.4", "--check", "1"]) == 0
    out = capsys.readouterr().out
    outs, stats, max_tokens = _engine_run(8, 0.4)
    done = [i for i, o in enumerate(outs) if len(o.outputs[0].token_ids) == max_tokens[i]]
    ignored = [o for o in outs if o.outputs[0].finish_reason == "ignored"]
    exhausted = [o for o in outs if o.outputs[0].finish_reason == "kv_cache_exhausted"]
    assert (len(done), len(ignored), len(exhausted)) == (1, 5, 2), (
        "the workload this test was written for"
    )
    assert _field(out, "completed in full").startswith("1 of 8")
    assert _field(out, "ignored").startswith("5 of 8 requests never ran (finish_reason 'ignored')")
    assert _field(out, "KV cache exhausted").startswith("2 of 8 requests stopped early")
    for count, summary, ids in group_finish_messages(ignored) + group_finish_messages(exhausted):
        assert (
            f"  {count} x {summary}  [request{'s' if count > 1 else ''} {', '.join(ids)}]" in out
        ), out
    tokens = max_tokens[done[0]]
    assert (
        f"over the 1 request completed in full ({tokens} tokens), timed again on their own" in out
    ), out
    assert (
        "transformers generate, static batches of 16, the same 1 request (those completed in full)"
        in out
    )
    assert re.search(r"paged engine throughput \d+\.\d\dx of it", out), out
    assert "check vs transformers generate (greedy): 1/1 sampled requests agree" in out


def test_nothing_completed_prints_no_throughput_and_no_ratio(capsys):
    assert demo.main(["--num-requests", "4", "--kv-memory-mb", "0.1"]) == 0
    out = capsys.readouterr().out
    assert _field(out, "completed in full").startswith("0 of 4")
    assert re.search(
        r"4 x ignored: prompt of \d+-\d+ tokens needs \d+-\d+ blocks of 16 tokens; the KV cache has "
        r"3 blocks",
        out,
    ), out
    assert _field(out, "throughput").startswith(
        "none: no request completed in full, so no tokens/s and no ratio"
    )
    assert "x of it" not in out and "transformers generate, static" not in out, out
    assert "check vs transformers generate: skipped, no request completed in full" in out


def test_stats_leave_the_warm_up_out(capsys):
    assert (
        demo.main(["--num-requests", "4", "--no-baseline", "--check", "1", "--kv-memory-mb", "4"])
        == 0
    )
    out = capsys.readouterr().out
    outs, stats, _ = _engine_run(4, 4)
    assert _field(out, "completed in full").startswith("4 of 4")
    assert f"{stats['computed_tokens']} computed" in _field(out, "tokens"), (
        "the same count as a fresh engine's"
    )
    assert _field(out, "time").endswith(f"for the 4 requests, {stats['steps']} steps")
    assert f"peak {stats['kv_blocks_peak']} in use" in _field(out, "KV blocks")
    assert _field(out, "prefix cache").startswith(f"{stats['prefix_cache_hit_rate']:.1%}")
    assert "(all 4 requests completed in full)" in _field(out, "throughput")
    assert "\n  [0] " in out, "request ids start at 0: the warm-up ran on another engine"


def _block_bytes() -> int:
    from paged.models import load_default
    from paged.worker.kv_cache import block_bytes
    from paged.worker.worker import kv_shape

    model, _ = load_default(torch.float32)
    return block_bytes(*kv_shape(model), demo.BLOCK_SIZE, torch.float32)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kv-memory-mb", "0"], "--kv-memory-mb 0 holds no KV block of {bytes} bytes"),
        (["--kv-memory-mb", "0.01"], "--kv-memory-mb 0.01 holds no KV block of {bytes} bytes"),
        (
            ["--kv-memory-mb", "-1"],
            "--kv-memory-mb must be a positive KV cache budget in MiB, got -1",
        ),
        (
            ["--kv-memory-mb", "nan"],
            "--kv-memory-mb must be a positive KV cache budget in MiB, got nan",
        ),
        (
            ["--check", "-1"],
            "--check must be >= 0 (the number of outputs compared with transformers), got -1",
        ),
        (["--num-requests", "0"], "--num-requests must be >= 1, got 0"),
        (
            ["--device", "tpu"],
            "--device tpu: device must be 'cpu' or 'cuda' (or 'cuda:N'); got 'tpu'",
        ),
        (
            ["--model", "./no-such-dir"],
            "--model ./no-such-dir: model folder './no-such-dir' does not exist",
        ),
    ],
)
def test_bad_flags_exit_2_with_the_numbers(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        demo.main(argv + ["--num-requests", "1"] if "--num-requests" not in argv else argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    expected = message.format(bytes=_block_bytes()) if "{bytes}" in message else message
    assert f"python -m paged demo: error: {expected}" in err, err
    assert "Traceback" not in err


def test_block_bytes_in_the_message_are_the_engines():
    assert _block_bytes() == 32768, "2 x 4 layers x 2 KV heads x 32 x 16 tokens x 4 bytes"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_cuda_flag_without_cuda(capsys):
    with pytest.raises(SystemExit) as info:
        demo.main(["--device", "cuda", "--num-requests", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --device cuda: this torch (" in err and "sees no CUDA GPU" in err, err
    assert "run with --device cpu" in err and "device='cpu'" not in err, (
        "on the command line the fix is a flag, not Python syntax"
    )
