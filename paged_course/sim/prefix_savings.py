"""Prefix caching's savings on one shared system prompt, computed with the engine's real ``BlockSpaceManager``.

Data only (no timing, no plotting): ``bench/prefix.py`` prints and plots it, ``viz/blocks.py`` draws it and the
seed-claims ledger (``reference/ledger.py``) reads it, so none of them imports another's module for it.
"""

from __future__ import annotations

import random

from paged.core.block_manager import BlockSpaceManager
from paged.core.sequence import Sequence


def shared_prompt_savings(
    system_len: int,
    num_requests: int = 100,
    question_len: int = 50,
    block_size: int = 16,
    seed: int = 0,
) -> dict:
    """Blocks and prefill tokens for ``num_requests`` concurrent requests sharing a system prompt.

    Returns ``blocks_without``, ``blocks_with``, ``block_saving`` (fraction of blocks saved),
    ``prefill_without`` / ``prefill_with`` (prompt tokens computed) and ``speedup_bound``
    (prefill_without / prefill_with: the most caching can speed up the prompt phase).
    """
    rng = random.Random(seed)
    system = [rng.randrange(1, 32_000) for _ in range(system_len)]
    prompts = [
        system + [rng.randrange(1, 32_000) for _ in range(question_len)]
        for _ in range(num_requests)
    ]
    out = {
        "system_len": system_len,
        "num_requests": num_requests,
        "question_len": question_len,
        "block_size": block_size,
    }
    for caching in (False, True):
        total = num_requests * -(-(system_len + question_len) // block_size)
        manager = BlockSpaceManager(block_size, total, watermark=0.0, enable_prefix_caching=caching)
        computed = 0
        for i, prompt in enumerate(prompts):
            seq = Sequence(i, prompt, block_size)
            manager.allocate_slots(seq)
            computed += len(seq) - seq.num_computed_tokens
        suffix = "with" if caching else "without"
        out[f"blocks_{suffix}"] = total - manager.get_num_free_gpu_blocks()
        out[f"prefill_{suffix}"] = computed
    out["block_saving"] = 1 - out["blocks_with"] / out["blocks_without"]
    out["blocks_ratio"] = out["blocks_with"] / out["blocks_without"]
    out["speedup_bound"] = out["prefill_without"] / out["prefill_with"]
    return out
