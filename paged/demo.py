"""``python -m paged demo`` (temporary main job): the chapter 01 fragmentation report in a few seconds.

Until the engine demo replaces it, this prints the KV bytes of a few real configs and the three memory
managers of ``paged.sim.fragmentation`` on a seeded 5,000-request chat-like trace.
"""

from __future__ import annotations

import time


def main(argv: list[str] | None = None) -> int:
    from paged.memory import KNOWN_MODELS, format_bytes
    from paged.sim.fragmentation import compare, summary_table
    from paged.sim.workload import chat_trace

    print("KV cache per 2048-token sequence (fp16):")
    for name in ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b"):
        spec = KNOWN_MODELS[name]
        print(f"  {spec.name:<12} {spec.bytes_per_token / 1024:>5.0f} KiB/token  "
              f"{format_bytes(spec.bytes_per_sequence(2048)):>9}/sequence  "
              f"{format_bytes(spec.bytes_per_block(16)):>8}/block of 16")
    start = time.perf_counter()
    trace = chat_trace(5000, seed=0, max_seq_len=2048)
    results = compare(trace, pool_slots=65_536, block_size=16)
    print(f"\n{trace.n} requests (mean prompt {trace.prompt_len.mean():.0f}, mean output "
          f"{trace.output_len.mean():.0f} tokens) on a pool of 65,536 token slots, simulated in "
          f"{time.perf_counter() - start:.2f} s; shares are time averages of the pool:")
    print(summary_table(results))
    return 0
