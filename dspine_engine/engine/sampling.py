"""Sampling parameters, their validation, and the per-request random stream.

Randomness reaches the kernels only as uniforms drawn from one torch.Generator per request, so a
request's output depends on its seed alone, not on which other requests share its batch.

`SamplingParams.validate` is the one place a request's parameters are checked: everything that
could fail later inside a batched step (an int32 conversion, a denormal 1/T, a seed the generator
cannot take) is refused here with a ValueError that names the parameter, before the request is
queued, so one bad request never reaches a batch.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import torch

# Below this, softmax(logits / T) is greedy to fp32 precision while 1/T approaches the fp32
# range (at ~1e-38 it is denormal and sampling returned the last token id). Use 0 for greedy.
MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 1e4  # far past "uniform"; beyond it the fp32 scale 1/T loses all digits
INT32_MAX = 2**31 - 1
SEED_LIMIT = 2**64  # torch.Generator takes seeds in [0, 2**64)


@dataclass
class SamplingParams:
    """How one request is decoded.

    temperature 0 means greedy (the default: deterministic, and where speculative output is
    token-identical to plain decoding); a sampled request needs MIN_TEMPERATURE <= T <=
    MAX_TEMPERATURE. top_k 0 and top_p 1 disable those filters. Generation stops at the first
    of: an EOS token (unless ignore_eos), a stop token id, a stop string (cut from the returned
    text), or max_tokens new tokens. ``detokenize=False`` skips text entirely (outputs carry
    token ids and empty text; stop strings are then not allowed): for callers that only need
    ids, such as the training-data generator, it removes the per-token detokenisation cost."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    detokenize: bool = True

    def __post_init__(self):
        # Normalise the accepted spellings; anything else is left for validate() to name.
        if self.stop is None or isinstance(self.stop, str):
            self.stop = [] if self.stop is None else [self.stop]
        elif isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, (list, tuple, set, frozenset)):
            self.stop_token_ids = list(self.stop_token_ids)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raises ValueError naming the first impossible parameter."""
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        t = self.temperature
        if not _finite_number(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if t != 0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, "
                             f"{MAX_TEMPERATURE:g}], got {t!r}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= INT32_MAX:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if vocab_size and self.top_k > vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size {vocab_size} "
                             f"(0 = off), got {self.top_k}")
        if not _finite_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.stop, list):
            raise ValueError(f"stop must be a string, a list of strings or None, "
                             f"got {self.stop!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or any(
                not _is_int(i) or i < 0 or (vocab_size and i >= vocab_size)
                for i in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a list of token ids in "
                             f"[0, {vocab_size or 'vocab'}), got {self.stop_token_ids!r}")
        for name in ("ignore_eos", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not self.detokenize and self.stop:
            raise ValueError("stop strings need text: use detokenize=True or stop_token_ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


class RequestRNG:
    """The uniforms of one request: a CPU generator seeded from the request's seed (or from a
    fresh random seed, reported back so the run can be replayed).

    They are drawn CHUNK at a time and handed out in order: torch's CPU generator gives the same
    stream whatever the sizes of the draws (tests/test_engine_config.py checks it), so chunking
    changes no value and saves a torch call per sampled sequence and round."""

    CHUNK = 256

    def __init__(self, seed: int | None):
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**63)
        self._gen = torch.Generator().manual_seed(self.seed)
        self._drawn = np.empty(0, np.float32)
        self._used = 0

    def uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms in [0, 1) (float32)."""
        if self._used + n > len(self._drawn):
            rest = self._drawn[self._used:]
            fresh = torch.rand(max(n - len(rest), self.CHUNK), generator=self._gen).numpy()
            self._drawn, self._used = np.concatenate([rest, fresh]), 0
        out = self._drawn[self._used:self._used + n]
        self._used += n
        return out
