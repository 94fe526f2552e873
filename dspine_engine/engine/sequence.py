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
                 detok: IncrementalDetokenizer | None, eos_ids: set[int], draft_positions: int = 0):
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
        self.stats = RequestStats(prompt_tokens=len(prompt_ids), seed=self.rng.seed,
                                  positions=draft_positions)
        self.t_admitted = time.perf_counter()

    @property
    def anchor(self) -> int:
        return self.output_ids[-1]

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def commit(self, tokens: list[int]) -> list[int]:
        """Appends tokens up to the first stop condition (a stop token, kept, or max_tokens);
        returns the ones kept. Once per sequence and round: set operations, no token loop."""
        out, max_tokens = self.output_ids, self.params.max_tokens
        room = max_tokens - len(out)
        if room <= 0 or not tokens:  # (a running sequence always has room)
            if room <= 0:
                self.finish_reason = "length"
            return []
        kept = tokens[:room]
        if not self.stop_ids.isdisjoint(kept):
            kept = kept[:next(i for i, t in enumerate(kept) if t in self.stop_ids) + 1]
            self.finish_reason = "stop"
        elif len(out) + len(kept) >= max_tokens:
            self.finish_reason = "length"
        if not out:
            self.stats.time_to_first_token = time.perf_counter() - self.t_admitted
        out.extend(kept)
        self.stats.new_tokens = len(out)
        return kept
