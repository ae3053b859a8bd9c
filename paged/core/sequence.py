"""Requests and their sequences: the token-level state every other module reads.

A *request* (``SequenceGroup``) holds one prompt and its ``SamplingParams``. It owns one ``Sequence``
while the prompt is prefilled; with ``n > 1`` the engine forks it into ``n`` sequences after the first
sampled token (parallel sampling, PagedAttention paper §4.4), and the forks share the prompt's KV
blocks until one of them writes into a shared block (copy-on-write, ``block_manager.py``).

The scheduler's unit is the sequence (as vLLM v1, where each of the ``n`` samples is its own request
sharing the prompt's blocks through the prefix cache, ``vllm/v1/engine/parallel_sampling.py``, 0.10.2):
siblings run, wait, swap or are preempted independently, so ``n`` samples never need room in the pool all
at once. Source of the design: vLLM v0 ``vllm/sequence.py`` (``Sequence``, ``SequenceGroup``) and v1
``vllm/v1/request.py`` (``num_computed_tokens``), both 0.10.2.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life: queued, running on the GPU pool, swapped to CPU, or finished."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"  # EOS or a stop token was sampled
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "abort"  # abort_request()
    FINISHED_IGNORED = "ignored"  # can never run: prompt over max_model_len or over the whole cache
    # this course's state: alone in the pool, no block to grow into
    FINISHED_KV_EXHAUSTED = "kv_cache_exhausted"

    @property
    def is_finished(self) -> bool:
        return self.value not in ("waiting", "running", "swapped")

    @property
    def finish_reason(self) -> str | None:
        """The ``finish_reason`` string, or None while unfinished: ``stop``, ``length``, ``abort`` as vLLM v1's
        (``vllm/v1/engine/__init__.py``, 0.10.2), or ``ignored``, which vLLM v0 reports as ``length``."""
        return self.value if self.is_finished else None


class Sequence:
    """The token ids of one generated continuation and how many of them already have KV in the pool.

    Args:
        seq_id: unique integer id (the block manager's key for this sequence's block table).
        prompt_token_ids: the prompt, a non-empty list of int token ids.
        block_size: tokens per KV block (> 0).

    ``num_computed_tokens`` counts the leading tokens whose K/V are written (by earlier steps or found in
    the prefix cache); the scheduler advances it when it schedules tokens (vLLM v1,
    ``vllm/v1/core/sched/scheduler.py``, 0.10.2). ``block_hashes`` holds the prefix-cache keys of the full
    blocks, each computed once. ``group`` is the request.

    Nothing is checked here: ``LLMEngine.add_request`` has checked the prompt (non-empty, int token ids
    inside the vocabulary) and ``CacheConfig`` the block size.
    """

    def __init__(self, seq_id: int, prompt_token_ids: list[int], block_size: int):
        prompt = list(prompt_token_ids)
        self.seq_id = seq_id
        self.block_size = block_size
        self.token_ids: list[int] = prompt
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # tokens served from the prefix cache at the last admission
        self.status = SequenceStatus.WAITING
        self.finish_message: str | None = None  # human-readable reason for ignored / exhausted
        self.block_hashes: list[int] = []  # prefix-cache keys of the full blocks (prefix_cache.py)
        self.group: SequenceGroup | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_token_id(self, token_id: int) -> None:
        """Append one sampled token; its K/V are written by the next forward pass."""
        self.token_ids.append(int(token_id))

    def fork(self, new_seq_id: int) -> Sequence:
        """A copy with the same tokens, computed count and request (its blocks are shared by
        ``BlockSpaceManager.fork``)."""
        child = Sequence.__new__(Sequence)
        child.__dict__.update(self.__dict__)
        child.seq_id = new_seq_id
        child.token_ids = list(self.token_ids)
        child.block_hashes = list(self.block_hashes)
        return child

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: drop all KV; a later prefill recomputes every token so far."""
        self.num_computed_tokens = self.num_cached_tokens = 0
        self.status = SequenceStatus.WAITING


@dataclass
class SamplingParams:
    """How to pick tokens for one request (names as vLLM's ``SamplingParams``).

    Names and defaults follow vLLM v0 and v1 (``vllm/sampling_params.py``, 0.10.2) except two defaults:
    vLLM's ``temperature`` is 1.0, and its ``top_k`` is 0 (0 or -1 disable it; 0.6.3's default was -1).

    ``temperature == 0`` is greedy. ``top_k = -1`` disables top-k; ``top_p = 1`` disables top-p.
    ``seed`` makes a request's random sampling reproducible whatever else is in the batch.
    ``max_tokens`` counts generated tokens. With ``n > 1`` the request returns ``n`` continuations.

    Raises:
        ValueError: ``n < 1``, ``temperature < 0``, ``top_p`` outside (0, 1], ``top_k`` = 0 or < -1,
        ``max_tokens < 1``.
    """

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(
                f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SequenceGroup:
    """One request: a prompt, its sampling parameters and its sequences (1 before the fork, then n)."""

    def __init__(
        self,
        request_id: str,
        seqs: list[Sequence],
        sampling_params: SamplingParams,
        arrival_time: float = 0.0,
        prompt: str | None = None,
    ):
        self.request_id = request_id
        self.seqs = list(seqs)
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.prompt = prompt
        self.prompt_token_ids = list(seqs[0].prompt_token_ids)
        # tokens that end a sequence (the engine adds the model's EOS unless ``ignore_eos``)
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids)
        # the request's own sampling generator (``SamplingParams.seed``), or None
        self.generator = None
        for seq in self.seqs:
            seq.group = self

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


@dataclass
class CompletionOutput:
    """One continuation of a request: ``token_ids`` generated, ``text`` decoded when a tokenizer exists."""

    index: int
    token_ids: list[int]
    text: str = ""
    finish_reason: str | None = None
    finish_message: str | None = None


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns per prompt, in input order (vLLM v0 and v1 ``RequestOutput``,
    ``vllm/outputs.py``, 0.10.2)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
