"""Sampling parameters and the per-request random stream.

Randomness reaches the kernels only as uniforms drawn from one torch.Generator per request, so a
request's output depends on its seed alone, not on which other requests share its batch.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    """How one request is decoded.

    temperature 0 means greedy (the default: deterministic, and where speculative output is
    token-identical to plain decoding). top_k 0 and top_p 1 disable those filters. Generation
    stops at the first of: an EOS token (unless ignore_eos), a stop token id, a stop string (cut
    from the returned text), or max_tokens new tokens."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raises ValueError naming the first impossible parameter."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _finite_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _finite_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        if any(not isinstance(t, int) or t < 0 or (vocab_size and t >= vocab_size)
               for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids in [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class RequestRNG:
    """The uniforms of one request: a CPU generator seeded from the request's seed (or from a
    fresh random seed, reported back so the run can be replayed)."""

    def __init__(self, seed: int | None):
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**63)
        self._gen = torch.Generator().manual_seed(self.seed)

    def uniforms(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self._gen)
