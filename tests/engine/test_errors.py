"""Bad input at the engine's public boundary gets a clear, named error (never a raw traceback or a wait).

``LLM(...)``: a missing local folder, an unreachable / offline / unknown hub name, an unsupported device.
``LLM.generate``: prompts and sampling params of the wrong type, checked before anything is queued;
prompts that end ignored reported by one ``IgnoredRequestWarning`` per distinct reason.

The hub tests point ``huggingface_hub`` at a local socket (silent, refusing, or answering 404), so they
behave the same with or without network access.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
import warnings

import pytest
import torch

from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM, IgnoredRequestWarning, group_finish_messages
from paged.engine.model_loader import HUB_TIMEOUT_S
from tests.engine.tiny import tiny_model

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
MISSING = "paged-tests/no-such-model-7f3c"  # not in any local cache


@pytest.fixture(scope="module")
def llm():
    return LLM(
        tiny_model("llama", vocab_size=256),
        block_size=4,
        num_gpu_blocks=6,
        max_model_len=20,
        verbose=False,
    )


# ----------------------------------------------------------------------------- model loading
@pytest.mark.parametrize(
    "path", ["./no-such-dir", "~/no-such-dir-7f3c", "/no/such/dir", "tests/no-such-dir"]
)
def test_local_looking_path_that_does_not_exist(path):
    with pytest.raises(ValueError, match=r"model folder .* does not exist \(/"):
        LLM(path, verbose=False)


def test_local_path_that_is_a_file(tmp_path):
    file = tmp_path / "config.json"
    file.write_text("{}")
    with pytest.raises(ValueError, match="is a file, not a model folder"):
        LLM(str(file), verbose=False)


def test_model_of_another_type():
    with pytest.raises(
        TypeError,
        match="model must be None, a hub name or folder path, or a PreTrainedModel; got int",
    ):
        LLM(3, verbose=False)


@pytest.fixture
def hub(monkeypatch):
    """Point huggingface_hub at ``http://127.0.0.1:<port>``; yields a function taking the port."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")

    def point(port: int) -> str:
        endpoint = f"http://127.0.0.1:{port}"
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        return endpoint

    return point


