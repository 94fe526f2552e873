"""Admission and bookkeeping of requests: who waits, who runs, whose pages go back.

Policy (simple and predictable): FIFO admission; a request is admitted once both pools can
reserve its worst case, so a running request never runs out of pages and nothing is preempted.
Each step is either one prefill batch (new requests, up to max_prefill_tokens prompt tokens) or
one decode/speculative round over every running request.
"""
from __future__ import annotations

from collections import deque

from .kv_cache import KVCache, KVCacheFullError, SequencePages, pages_for
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, target_kv: KVCache, draft_kv: KVCache | None, block: int,
                 draft_window: int, max_num_seqs: int, max_prefill_tokens: int):
        self.target_kv = target_kv
        self.draft_kv = draft_kv
        self.block = block  # tokens a round verifies per sequence (1 without a draft)
        self.draft_window = draft_window  # 0 = the draft keeps its whole context
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    # ---------------------------------------------------------------- reservations
    def _target_pages(self, seq: Sequence) -> int:
        return pages_for(len(seq.prompt_ids) + seq.params.max_tokens + self.block,
                         self.target_kv.page_size)

    def _draft_pages(self, seq: Sequence) -> int:
        ps = self.draft_kv.page_size
        whole = pages_for(len(seq.prompt_ids) + seq.params.max_tokens + self.block, ps)
        if self.draft_window <= 0:
            return whole
        # Live positions span at most window + block tokens, which can straddle one extra page.
        return min(whole, pages_for(self.draft_window + self.block, ps) + 1)

    def check_fits(self, seq: Sequence) -> None:
        """Raises KVCacheFullError if the request could never be admitted."""
        for kv, need, name in ((self.target_kv, self._target_pages(seq), "target"),
                               (self.draft_kv, self.draft_kv and self._draft_pages(seq), "draft")):
            if kv is not None and need > kv.pool.num_pages:
                raise KVCacheFullError(
                    f"request needs {need} {name} KV pages ({need * kv.page_size} tokens: prompt "
                    f"{len(seq.prompt_ids)} + max_tokens {seq.params.max_tokens} + block "
                    f"{self.block}) but the pool holds {kv.pool.num_pages}; lower max_tokens or "
                    f"raise kv_cache_tokens")

    # ---------------------------------------------------------------- queue
    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Moves waiting requests to running while pages, seats and the prefill budget allow."""
        admitted, tokens = [], 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            n = len(seq.prompt_ids)
            if admitted and tokens + n > self.max_prefill_tokens:
                break
            if not self._reserve(seq):
                break  # FIFO: later requests wait behind it rather than starve it
            self.waiting.popleft()
            seq.status = Status.RUNNING
            admitted.append(seq)
            tokens += n
        self.running.extend(admitted)
        return admitted

    def _reserve(self, seq: Sequence) -> bool:
        t_need = self._target_pages(seq)
        d_need = self._draft_pages(seq) if self.draft_kv is not None else 0
        if self.target_kv.pool.available < t_need:
            return False
        if self.draft_kv is not None and self.draft_kv.pool.available < d_need:
            return False
        self.target_kv.pool.reserve(t_need)
        seq.target_pages = SequencePages(self.target_kv.pool, self.target_kv.page_size, t_need)
        if self.draft_kv is not None:
            self.draft_kv.pool.reserve(d_need)
            seq.draft_pages = SequencePages(self.draft_kv.pool, self.draft_kv.page_size, d_need)
        return True

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        seq.error = error
        for pages in (seq.target_pages, seq.draft_pages):
            if pages is not None:
                pages.release()
        seq.target_pages = seq.draft_pages = None
        seq.pending_taps = None
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
