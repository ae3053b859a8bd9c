"""Decode steps through ``DecodeGraph`` (CUDA graphs on a GPU): static buffers, padding rows, the padding block.

On CPU nothing is captured: ``DecodeGraph.run`` runs the captured function eagerly on the same fixed buffers,
so everything but the capture itself is checked here: a step's batch padded to the next captured size gives
the tokens of the eager engine, padding rows write only the pool's last block, every decode step of a
greedy run takes the graph path, steps with a prompt chunk or a non-sampling row do not, and ``LLM`` leaves
CPU runs eager whatever ``enforce_eager`` says.
"""

from __future__ import annotations

import pytest
import torch

from paged.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged.engine.llm_engine import LLMEngine
from paged.worker.model_runner import GRAPH_SIZES, DecodeGraph
from tests.engine.tiny import tiny_model

BLOCKS, BS = 48, 4


def _engine(model, graphs: bool, max_num_seqs: int = 12) -> LLMEngine:
    config = EngineConfig(
        ModelConfig(cuda_graphs=graphs),
        CacheConfig(block_size=BS, num_gpu_blocks=BLOCKS, enable_prefix_caching=True),
        SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=32, max_model_len=64),
        profile=True,  # the step history
    )
    return LLMEngine(model, config)


def _run(engine, work) -> list[list[int]]:
    ids = [engine.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True)) for p, m in work]
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o.outputs[0].token_ids for o in engine.step()})
    return [done[i] for i in ids]


def test_padded_graph_decodes_equal_eager_tokens(monkeypatch):
    model = tiny_model("llama")
    gen = torch.Generator().manual_seed(4)
    # 7 ragged requests: decode batches of 7, 6, ... padded to 8, 4, 2; a budget of 32 tokens chunks the prompts
    work = [
        (torch.randint(1, 120, (n,), generator=gen).tolist(), m)
        for n, m in zip((5, 17, 9, 30, 3, 12, 21), (9, 4, 12, 7, 15, 2, 10))
    ]
    eager = _run(_engine(model, False), work)
    engine = _engine(model, True)
    assert sorted(engine.runner.graphs) == [1, 2, 4, 8, 12], "the ladder up to max_num_seqs"
    sizes, real_run = [], DecodeGraph.run

    def spy(self, host):
        sizes.append(self.size)
        return real_run(self, host)

    monkeypatch.setattr(DecodeGraph, "run", spy)
    engine.runner.kv_cache.kv[:, :, BLOCKS].fill_(
        7.0
    )  # the padding block: the only one padded rows may write
    assert _run(engine, work) == eager, "a padded graph step changed the tokens"
    decode_steps = [h for h in engine.metrics.history if h["prefill_tokens"] == 0]
    assert len(sizes) == len(decode_steps) > 0, "every decode-only step takes a captured size"
    assert 8 in sizes and 4 in sizes and 2 in sizes, (
        f"batches are padded to the next captured size: {sizes}"
    )
    assert not torch.all(engine.runner.kv_cache.kv[:, :, BLOCKS] == 7.0), (
        "padding rows write the padding block"
    )


def test_graph_buffer_layout_is_fixed_and_padded():
    model = tiny_model("llama")
    engine = _engine(model, True, max_num_seqs=4)
    graph = engine.runner.graphs[4]
    address = graph.buf.data_ptr()
    host, layout = graph.pack([[3, 5], [9]], [6, 2], [11, 12])
    assert host.shape == graph.buf.shape and layout == graph.layout, (
        "every step of a size has one layout"
    )
    ids, positions, slots, keep, lens, starts, tables = host.split(layout.sizes)
    assert ids.tolist() == [11, 12, 0, 0] and positions.tolist() == [5, 1, 0, 0]
    assert slots.tolist() == [5 * BS + 1, 9 * BS + 1, BLOCKS * BS, BLOCKS * BS], (
        "padding rows: the padding block"
    )
    assert lens.tolist() == [6, 2, 1, 1] and keep.tolist() == [0, 1, 2, 3]
    assert tables.view(4, -1)[:, 0].tolist() == [3, 9, BLOCKS, BLOCKS] and layout.width == 64 // BS
    with torch.inference_mode():  # as in ModelRunner.forward
        graph.run(host)
    assert graph.buf.data_ptr() == address, "the buffer stays at its address"


def test_mixed_steps_stay_eager():
    model = tiny_model("llama")
    engine = _engine(model, True)
    for prompt in ([1, 2, 3], [4, 5, 6, 7, 8]):
        engine.add_request(prompt, SamplingParams(max_tokens=3))
    batch = engine.runner.prepare(engine.scheduler.schedule().scheduled)
    assert batch.graph is None and batch.meta is not None, "a step with prompt chunks runs eagerly"


def test_ladder_and_cpu_llm_ignore_graphs():
    assert GRAPH_SIZES[:6] == (1, 2, 4, 8, 16, 32) and all(b % 16 == 0 for b in GRAPH_SIZES[4:])
    for eager in (True, False):
        llm = LLM(
            tiny_model("llama"),
            num_gpu_blocks=16,
            block_size=4,
            device="cpu",
            verbose=False,
            enforce_eager=eager,
        )
        assert llm.engine.runner.graphs == {} and llm.engine.kv_cache.num_blocks == 16, (
            "CPU runs are eager"
        )


@pytest.mark.gpu
def test_cuda_graphs_and_prefill_kernel_give_the_eager_tokens_on_a_gpu():
    """On CUDA (not run on CPU): graphs captured by default, chunks through the prefill kernel, and the tokens of
    ``enforce_eager=True`` (the same kernels without graphs) for ragged prompts and outputs."""
    from paged.kernels import launch_prefill

    gen = torch.Generator().manual_seed(5)
    prompts = [
        torch.randint(1, 120, (n,), generator=gen).tolist() for n in (5, 40, 17, 63, 9, 28, 3)
    ]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (12, 3, 20, 7, 16, 1, 9)]
    outs = {}
    for eager in (True, False):
        llm = LLM(
            tiny_model("llama"),
            device="cuda",
            num_gpu_blocks=64,
            block_size=16,
            max_num_seqs=8,
            max_num_batched_tokens=48,
            enforce_eager=eager,
            verbose=False,
        )
        assert (
            bool(llm.engine.runner.graphs) != eager and llm.engine.runner.prefill is launch_prefill
        )
        outs[eager] = [
            o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)
        ]
    assert outs[False] == outs[True], "CUDA graphs changed the tokens"
