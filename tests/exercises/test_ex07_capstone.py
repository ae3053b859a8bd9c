"""Graded: chapter 07, the capstone. The engine assembled from *your* parts (chapters 02, 03, 05, 06 and 07:
allocator, slot mapping, KV write, decode attention, prefix cache, copy-on-write, scheduler, prefill attention,
sampler, input preparation, update) serves the built-in model, and its greedy tokens equal transformers'
``generate`` on a workload that exercises chunked prefill, prefix caching, copy-on-write and preemption.

No part falls back to the reference here: a part that is missing or unfinished fails the capstone and is
named. Tokens are compared as vLLM's tests do (``paged_course.reference.compare``): equal, or parting only at a
logit near-tie. One more check runs the real engine on chapter 05's block manager alone among the reference
parts (tiny model): the same tokens and statistics as on the reference manager (it lives here so that
chapter 05's check cells answer in seconds).
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged.engine.parts import Parts
from paged.models import load_default
from paged.worker.attention import use_attention
from paged_course.capstone import PART_SOURCES
from paged_course.publish.sync import course_order, unwritten_regions
from paged_course.reference.compare import greedy_agreement

ALL_REGIONS = (
    "ch02.ex1",
    "ch03.ex1",
    "ch05.ex1",
    "ch06.ex1",
    "ch07.ex2",
)  # the first of each part's chapters


def _your_parts(impl) -> Parts:
    """Your parts (``PART_SOURCES``); fails first, in course order, on every region of theirs not written yet (the
    engine would stop at whichever stub it happens to call first, which says little about where to start)."""
    chosen, missing, unwritten = {}, [], {}
    for part, (module, attribute) in PART_SOURCES.items():
        try:
            found = impl(module)
            chosen[part] = getattr(found, attribute)
        except (ImportError, AttributeError) as err:
            missing.append(f"{part} ({module}.{attribute}: {err})")
            continue
        regions = getattr(found, "PART_REGIONS", {}).get(attribute, ())
        stubs = set(unwritten_regions(inspect.getsource(found)))
        for ex_id in regions:
            if ex_id in stubs:
                unwritten.setdefault(ex_id, part)
    assert not missing, "the capstone needs every part of yours: " + "; ".join(missing)
    if unwritten:
        order = sorted(unwritten, key=course_order)
        by_part = {}
        for ex_id in order:
            by_part.setdefault(unwritten[ex_id], []).append(ex_id)
        pytest.fail(
            f"needs {order[0]} first: the capstone runs the engine on your parts, and {len(order)} of their "
            "regions are not written yet, in course order: "
            + "; ".join(f"{part} {_span(ids)}" for part, ids in by_part.items())
            + ". Write them in this order, then grade ch07 again",
            pytrace=False,
        )
    return Parts(**chosen)


def _span(ids: list[str]) -> str:
    """``ch02.ex1, ch02.ex2, ch02.ex3`` as ``ch02.ex1-ex3`` (ids of one chapter, in course order)."""
    if len(ids) > 2 and all(
        course_order(b)[1] == course_order(a)[1] + 1 for a, b in zip(ids, ids[1:])
    ):
        return f"{ids[0]}-{ids[-1].split('.')[1]}"
    return ", ".join(ids)


@pytest.fixture(scope="module")
def model():
    """The built-in model, its tokenizer, and transformers' greedy tokens for the workload (computed once)."""
    net, tokenizer = load_default()
    reference = copy.deepcopy(
        net
    )  # its own config object: the engine switches the model's attention
    prompts, params = _workload(tokenizer)
    use_attention(reference, "sdpa")
    with torch.inference_mode():
        wants = [
            reference.generate(
                input_ids=torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=sp.max_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            for p, sp in zip(prompts, params)
        ]
    return net, tokenizer, reference, wants


def _workload(tokenizer):
    system = "You are a careful assistant. Answer in one short sentence.\n"
    questions = [
        "What is a block table?",
        "Why page the KV cache?",
        "What does copy-on-write save?",
        "When is a request preempted?",
        "What is chunked prefill?",
        "Why keep a watermark?",
    ]
    prompts = [tokenizer(system + q)["input_ids"] for q in questions]
    params = [
        SamplingParams(max_tokens=12 + 2 * (i % 3), ignore_eos=True, n=2 if i == 2 else 1)
        for i in range(len(prompts))
    ]
    return prompts, params


@torch.inference_mode()
def _check_against_transformers(reference, wants, prompts, params, outs):
    for prompt, sp, out, want in zip(prompts, params, outs, wants):
        assert len(out.outputs) == sp.n, (
            f"request {out.request_id}: {len(out.outputs)} outputs for n={sp.n}"
        )
        for completion in out.outputs:
            assert completion.finish_reason == "length", (
                f"request {out.request_id} ended {completion.finish_reason}: {completion.finish_message}"
            )
            agree = greedy_agreement(reference, prompt, completion.token_ids, want)
            assert agree.ok, (
                f"request {out.request_id}: your engine gave {completion.token_ids}, transformers "
                f"{want} (first difference at token {agree.position}, not a near-tie)"
            )


@pytest.mark.timeout(300)
@pytest.mark.exercise("ch07.ex1", points=10, uses=ALL_REGIONS)
def test_your_engine_matches_transformers_with_prefix_caching_and_copy_on_write(impl, model):
    net, tokenizer, reference, wants = model
    prompts, params = _workload(tokenizer)
    llm = LLM(
        net,
        tokenizer=tokenizer,
        block_size=16,
        num_gpu_blocks=64,
        max_num_batched_tokens=48,
        max_num_seqs=8,
        parts=_your_parts(impl),
        verbose=False,
    )
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    assert stats["prefix_cache_hit_rate"] > 0, "the shared system prompt must hit your prefix cache"
    assert stats["cow_copies"] > 0, (
        "n=2 sampling must copy a shared partial block (your copy_on_write)"
    )
    assert stats["prefill_chunks"] > len(prompts), "a 48-token budget must chunk the prompts"
    _check_against_transformers(reference, wants, prompts, params, outs)
    assert stats["kv_blocks_used"] == 0, "every block is back in your allocator at the end"


@pytest.mark.timeout(300)
@pytest.mark.exercise("ch07.ex1", points=10, uses=ALL_REGIONS)
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_your_engine_matches_transformers_under_preemption(impl, model, mode):
    net, tokenizer, reference, wants = model
    prompts, params = _workload(tokenizer)
    llm = LLM(
        net,
        tokenizer=tokenizer,
        block_size=16,
        num_gpu_blocks=12,
        num_cpu_blocks=24 if mode == "swap" else 0,
        preemption_mode=mode,
        max_num_batched_tokens=48,
        max_num_seqs=8,
        parts=_your_parts(impl),
        verbose=False,
    )
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    assert stats["preemptions"] > 0, "12 blocks of 16 tokens are too few for every request at once"
    if mode == "swap":
        assert stats["swap_outs"] > 0, "swap mode must move a victim to the CPU pool"
    _check_against_transformers(reference, wants, prompts, params, outs)
    assert stats["kv_blocks_used"] == 0, "every block is back in your allocator at the end"


# ---------------------------------------------------------------- chapter 05's block manager in the engine
BLOCK_MANAGER = ("ch05.ex7", "ch05.ex8", "ch05.ex9", "ch05.ex10")


@pytest.mark.timeout(120)  # a cold process imports transformers' modelling code first (seconds)
@pytest.mark.exercise("ch07.ex1", points=3, uses=BLOCK_MANAGER)
def test_the_engine_runs_on_your_block_manager_like_the_reference(impl):
    """Chapter 05's block manager alone among the reference parts (tiny model, CPU): with prefix hits and a
    fork, then with preemption by swapping, the same tokens and statistics as the reference manager's."""
    from paged_course.reference.models import tiny_model

    cls = impl("ex05_block_manager").BlockSpaceManager
    model = tiny_model("llama", vocab_size=128)
    shared = [3, 1, 4, 1, 5, 9, 2, 6]
    prompts = [shared + [7, 7], shared + [8], [50 + i for i in range(13)], [90, 91], shared + [7]]
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True, n=2 if i == 1 else 1)
        for i in range(len(prompts))
    ]
    keys = ("prefix_cache_hit_rate", "cow_copies", "preemptions", "swap_outs", "kv_blocks_used")
    for blocks, mode, cpu in [(14, "recompute", 0), (9, "swap", 16)]:
        runs = []
        for parts in (Parts(), Parts(block_manager=cls)):
            llm = LLM(
                model,
                block_size=4,
                num_gpu_blocks=blocks,
                num_cpu_blocks=cpu,
                preemption_mode=mode,
                max_num_batched_tokens=8,
                max_num_seqs=4,
                parts=parts,
                verbose=False,
            )
            outs = llm.generate(prompts, params, use_tqdm=False)
            stats = llm.stats()
            runs.append(
                ([[c.token_ids for c in o.outputs] for o in outs], [stats[k] for k in keys])
            )
        (want, ref_stats), (got, your_stats) = runs
        where = f"{blocks} blocks, preemption by {mode}"
        assert got == want, (
            f"{where}: the engine on your manager gave {got}, on the reference's {want}"
        )
        assert your_stats == ref_stats, (
            f"{where}: {dict(zip(keys, your_stats))} on your manager, {dict(zip(keys, ref_stats))} on "
            "the reference's"
        )
        assert ref_stats[0] > 0 and ref_stats[1] > 0 and your_stats[-1] == 0, (
            f"{where}: set-up: the workload hits the prefix cache (hit rate {ref_stats[0]}) and copies "
            f"on write ({ref_stats[1]} copies); every block must be back at the end ({your_stats[-1]} used)"
        )
        assert (ref_stats[2] > 0) == (blocks == 9), f"{where}: preemptions {ref_stats[2]}"
