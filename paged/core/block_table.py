"""Block tables: where each token of a sequence lives in the KV cache pool.

A sequence sees its KV cache as consecutive *logical* blocks (tokens ``0..bs-1`` in logical block 0,
``bs..2bs-1`` in logical block 1, ...). Its block table maps logical block ``i`` to the *physical*
block ``table[i]`` handed out by the allocator, which can be anywhere in the pool: this is the page
table of an operating system, with blocks as pages and tokens as bytes (PagedAttention paper §4.1-4.2).

The *slot* of token position ``p`` is its row in the pool flattened to ``[num_blocks * block_size]``:

    slot(p) = table[p // block_size] * block_size + p % block_size

One table per sequence serves every layer (each layer has its own pool tensor with the same layout).
The *slot mapping* of a step lists the slot of every token computed in that step; kernels read the
tables of a batch as an int32 tensor ``[num_seqs, max_blocks_per_seq]`` (``pad_block_tables``).

Sources: vLLM v0 ``vllm/core/block/block_table.py`` (``BlockTable``), ``vllm/attention/backends/utils.py``
(``compute_slot_mapping``); v1 ``vllm/v1/worker/block_table.py``.
"""

from __future__ import annotations


class SequenceTooLongError(ValueError):
    """A sequence needs more tokens than ``max_model_len`` allows (numbers in the message)."""


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)`` (0 tokens -> 0 blocks).

    Raises:
        ValueError: ``num_tokens < 0`` or ``block_size <= 0``.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // block_size)


def width(max_model_len: int, block_size: int) -> int:
    """Columns of a padded block-table tensor: ``ceil(max_model_len / block_size)`` blocks per sequence.

    Example: ``max_model_len=10, block_size=4`` -> 3 (two full blocks and one holding 2 tokens).
    """
    if max_model_len <= 0:
        raise ValueError(f"max_model_len must be a positive number of tokens, got {max_model_len}")
    return blocks_needed(max_model_len, block_size)


def check_length(num_tokens: int, max_model_len: int) -> None:
    """Reject a sequence of ``num_tokens`` (prompt + tokens to generate) longer than ``max_model_len``.

    Raises:
        SequenceTooLongError: ``num_tokens > max_model_len``.
    """
    if num_tokens > max_model_len:
        raise SequenceTooLongError(f"the sequence needs {num_tokens} tokens but max_model_len is "
                                   f"{max_model_len}: it can never run")


class BlockTable:
    """The physical block ids of one sequence, in logical order, and the token count they hold.

    Args:
        block_size: tokens per block (> 0).
        block_ids: physical block ids, logical block 0 first (default: empty).
        num_tokens: tokens that have slots so far (default: full capacity of ``block_ids``).

    Raises:
        ValueError: ``block_size <= 0``; ``num_tokens`` outside the capacity of the blocks given;
        ``slot`` of a position outside ``0 .. capacity - 1``.
    """

    def __init__(self, block_size: int, block_ids: list[int] | None = None, num_tokens: int | None = None):
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        self.block_size = block_size
        self.block_ids: list[int] = list(block_ids or [])
        capacity = len(self.block_ids) * block_size
        self.num_tokens = capacity if num_tokens is None else num_tokens
        if not capacity - block_size < self.num_tokens <= capacity:
            raise ValueError(f"{self.num_tokens} tokens do not fit {len(self.block_ids)} blocks of "
                             f"{block_size} (each block but the last must be full)")

    def __len__(self) -> int:
        return len(self.block_ids)

    def __getitem__(self, logical_block: int) -> int:
        return self.block_ids[logical_block]

    def __iter__(self):
        return iter(self.block_ids)

    def __repr__(self) -> str:
        return f"BlockTable({self.block_ids}, num_tokens={self.num_tokens}, block_size={self.block_size})"

    @property
    def capacity(self) -> int:
        """Token slots the blocks hold: ``len(self) * block_size``."""
        return len(self.block_ids) * self.block_size

    def append(self, block_id: int) -> None:
        self.block_ids.append(block_id)

    def copy(self) -> BlockTable:
        return BlockTable(self.block_size, self.block_ids, self.num_tokens)

    def slot(self, position: int) -> int:
        """Row of token ``position`` in the flattened pool: ``table[p // bs] * bs + p % bs``."""
        bs = self.block_size
        if not 0 <= position < len(self.block_ids) * bs:
            raise ValueError(f"position {position} is outside the {len(self.block_ids)} blocks of this "
                             f"table (capacity {self.capacity} tokens)")
        return self.block_ids[position // bs] * bs + position % bs

    def slot_mapping(self, start: int, end: int) -> list[int]:
        """Slots of token positions ``start .. end - 1`` (the tokens one step computes)."""
        if not 0 <= start <= end <= self.capacity:
            raise ValueError(f"positions {start}..{end - 1} are outside capacity {self.capacity}")
        bs, table = self.block_size, self.block_ids
        return [table[p // bs] * bs + p % bs for p in range(start, end)]


def pad_block_tables(tables: list[list[int]], max_blocks: int | None = None, pad: int = 0):
    """Stack block tables into an int32 tensor ``[num_seqs, max_blocks]`` for the attention kernels.

    Rows shorter than ``max_blocks`` are padded with ``pad`` (default 0, as vLLM v0's
    ``make_tensor_with_pad``): block 0 is a real block, so a stray read of a padded entry stays
    inside the pool; kernels never use it because they stop at each sequence's ``context_len``.
    Pass ``pad=-1`` to make padding visible (any use of it then fails loudly in a gather).

    Raises:
        ValueError: a table longer than ``max_blocks``.
    """
    import torch

    longest = max((len(t) for t in tables), default=0)
    max_blocks = longest if max_blocks is None else max_blocks
    if longest > max_blocks:
        raise ValueError(f"a block table has {longest} blocks, more than max_blocks={max_blocks}")
    rows = [list(t) + [pad] * (max_blocks - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(tables), max_blocks)


__all__ = ["BlockTable", "SequenceTooLongError", "blocks_needed", "check_length", "pad_block_tables", "width"]
