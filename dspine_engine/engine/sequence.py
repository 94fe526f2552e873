"""The state of one request while the engine works on it."""
from __future__ import annotations

import enum
import time

from .detokenizer import IncrementalDetokenizer
from .outputs import RequestStats
from .sampling import RequestRNG, SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens and progress of one request. Its cache state (lengths, pages) belongs to the cache
    manager, under the sequence's ``seat`` (set while it is admitted)."""

    def __init__(self, request_id: str, prompt, prompt_ids: list[int], params: SamplingParams,
                 detok: IncrementalDetokenizer | None, eos_ids: set[int]):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.output_ids: list[int] = []
        self.params = params
        self.rng = RequestRNG(params.seed)
        self.detok = detok  # None: the request wants token ids only
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else eos_ids)
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.seat: int | None = None
        self.stats = RequestStats(prompt_tokens=len(prompt_ids), seed=self.rng.seed)
        self.t_admitted = time.perf_counter()

    @property
    def anchor(self) -> int:
        return self.output_ids[-1]

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def commit(self, tokens: list[int]) -> list[int]:
        """Appends tokens up to the first stop condition; returns the ones kept."""
        kept = []
        for t in tokens:
            self.output_ids.append(t)
            kept.append(t)
            if t in self.stop_ids:
                self.finish_reason = "stop"
                break
            if len(self.output_ids) >= self.params.max_tokens:
                self.finish_reason = "length"
                break
        if self.stats.new_tokens == 0 and kept:
            self.stats.time_to_first_token = time.perf_counter() - self.t_admitted
        self.stats.new_tokens = len(self.output_ids)
        return kept
