"""One forward pass of a transformers model over a scheduled batch, on the paged KV cache.

``ModelRunner.execute(prefills, decodes)`` packs every token the step computes into one row
(``input_ids [1, T]``): for each sequence, ``token_ids[num_computed_tokens:]`` (the whole uncached
prompt for a prefill, the last sampled token for a decode), prefills first. It builds the step's
``AttentionMetadata`` (positions, slot mapping, padded block tables, context lengths) once, runs the
model, and returns the logits of each sequence's last token, ``[S, vocab]`` float32. The K/V of the
new tokens land in the pool inside the attention function (``paged/worker/attention.py``).

Also here: sizing the pool. ``profile_num_blocks`` follows vLLM's
``Worker.determine_num_available_blocks`` (``vllm/worker/worker.py``): run the largest step the
scheduler may issue with no KV cache, read the peak of GPU memory, and give the pool
``total x gpu_memory_utilization - peak`` bytes.
"""

from __future__ import annotations

import time

import torch

from paged.worker.attention import AttentionMetadata, forward_logits, select_backend, use_paged_attention


class ModelRunner:
    """Runs ``model`` over packed batches against ``kv_cache``.

    Args:
        model: a ``PreTrainedModel`` (switched to the ``"paged"`` attention on every call, so the same
            object can be used by ``model.generate`` in between after ``hf.use_attention(model)``).
        kv_cache: the ``KVCache`` pool (same device and dtype as the model).
        block_size: tokens per block.
        backend: ``"torch"`` or ``"triton"`` (default: by device, see ``attention.select_backend``).

    ``forward_seconds`` accumulates the time spent in the model, ``prepare_seconds`` the input packing.
    """

    def __init__(self, model, kv_cache, block_size: int, backend: str | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = kv_cache.device
        self.backend = backend or select_backend(self.device)
        self.forward_seconds = 0.0  # inside the model (attention included)
        self.prepare_seconds = 0.0  # packing inputs and building AttentionMetadata

    @torch.inference_mode()
    def execute(self, batch: list[tuple[list[int], int, list[int]]], num_prefills: int) -> torch.Tensor:
        """Logits ``[len(batch), vocab]`` float32, one row per sequence, in ``batch`` order.

        Each entry is ``(new_token_ids, context_len, block_table)``: the tokens computed now are the last
        ``len(new_token_ids)`` of a sequence that holds ``context_len`` tokens after this step. The first
        ``num_prefills`` entries are prefills, the rest decodes (one new token each).
        """
        begin = time.perf_counter()
        tokens: list[int] = []
        tables, context_lens, query_lens = [], [], []
        for new, context_len, table in batch:
            tokens += new
            tables.append(table)
            context_lens.append(context_len)
            query_lens.append(len(new))
        meta = AttentionMetadata.build(self.kv_cache, tables, context_lens, query_lens, num_prefills,
                                       self.block_size, self.device, self.backend)
        input_ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        use_paged_attention(self.model)
        start = time.perf_counter()
        self.prepare_seconds += start - begin
        logits = forward_logits(self.model, input_ids, meta)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.forward_seconds += time.perf_counter() - start
        return logits


def kv_shape(model) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of a transformers decoder (GPT-2: KV heads = heads).

    Reads ``num_hidden_layers`` / ``n_layer``, ``num_key_value_heads`` (absent: MHA), and ``head_dim``
    when the config sets it, else ``hidden_size // num_attention_heads``.
    """
    config = model.config.get_text_config()
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)
    heads = get("num_attention_heads", "n_head")
    head_dim = get("head_dim") or get("hidden_size", "n_embd") // heads
    return int(get("num_hidden_layers", "n_layer")), int(get("num_key_value_heads") or heads), int(head_dim)


@torch.inference_mode()
def profile_num_blocks(model, block_size: int, max_num_batched_tokens: int, max_num_seqs: int,
                       gpu_memory_utilization: float, dtype: torch.dtype) -> tuple[int, str]:
    """GPU blocks that fit beside the model's peak activation memory (CUDA only).

    Runs one dummy forward of ``max_num_batched_tokens`` tokens split over up to ``max_num_seqs``
    sequences through a 1-block-per-sequence scratch pool, then returns
    ``(total x utilization - peak bytes) // bytes_per_block`` and a one-line report.

    Raises:
        ValueError: utilization outside (0, 1], or no block fits (the message gives the numbers).
    """
    from paged.worker.kv_cache import KVCache

    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    device = next(model.parameters()).device
    layers, kv_heads, head_dim = kv_shape(model)
    num_seqs = max(1, min(max_num_seqs, max_num_batched_tokens))
    per_seq = max_num_batched_tokens // num_seqs
    blocks_per_seq = -(-per_seq // block_size)
    scratch = KVCache(layers, num_seqs * blocks_per_seq, block_size, kv_heads, head_dim, dtype, device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(num_seqs)]
    meta = AttentionMetadata.build(scratch, tables, [per_seq] * num_seqs, [per_seq] * num_seqs, num_seqs,
                                   block_size, device, select_backend(device))
    use_paged_attention(model)
    forward_logits(model, torch.zeros(per_seq * num_seqs, dtype=torch.long, device=device), meta)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - scratch.bytes
    block_bytes = scratch.bytes_per_block  # the real pool's blocks have the scratch pool's shape and dtype
    del scratch, meta
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    available = int(total * gpu_memory_utilization) - peak
    num_blocks = available // block_bytes
    report = (f"GPU {total / 2**30:.1f} GiB x {gpu_memory_utilization:.2f} - peak {peak / 2**30:.2f} GiB "
              f"(weights + activations) = {available / 2**30:.2f} GiB for KV -> {num_blocks} blocks of "
              f"{block_bytes / 2**10:.0f} KiB")
    if num_blocks <= 0:
        raise ValueError(f"no KV block fits: {report}")
    return num_blocks, report
