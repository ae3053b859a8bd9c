"""Chapter 04's Triton teaching kernel as the engine's ``decode_attention`` part (Triton's interpreter on
CPU, compiled on a GPU): the tiny model served with it gives the reference parts' tokens."""

from __future__ import annotations

import time

import pytest

from paged import kernels
from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged.engine.parts import Parts
from paged_course.reference.models import tiny_model


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.timeout(600)
def test_the_teaching_kernel_serves_4_requests_of_16_tokens():
    if not kernels.HAS_TRITON:
        pytest.skip(kernels.REASON)
    from paged_course.kernel_lab.decode_teaching import teaching_decode

    model = tiny_model("llama", vocab_size=128)
    prompts = [[11, 12, 13, 14, 15], [11, 12, 13, 14, 40, 41], [70, 71, 72], [5] * 9]
    params = [SamplingParams(max_tokens=16, ignore_eos=True)] * 4

    def serve(parts):
        llm = LLM(model, block_size=4, num_gpu_blocks=40, parts=parts, verbose=False)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs], time.perf_counter() - start

    want, _ = serve(None)
    got, seconds = serve(Parts(decode_attention=teaching_decode))
    print(f"teaching kernel as the decode part: 4 requests x 16 tokens in {seconds:.1f} s")
    assert got == want
