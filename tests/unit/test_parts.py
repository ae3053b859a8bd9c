"""The engine is assembled from parts: every part passed in is the one that runs, and an engine built
from other implementations of the same interfaces produces the default engine's tokens."""

from __future__ import annotations

from paged.core.allocator import BlockAllocator
from paged.core.block_manager import copy_on_write
from paged.core.block_table import slot_mapping
from paged.core.prefix_cache import PrefixCache
from paged.core.scheduler import Scheduler
from paged.core.sequence import SamplingParams
from paged.engine.llm import LLM
from paged.engine.parts import Parts
from paged.worker.attention import decode_attention, prefill_attention, write_kv
from paged.worker.kv_cache import KVCache
from paged.worker.sampler import Sampler
from paged_course.capstone import origins as capstone_origins
from paged_course.reference import paged_attention_gather
from paged_course.reference.models import tiny_model

CALLS: dict[str, int] = {}


def counted(name, fn):
    def wrapper(*args, **kwargs):
        CALLS[name] = CALLS.get(name, 0) + 1
        return fn(*args, **kwargs)

    return wrapper


class CountingAllocator(BlockAllocator):
    def allocate_many(self, n):
        CALLS["allocator"] = CALLS.get("allocator", 0) + 1
        return super().allocate_many(n)


class CountingPrefixCache(PrefixCache):
    def lookup(self, seq, max_blocks):
        CALLS["prefix_cache"] = CALLS.get("prefix_cache", 0) + 1
        return super().lookup(seq, max_blocks)


class CountingScheduler(Scheduler):
    def schedule(self):
        CALLS["scheduler"] = CALLS.get("scheduler", 0) + 1
        return super().schedule()


class CountingSampler(Sampler):
    def sample(self, logits, params, generators=None):
        CALLS["sampler"] = CALLS.get("sampler", 0) + 1
        return super().sample(logits, params, generators)


def gather_decode(query, key_cache, value_cache, block_tables, context_lens, scale):
    """A different implementation of the decode interface: the reference gather-then-softmax."""
    CALLS["decode_attention"] = CALLS.get("decode_attention", 0) + 1
    return paged_attention_gather(query, key_cache, value_cache, block_tables, context_lens, scale)


def run(parts: Parts | None):
    model = tiny_model("llama", vocab_size=128)
    llm = LLM(
        model,
        block_size=4,
        num_gpu_blocks=24,
        max_num_batched_tokens=8,
        max_num_seqs=8,
        parts=parts,
        verbose=False,
    )
    shared = [3, 1, 4, 1, 5, 9, 2, 6]
    prompts = [shared + [7, 7], shared + [8], [50 + i for i in range(13)], [90, 91]]
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True, n=2 if i == 1 else 1)
        for i in range(len(prompts))
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [[c.token_ids for c in o.outputs] for o in outs], llm.stats()


def test_an_engine_from_parts_passed_in_gives_the_default_engines_tokens():
    default, default_stats = run(None)
    CALLS.clear()
    parts = Parts(
        allocator=CountingAllocator,
        prefix_cache=CountingPrefixCache,
        scheduler=CountingScheduler,
        copy_on_write=counted("copy_on_write", copy_on_write),
        slot_mapping=counted("slot_mapping", slot_mapping),
        write_kv=counted("write_kv", write_kv),
        decode_attention=gather_decode,
        sampler=CountingSampler,
        prefill_attention=counted("prefill_attention", prefill_attention),
    )
    custom, custom_stats = run(parts)
    assert custom == default, (
        "an engine built from other implementations of the parts must give the same tokens"
    )
    assert set(CALLS) == {
        "allocator",
        "prefix_cache",
        "scheduler",
        "copy_on_write",
        "slot_mapping",
        "write_kv",
        "decode_attention",
        "sampler",
        "prefill_attention",
    }, f"every part passed in must run, ran: {sorted(CALLS)}"
    assert default_stats["prefill_chunks"] > len(default), (
        "a budget of 8 tokens chunks the 13-token prompt"
    )
    assert custom_stats["cow_copies"] >= 1 and custom_stats["prefix_cache_hit_rate"] > 0


def test_parts_default_to_the_reference_and_name_their_origins():
    parts = Parts()
    attention = parts.attention(KVCache(1, 4, 4, 1, 8))
    assert attention.decode is decode_attention and attention.prefill is prefill_attention
    origins = capstone_origins(parts)
    assert origins["allocator"] == "paged.core.allocator.BlockAllocator"
    assert origins["decode_attention"] == "by device"
    assert capstone_origins(Parts(decode_attention=gather_decode))["decode_attention"].endswith(
        "gather_decode"
    )