def test_silent_hub_fails_within_the_timeout(hub):
    """A hub that accepts the connection and never answers (a firewall, a dead proxy)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # connections wait in the backlog, never accepted
        endpoint = hub(server.getsockname()[1])
        start = time.perf_counter()
        with pytest.raises(ValueError) as info:
            LLM(MISSING, verbose=False)
        elapsed = time.perf_counter() - start
    message = str(info.value)
    assert f"the Hugging Face hub ({endpoint}) is unreachable" in message, message
    assert (
        f"no answer within {HUB_TIMEOUT_S:g} s (paged.engine.model_loader.HUB_TIMEOUT_S)" in message
    ), message
    assert f"model {MISSING!r} is not in the local cache" in message, message
    assert elapsed < 15, (
        f"a guard against transformers' retries (about 25 s), not a speed claim: {elapsed:.1f} s"
    )


def test_refused_hub_fails_at_once(hub):
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = hub(port)
    start = time.perf_counter()
    with pytest.raises(
        ValueError, match=rf"the Hugging Face hub \({endpoint}\) is unreachable \(\w+Error"
    ):
        LLM(MISSING, verbose=False)
    assert time.perf_counter() - start < 15, (
        "a guard against transformers' retries, not a speed claim"
    )


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_hub_without_the_model(hub):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = hub(server.server_address[1])
        with pytest.raises(
            ValueError, match=rf"model '{MISSING}' was not found on the hub \({endpoint}\)"
        ):
            LLM(MISSING, verbose=False)
    finally:
        server.shutdown()
        server.server_close()


def test_offline_mode_does_not_ask_the_hub(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ValueError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    ):
        LLM(MISSING, verbose=False)


def test_invalid_hub_name(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(
        ValueError, match="'foo bar' is neither an existing folder nor a valid hub name"
    ):
        LLM("foo bar", verbose=False)


# ----------------------------------------------------------------------------- device
@pytest.mark.parametrize("device", ["tpu", "mps", "meta", 3])
def test_unsupported_device(device):
    with pytest.raises(
        ValueError, match=r"device must be 'cpu' or 'cuda' \(or 'cuda:N'\); got " + repr(device)
    ):
        LLM(tiny_model("llama"), device=device, num_gpu_blocks=4, verbose=False)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_cuda_without_cuda():
    with pytest.raises(ValueError, match=r"device 'cuda' needs CUDA, but torch .* sees no GPU"):
        LLM(tiny_model("llama"), device="cuda", num_gpu_blocks=4, verbose=False)


# ----------------------------------------------------------------------------- generate arguments
@pytest.mark.parametrize(
    "prompts, match",
    [
        (
            None,
            "prompts must be a text, a list of token ids, or a list of texts / token-id lists; got NoneType None",
        ),
        ({"prompt": [1, 2]}, "prompts must be .*; got dict {'prompt': \\[1, 2\\]}"),
        (7, "prompts must be .*; got int 7"),
        ([1, 2.0, 3], "prompts\\[0\\]: token ids must be ints; got float 2.0 at position 1"),
        ([[1, 2], [3, 4.5]], "prompts\\[1\\]: token ids must be ints; got float 4.5 at position 1"),
        (
            [[1, [2, 3]]],
            "prompts\\[0\\]: token ids must be ints; got list \\[2, 3\\] at position 1",
        ),
        ([[1, 2], {"ids": [3]}], "prompts\\[1\\] must be a text or a list of token ids; got dict"),
        ([[1, True]], "prompts\\[0\\]: token ids must be ints; got bool True at position 1"),
    ],
)
def test_generate_rejects_bad_prompts_before_queuing_any(llm, prompts, match):
    with pytest.raises(TypeError, match=match):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests(), "nothing is queued when a prompt is rejected"


@pytest.mark.parametrize(
    "params, match",
    [
        (
            {"max_tokens": 4},
            r"sampling_params must be a SamplingParams or a list of them, one per prompt; got dict "
            r"\{'max_tokens': 4\} \(build one with SamplingParams\(\*\*params\)\)",
        ),
        ([GREEDY, {"max_tokens": 4}], r"sampling_params\[1\] must be a SamplingParams; got dict"),
        (4, "sampling_params must be a SamplingParams .*; got int 4"),
    ],
)
def test_generate_rejects_bad_sampling_params(llm, params, match):
    with pytest.raises(TypeError, match=match):
        llm.generate([[1, 2], [3, 4]], params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_generate_accepts_numpy_and_tensor_token_ids(llm):
    np = pytest.importorskip("numpy")
    ref = [
        o.outputs[0].token_ids for o in llm.generate([[5, 6, 7], [8, 9]], GREEDY, use_tqdm=False)
    ]
    assert [
        o.outputs[0].token_ids
        for o in llm.generate([np.array([5, 6, 7]), torch.tensor([8, 9])], GREEDY, use_tqdm=False)
    ] == ref
    assert (
        llm.generate([np.int64(5), 6, 7], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == ref[0]
    )


def test_add_request_rejects_a_float_token_id(llm):
    with pytest.raises(TypeError, match=r"token ids must be ints; got float 2.0 at position 1"):
        llm.engine.add_request([1, 2.0], GREEDY)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams; got dict"):
        llm.engine.add_request([1, 2], {"max_tokens": 4})
    assert not llm.engine.has_unfinished_requests()


# ----------------------------------------------------------------------------- ignored prompts are reported
def test_ignored_prompts_warn_once_per_reason_with_counts(llm):
    prompts = [[], list(range(1, 30)), [1, 2, 3], [5, 999], list(range(1, 25)), [], [7, 8]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["ignored"] * 2 + ["length"] + [
        "ignored"
    ] * 3 + ["length"]
    messages = sorted(str(w.message) for w in caught if w.category is IgnoredRequestWarning)
    assert messages == sorted(
        [
            "LLM.generate: 2 of 7 prompts did not complete: ignored: the prompt is empty; at least one token is needed "
            "(see each output's finish_reason and finish_message)",
            "LLM.generate: 2 of 7 prompts did not complete: ignored: prompt of 24-29 tokens is longer than "
            "max_model_len=20 (see each output's finish_reason and finish_message)",
            "LLM.generate: 1 of 7 prompts did not complete: ignored: token id 999 outside [0, 256) "
            "(see each output's finish_reason and finish_message)",
        ]
    ), messages
    assert all(w.filename == __file__ for w in caught), "the warning points at the caller's line"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm.generate([[1, 2]], GREEDY, use_tqdm=False)
    assert not caught, "a generate call where every prompt completes warns nothing"


def test_prompt_larger_than_the_whole_cache_warns():
    small = LLM(tiny_model("llama", vocab_size=256), block_size=4, num_gpu_blocks=4, verbose=False)
    with pytest.warns(
        IgnoredRequestWarning,
        match=r"1 of 2 prompts did not complete: ignored: prompt of 18 tokens "
        r"needs 5 blocks of 4 tokens; the KV cache has 4 blocks",
    ):
        outs = small.generate([list(range(1, 19)), [1, 2]], GREEDY, use_tqdm=False)
    assert [o.outputs[0].finish_reason for o in outs] == ["ignored", "length"]


def test_group_finish_messages_shows_differing_numbers_as_ranges():
    from paged.core.sequence import CompletionOutput, RequestOutput

    def out(rid, message, reason="ignored"):
        return RequestOutput(rid, None, [1], [CompletionOutput(0, [], "", reason, message)], True)

    outs = [
        out("a", "ignored: prompt of 30 tokens needs 8 blocks of 4 tokens"),
        out("b", "ignored: prompt of 21 tokens needs 6 blocks of 4 tokens"),
        out("c", "KV cache exhausted: request 'c' needs 3 blocks", "kv_cache_exhausted"),
        out("d", "ignored: prompt of 25 tokens needs 7 blocks of 4 tokens"),
        out(
            "e",
            "KV cache exhausted: sequence 6 of request 'e' needs 4 blocks",
            "kv_cache_exhausted",
        ),
        out(
            "f",
            "KV cache exhausted: sequence 57 of request 'f' needs 4 blocks",
            "kv_cache_exhausted",
        ),
    ]
    assert group_finish_messages(outs) == [
        (3, "ignored: prompt of 21-30 tokens needs 6-8 blocks of 4 tokens", ["a", "b", "d"]),
        (2, "KV cache exhausted: a sequence of the request needs 4 blocks", ["e", "f"]),
        (1, "KV cache exhausted: the request needs 3 blocks", ["c"]),
    ], (
        "sequence ids are the request's own, like its id: left out of the summary, not shown as a range"
    )
