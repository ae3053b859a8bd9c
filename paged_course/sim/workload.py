"""Seeded synthetic request traces with long-tailed lengths, like chat serving traffic.

What it imitates, honestly: chat traces such as ShareGPT have right-skewed prompt and output lengths
(most requests short, a long tail of long ones). We draw both from log-normal distributions whose means
default to roughly the ShareGPT averages shown in the PagedAttention paper's Fig. 11 (about 161 prompt
and 338 output tokens; Kwon et al., SOSP 2023, §6.1). The shape parameters are ours, not fitted to the
real data, so the numbers this trace gives are illustrations of the mechanism, not of ShareGPT itself.

Each request also carries ``max_tokens``, the output cap a client sends with it (drawn from common API
defaults): a reservation-based server must keep room for ``prompt_len + max_tokens`` tokens, while the
request really stops after ``output_len <= max_tokens`` tokens (an EOS token). Lengths are clipped so
that ``prompt_len + max_tokens <= max_seq_len``.

Arrivals: a Poisson process with ``arrival_rate`` requests per decode step, or every request at step 0
(``arrival_rate=None``, an offline batch like vLLM's ``benchmark_throughput``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOKENS_CHOICES = (
    256,
    512,
    1024,
    2048,
)  # typical client caps; clipped to max_seq_len - prompt_len


@dataclass(frozen=True)
class Trace:
    """A batch of requests as NumPy int64 arrays of equal length ``n`` (index = request id).

    ``arrival`` (decode step, non-decreasing), ``prompt_len`` (>= 1), ``output_len`` (>= 1),
    ``max_tokens`` (>= output_len); ``max_seq_len`` bounds ``prompt_len + max_tokens``.
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    max_tokens: np.ndarray
    max_seq_len: int
    seed: int | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival)
        for name in ("prompt_len", "output_len", "max_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, arrival has {n}")
        if n and (self.prompt_len.min() < 1 or self.output_len.min() < 1):
            raise ValueError("prompt_len and output_len must be >= 1 token for every request")
        if n and (self.max_tokens < self.output_len).any():
            raise ValueError("max_tokens must be >= output_len for every request")
        if n and (np.diff(self.arrival) < 0).any():
            raise ValueError("arrival steps must be non-decreasing")

    @property
    def n(self) -> int:
        return len(self.arrival)

    @property
    def final_len(self) -> np.ndarray:
        """Tokens each request holds when it finishes: prompt + output."""
        return self.prompt_len + self.output_len

    @classmethod
    def from_lengths(
        cls, prompt_len, output_len, max_tokens=None, arrival=None, max_seq_len=None
    ) -> Trace:
        """A hand-written trace (tests, exercises). Defaults: ``max_tokens = output_len``, all arrive at 0."""
        p = np.asarray(prompt_len, dtype=np.int64)
        o = np.asarray(output_len, dtype=np.int64)
        m = o.copy() if max_tokens is None else np.asarray(max_tokens, dtype=np.int64)
        a = (
            np.zeros(len(p), dtype=np.int64)
            if arrival is None
            else np.asarray(arrival, dtype=np.int64)
        )
        msl = int((p + m).max()) if max_seq_len is None and len(p) else int(max_seq_len or 1)
        return cls(a, p, o, m, msl)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    mu = np.log(mean) - sigma**2 / 2  # so that E[X] = mean
    return np.maximum(1, np.round(rng.lognormal(mu, sigma, size))).astype(np.int64)


def chat_trace(
    num_requests: int,
    *,
    seed: int = 0,
    max_seq_len: int = 2048,
    mean_prompt: float = 161.0,
    mean_output: float = 338.0,
    sigma_prompt: float = 1.0,
    sigma_output: float = 1.0,
    arrival_rate: float | None = None,
) -> Trace:
    """Draw a seeded chat-like trace (see the module docstring for the distribution).

    Args:
        num_requests: number of requests (>= 0).
        seed: NumPy generator seed; the same arguments always give the same trace.
        max_seq_len: context limit in tokens (>= 2); bounds prompt + max_tokens.
        mean_prompt, mean_output: means of the log-normal lengths before clipping (tokens, > 0).
        sigma_prompt, sigma_output: log-space standard deviations (the tail weight, >= 0).
        arrival_rate: requests per decode step (Poisson), or None for all at step 0.

    Raises:
        ValueError: a negative count, ``max_seq_len < 2``, non-positive means or rate.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be >= 2 tokens, got {max_seq_len}")
    if mean_prompt <= 0 or mean_output <= 0 or sigma_prompt < 0 or sigma_output < 0:
        raise ValueError(
            f"means must be > 0 and sigmas >= 0, got mean_prompt={mean_prompt}, "
            f"mean_output={mean_output}, sigma_prompt={sigma_prompt}, sigma_output={sigma_output}"
        )
    if arrival_rate is not None and arrival_rate <= 0:
        raise ValueError(
            f"arrival_rate must be > 0 requests per step (or None), got {arrival_rate}"
        )
    rng = np.random.default_rng(seed)
    prompt = np.minimum(_lognormal(rng, mean_prompt, sigma_prompt, num_requests), max_seq_len - 1)
    cap = rng.choice(np.array(MAX_TOKENS_CHOICES), size=num_requests)
    max_tokens = np.minimum(cap, max_seq_len - prompt)
    output = np.minimum(_lognormal(rng, mean_output, sigma_output, num_requests), max_tokens)
    if arrival_rate is None:
        arrival = np.zeros(num_requests, dtype=np.int64)
    else:
        arrival = np.floor(np.cumsum(rng.exponential(1.0 / arrival_rate, num_requests))).astype(
            np.int64
        )
    return Trace(arrival, prompt, output, max_tokens.astype(np.int64), max_seq_len, seed)
