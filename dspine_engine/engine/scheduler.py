"""Admission and bookkeeping of requests: who waits, who runs, and the cache manager's driver.

Policy (simple and predictable): FIFO admission; a request is admitted once every cache can
reserve its worst case (and a seat is free), so a running request never runs out of pages and
nothing is preempted. Each step is either one prefill batch (new requests, up to
max_prefill_tokens prompt tokens) or one decode/speculative round over every running request.
The scheduler is the only caller of the cache manager.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .cache_manager import CacheManager
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, cache: CacheManager, max_num_seqs: int, max_prefill_tokens: int,
                 admission_batch: int = 1):
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.admission_batch = admission_batch
        self._budget_cut = False  # the last prefill stopped at max_prefill_tokens: go on
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    # ---------------------------------------------------------------- queue
    def check_fits(self, seq: Sequence) -> None:
        """Raises KVCacheFullError if the request could never be admitted."""
        self.cache.check_fits(seq)

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Moves waiting requests to running while pages, seats and the prefill budget allow,
        and makes their prompts addressable. While requests run, nothing is admitted until
        ``admission_batch`` seats are free (each prefill step pauses every decode), unless the
        previous prefill step was cut short by the token budget."""
        admitted, tokens = [], 0
        free = self.max_num_seqs - len(self.running)
        if (self.running and not self._budget_cut
                and free < min(self.admission_batch, self.max_num_seqs)):
            return admitted
        self._budget_cut = False
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            n = len(seq.prompt_ids)
            if admitted and tokens + n > self.max_prefill_tokens:
                self._budget_cut = True
                break
            if not self.cache.admit(seq):
                break  # FIFO: later requests wait behind it rather than starve it
            self.waiting.popleft()
            seq.status = Status.RUNNING
            admitted.append(seq)
            tokens += n
        if admitted:
            self.cache.prepare_prefill(admitted)
        self.running.extend(admitted)
        return admitted

    # ---------------------------------------------------------------- steps
    def prefilled(self, seqs: list[Sequence]) -> None:
        self.cache.commit_prefill(seqs)

    def prepare_round(self, seqs: list[Sequence]) -> np.ndarray:
        """Pages for this round's blocks; returns the batch's seats."""
        return self.cache.prepare_round(seqs)

    def verified(self, seats: np.ndarray, accepted: np.ndarray,
                 context_written: bool = True) -> None:
        self.cache.commit(seats, accepted, context_written)

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        seq.error = error
        self.cache.release(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
