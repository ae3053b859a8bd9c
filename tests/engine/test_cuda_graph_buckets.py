"""The CUDA-graph decode path's host side, on CPU (``paged.worker.model_runner``): nothing here needs a GPU.

``tests/engine/test_decode_graphs.py`` runs whole engines through the graphs; this file pins the pieces:
which captured batch size (bucket) a decode step of every size takes, what the padding rows hold, the
static buffers' shapes for every bucket, and each case that falls back to the eager forward (a step with a
prompt chunk, a row that does not sample, a batch larger than every bucket, a capture that fails).
"""

from __future__ import annotations

import pytest
import torch

from paged.config import EngineConfig, ModelConfig, SchedulerConfig
from paged.core.scheduler_outputs import ScheduledSeq
from paged.core.sequence import Sequence
from paged.engine.parts import Parts
from paged.worker.kv_cache import KVCache
from paged.worker.model_runner import GRAPH_SIZES, DecodeGraph, ModelRunner
from paged.worker.worker import kv_shape
from tests.engine.tiny import tiny_model

BS, BLOCKS, MAX_LEN = 4, 48, 64


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _runner(model, max_num_seqs: int, graphs: bool = True) -> ModelRunner:
    layers, kv_heads, head_dim = kv_shape(model)
    kv = KVCache(layers, BLOCKS + 1, BS, kv_heads, head_dim)  # + 1: the padding rows' block
    config = EngineConfig(
        ModelConfig(cuda_graphs=graphs),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=MAX_LEN),
    )
    return ModelRunner(model, kv, Parts(), config)


def _decodes(n: int, samples: bool = True) -> list[ScheduledSeq]:
    """``n`` sequences of 6 prompt tokens, each computing its last token (a decode's shape)."""
    seqs = [Sequence(i, [1 + (i + j) % 90 for j in range(6)], BS) for i in range(n)]
    return [
        ScheduledSeq(s, 5, 1, [(2 * i) % BLOCKS, (2 * i + 1) % BLOCKS], samples)
        for i, s in enumerate(seqs)
    ]


def test_buckets_are_the_ladder_up_to_max_num_seqs_and_every_batch_takes_the_next(model):
    runner = _runner(model, max_num_seqs=40)
    assert sorted(runner.graphs) == [1, 2, 4, 8, 16, 32, 40], "the ladder below 40, then 40 itself"
    assert GRAPH_SIZES[:4] == (1, 2, 4, 8) and GRAPH_SIZES[4:7] == (16, 32, 48)
    expected = {1: 1, 2: 2, 3: 4, 5: 8, 8: 8, 9: 16, 16: 16, 17: 32, 32: 32, 33: 40, 40: 40}
    for n, bucket in expected.items():
        batch = runner.prepare(_decodes(n))
        assert batch.graph is runner.graphs[bucket], f"{n} decodes take the {bucket} graph"
        assert batch.meta is None and [s.seq.seq_id for s in batch.sampling] == list(range(n))
        assert batch.host.shape == batch.graph.buf.shape, "a step fills the bucket's static buffer"


def test_static_buffers_have_one_shape_per_bucket(model):
    runner = _runner(model, max_num_seqs=12)
    width = -(-MAX_LEN // BS)
    for size, graph in runner.graphs.items():
        # token ids, positions, slots, kept rows, context lengths: one per row; query starts: rows + 1;
        # block tables: rows x the widest table max_model_len allows
        assert graph.layout.sizes == (*[size] * 5, size + 1, size * width), size
        assert graph.buf.shape == (sum(graph.layout.sizes),) and graph.buf.dtype == torch.int64
        assert graph.layout.width == width and graph.width == width


def test_padding_rows_hold_token_0_at_position_0_writing_the_padding_block(model):
    runner = _runner(model, max_num_seqs=12)
    assert runner.pad_block == BLOCKS, "the pool's last block, which the block manager does not own"
    batch = runner.prepare(_decodes(5))
    assert batch.graph.size == 8
    ids, positions, slots, keep, lens, starts, tables = batch.host.split(batch.graph.layout.sizes)
    assert ids[5:].tolist() == [0, 0, 0] and positions[5:].tolist() == [0, 0, 0]
    assert slots[5:].tolist() == [BLOCKS * BS] * 3 and lens[5:].tolist() == [1, 1, 1]
    assert starts.tolist() == list(range(9)), "one token per row, padding included"
    width = batch.graph.layout.width
    pads = tables.view(8, width)[5:]
    assert pads[:, 0].tolist() == [BLOCKS] * 3 and not pads[:, 1:].any()
    assert positions[:5].tolist() == [5] * 5 and lens[:5].tolist() == [6] * 5
    assert slots[:5].tolist() == [(2 * i + 1) % BLOCKS * BS + 1 for i in range(5)]


def test_steps_that_fall_back_to_eager(model):
    runner = _runner(model, max_num_seqs=4)
    chunk = ScheduledSeq(Sequence(9, [3, 4, 5, 6, 7], BS), 0, 5, [40, 41], True)
    cases = {
        "a prompt chunk in the step": _decodes(2) + [chunk],
        "a row that does not sample": _decodes(2) + _decodes(1, samples=False),
        "more decodes than the largest bucket": _decodes(5),
    }
    for why, scheduled in cases.items():
        batch = runner.prepare(scheduled)
        assert batch.graph is None and batch.meta is not None, why
    assert _runner(model, max_num_seqs=4, graphs=False).graphs == {}, "enforce_eager: no graphs"


def test_a_capture_that_fails_leaves_the_engine_eager(model, monkeypatch):
    def fail(self, *args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(DecodeGraph, "__init__", fail)
    with pytest.warns(UserWarning, match="CUDA graph capture failed, decode steps run eagerly"):
        runner = _runner(model, max_num_seqs=4)
    assert runner.graphs == {}
    batch = runner.prepare(_decodes(3))
    assert batch.graph is None and batch.meta is not None
    assert runner.forward(batch).shape == (3, model.config.vocab_size)


def test_graph_rows_give_the_eager_logits(model):
    """Padded to the 8 bucket, the 5 real rows' logits equal the eager forward of the same step."""
    graphs, eager = _runner(model, max_num_seqs=8), _runner(model, max_num_seqs=8, graphs=False)
    for runner in (graphs, eager):
        runner.kv_cache.kv.normal_(generator=torch.Generator().manual_seed(1))
    batch = graphs.prepare(_decodes(5))
    assert batch.graph is not None
    torch.testing.assert_close(
        graphs.forward(batch), eager.forward(eager.prepare(_decodes(5))), rtol=1e-5, atol=1e-5
    )
