"""``bench engine``'s plumbing with a fake vLLM peer: the peer's protocol, the comparison table, the skips.

The real peer (``scripts/vllm_peer.py``) needs vLLM in its own venv; here a stand-in script speaks the same
protocol (request JSON in, result JSON out) and answers with our engine's tokens for some requests and
wrong ones for another, so the agreement count, the best-of-N time and the ratio are checked without vLLM.
No timing is asserted.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from paged_course.bench import engine as bench
from paged_course.bench import engine_peers
from paged_course.reference.models import tiny_model

FAKE_PEER = textwrap.dedent("""
    import json, sys
    req = json.load(open(sys.argv[2]))
    answers = json.load(open(req["model_dir"] + "/../answers.json"))
    print("INFO a log line that is not an answer", flush=True)
    print("PAGED_PEER " + json.dumps({"vllm": "fake", "block_size": 32, "startup_seconds": 0.1}), flush=True)
    for n, line in enumerate(sys.stdin):
        tokens = [a if i else [0] * len(a) for i, a in enumerate(answers)]  # request 0: wrong tokens
        print("PAGED_PEER " + json.dumps({"seconds": 3.0 - n, "cpu_seconds": 4.0 - n, "tokens": tokens}), flush=True)
""")


def _fake_save(answers):
    def save(self, folder):  # the peer finds our answers beside the saved model
        folder.mkdir(parents=True)
        (folder.parent / "answers.json").write_text(json.dumps(answers))

    return save


def test_vllm_session_speaks_the_peer_protocol(tmp_path, monkeypatch):
    model = tiny_model("llama")
    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)
    monkeypatch.setattr(type(model), "save_pretrained", _fake_save([[1, 2, 3], [4, 5]]))
    with engine_peers.vllm_session(
        model, [([5, 6, 7], 3), ([8, 9], 2)], sys.executable, script=script
    ) as (once, info):
        assert info == {"vllm": "fake", "block_size": 32, "startup_seconds": 0.1}, (
            "the ready line, log skipped"
        )
        assert once() == ([[0, 0, 0], [4, 5]], 3.0, 4.0) and once()[1:] == (2.0, 3.0), (
            "one answer per call"
        )


@pytest.mark.parametrize(
    "body, match",
    [
        (
            "import sys\nsys.exit('vllm: No common block size for 16')\n",
            r"exit code 1\): vllm: No common block size",
        ),
        (
            "import time\nprint('INFO loading', flush=True)\ntime.sleep(30)\n",
            "no answer within 1 s",
        ),
    ],
)
def test_vllm_session_failure_names_the_reason(tmp_path, monkeypatch, body, match):
    model = tiny_model("llama")
    script = tmp_path / "peer.py"
    script.write_text(body)
    monkeypatch.setattr(type(model), "save_pretrained", _fake_save([]))
    with pytest.raises(RuntimeError, match=match):
        with engine_peers.vllm_session(
            model, [([1, 2], 1)], sys.executable, script=script, timeout=1
        ):
            pass


def test_compare_systems_reports_the_fake_peer(tmp_path, monkeypatch, capsys):
    """Every system in the table; the peer's wrong request counts as 'other', its best call sets the ratio."""
    model = bench.bench_model()
    work = bench.make_workload(3, (8, 12), (2, 4))
    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)
    ours = bench.run_paged(model, work)[0]
    monkeypatch.setattr(type(model), "save_pretrained", _fake_save(ours))
    real_session = engine_peers.vllm_session
    monkeypatch.setattr(
        bench, "vllm_session", lambda m, w, p, t: real_session(m, w, p, t, script=script)
    )
    monkeypatch.setattr(
        bench, "generate_batch_session", lambda m, w: (_ for _ in ()).throw(ImportError("no CB"))
    )
    monkeypatch.setenv("PAGED_VLLM_PYTHON", sys.executable)
    result = bench.compare_systems(model, work, "tiny", repeats=2)
    out = capsys.readouterr().out
    assert len(result["paged"]["runs"]) == 2 and len(result["static_generate"]["runs"]) == 2, (
        "best of repeats"
    )
    assert result["static_generate"]["agreement"]["equal"] == 3, "static generate gives our tokens"
    assert result["vllm"]["runs"] == [3.0, 2.0] and result["vllm"]["seconds"] == 2.0
    assert result["vllm"]["cpu_seconds"] == [4.0, 3.0] and all(
        c > 0 for c in result["paged"]["cpu_seconds"]
    )
    assert result["vllm"]["agreement"] == {"equal": 2, "near_tie": 0, "other": 1}
    assert result["ratio_vs_vllm"] == pytest.approx(2.0 / result["paged"]["seconds"])
    assert "skipped: ImportError: no CB" in out and "vLLM fake" in out and "1 other" in out


def test_find_vllm_says_why_not(monkeypatch):
    monkeypatch.delenv("PAGED_VLLM_PYTHON", raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    python, why = engine_peers.find_vllm()
    assert python is None and "PAGED_VLLM_PYTHON" in why
    monkeypatch.setenv("PAGED_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert engine_peers.find_vllm() == ("/opt/vllm/bin/python", "$PAGED_VLLM_PYTHON")


def test_bench_flags_belong_to_engine(capsys):
    from paged_course.bench import main

    with pytest.raises(SystemExit):
        main(["kernel", "--big"])
    assert "--profile and --big apply to `bench engine` only" in capsys.readouterr().err
