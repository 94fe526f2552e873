"""The cache manager: the one owner of every sequence's cache state.

Driven by the scheduler alone: `admit` (reserve the worst case and a seat), `prepare_prefill` /
`prepare_round` (make the positions a step writes addressable), `commit` (after verification:
lengths, rollback, the draft's window) and `release`. Model-side caches are described by specs:
`PagedKVSpec` (paged K/V of one model's attention layers, with an optional sliding window) is
one kind; a hybrid target's linear-attention layers add a `RecurrentCache` (recurrent_cache.py:
one state slot per sequence, the round's checkpoint and replay of the accepted prefix), driven
by the same calls on the seats and lengths the manager passes, without touching the scheduler or
the loop.

State lives in per-seat numpy arrays, so a round's bookkeeping is vectorised over the batch and
Python loops only over the few sequences that gain or lose a page. Lengths (one owner):
- ``kv_len[seat]``: target K/V positions held = the anchor's position;
- ``draft_len[seat]``: draft context positions written; ``pending[seat]``: verified positions
  whose draft context is written at the start of the next draft forward (at most a block:
  plain rounds let it grow until the runner writes it, runner.catch_up_context). Between rounds
  ``draft_len + pending == kv_len`` (`check_invariants`).

Block tables are per seat, on the host, with a device mirror updated by deltas (the entries
that changed), so no round copies a table row by row. The last seat is the padding seat: its
table is all page 0 (padding rows of a CUDA graph read page 0 and write nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .kv_cache import KVCache, KVCacheFullError, pages_for
from .recurrent_cache import RecurrentCache


# Pages a sequence takes beyond the one it needs, within its reservation. A round writes a block
# past the anchor, so without them every page boundary costs a round a page in each cache and, on
# CUDA, a block-table flush (host work with the device idle before the round's first graph: the
# scheduler's prepare_round took 245-383 us of a 2.4-2.8 ms DSpine round at c = 8 on the H200,
# 37-80 us in plain decoding, engine_timeline.py, fortieth session). Four pages ahead take a page
# every fifth boundary; the reservation already holds them (admission reserves the worst case).
PAGES_AHEAD = 4


@dataclass(frozen=True)
class PagedKVSpec:
    """Paged K/V for the attention layers of one model."""

    name: str
    num_layers: int
    kv_heads: int
    head_dim: int
    window: int = 0  # a sliding window: queries at p read keys > p - window (0 = all)

    def first_needed(self, anchor):
        """The lowest position a query at ``anchor`` or later can read (the sliding-window
        rule, the only place it is written). Works on ints and numpy arrays."""
        if not self.window:
            return anchor * 0
        return np.maximum(anchor - self.window + 1, 0)

    def pages_to_reserve(self, max_tokens: int, block: int, page_size: int) -> int:
        """Pages a sequence of at most ``max_tokens`` may hold at once (+ one verify block)."""
        whole = pages_for(max_tokens + block, page_size)
        if not self.window:
            return whole
        # Live positions span at most window + block tokens, which can straddle one extra page.
        return min(whole, pages_for(self.window + block, page_size) + 1)


class PagedCache:
    """One model's K/V pages and every seat's block table."""

    def __init__(self, spec: PagedKVSpec, num_pages: int, page_size: int, max_seats: int,
                 max_pages: int, dtype: torch.dtype, device: torch.device,
                 mirrored: bool | None = None):
        self.spec = spec
        self.kv = KVCache(spec.num_layers, num_pages, page_size, spec.kv_heads, spec.head_dim,
                          dtype, device)
        self.page_size = page_size
        self.pool = self.kv.pool
        self.max_pages = max_pages
        cuda = device.type == "cuda"
        mirrored = cuda if mirrored is None else mirrored  # on the CPU the host table is read
        host = torch.full((max_seats + 1, max_pages), -1, dtype=torch.int32,
                          pin_memory=cuda)
        host[max_seats] = 0  # the padding seat reads page 0 and writes nothing
        self._host = host.numpy()
        self.tables = host.to(device, copy=True) if mirrored else host  # what kernels read
        self._flat = self.tables.view(-1)
        # Entries changed since the last flush (the last value of each: one entry may be freed
        # and taken again between two flushes, and a scatter with repeated indices is unordered).
        self._deltas: dict[int, int] | None = {} if mirrored else None
        n = max_seats + 1
        self.num_entries = np.zeros(n, np.int64)  # table entries in use (-1 or a page)
        self.first_live = np.zeros(n, np.int64)  # entries before it were freed (-1)
        self.live = np.zeros(n, np.int64)  # real pages held
        self.reserved = np.zeros(n, np.int64)  # pages the seat may hold at once

    # ------------------------------------------------------------------ pages
    def reserve(self, seat: int, pages: int) -> bool:
        if not self.pool.reserve(pages):
            return False
        self.reserved[seat] = pages
        return True

    def ensure(self, seats: np.ndarray, tokens: np.ndarray, first_needed: np.ndarray) -> None:
        """Makes positions first_needed..tokens-1 of each seat addressable (entries below
        first_needed that were never allocated stay -1: nothing reads them). A seat that needs
        a page takes up to PAGES_AHEAD more while its reservation has room."""
        need = -(-tokens // self.page_size)
        for i in np.nonzero(need > self.num_entries[seats])[0]:
            self._grow(int(seats[i]), int(need[i]), int(first_needed[i]) // self.page_size)

    def _grow(self, seat: int, entries: int, first_page: int) -> None:
        start = int(self.num_entries[seat])
        if start < first_page:  # entries outside the window are freed, or skipped (stay -1)
            self._drop(seat, range(int(self.first_live[seat]), start))
            start = min(first_page, entries)
            self.first_live[seat] = self.num_entries[seat] = start
        count = entries - start
        room = int(self.reserved[seat] - self.live[seat])
        if count > room:
            raise KVCacheFullError(f"{self.spec.name}: sequence needs {self.live[seat] + count} "
                                   f"pages, reserved {self.reserved[seat]}")
        count = min(count + PAGES_AHEAD, room, self.max_pages - start)
        entries = start + count
        for col, page in zip(range(start, entries), self.pool.take(count)):
            self._set(seat, col, page)
        self.live[seat] += count
        self.num_entries[seat] = entries

    def free_before(self, seats: np.ndarray, positions: np.ndarray) -> None:
        """Frees pages holding only positions < position (outside every future window)."""
        first = np.minimum(positions // self.page_size, self.num_entries[seats])
        for i in np.nonzero(first > self.first_live[seats])[0]:
            seat = int(seats[i])
            self._drop(seat, range(int(self.first_live[seat]), int(first[i])))
            self.first_live[seat] = first[i]

    def _drop(self, seat: int, cols: range) -> None:
        pages = [int(self._host[seat, c]) for c in cols if self._host[seat, c] >= 0]
        for c in cols:
            self._set(seat, c, -1)
        self.pool.give_back(pages, still_reserved=True)
        self.live[seat] -= len(pages)

    def release(self, seat: int) -> None:
        """Returns the seat's pages and the unused part of its reservation."""
        n = int(self.num_entries[seat])
        pages = [int(p) for p in self._host[seat, :n] if p >= 0]
        self.pool.give_back(pages, still_reserved=False)
        self.pool.unreserve(int(self.reserved[seat] - self.live[seat]))
        for c in range(n):
            self._set(seat, c, -1)
        self.num_entries[seat] = self.first_live[seat] = self.live[seat] = 0
        self.reserved[seat] = 0

    def _set(self, seat: int, col: int, page: int) -> None:
        self._host[seat, col] = page
        if self._deltas is not None:
            self._deltas[seat * self.max_pages + col] = page

    # ------------------------------------------------------------------ the manager's calls
    # (the recurrent-state cache needs no prepare step: its slot exists from admission, the
    # verify forward keeps the checkpoint itself, and its commit replays the accepted prefix)
    def prepare_prefill(self, seats: np.ndarray, lens: np.ndarray) -> None:
        self.ensure(seats, lens, self.spec.first_needed(lens))

    def prepare_round(self, seats: np.ndarray, anchors: np.ndarray, block: int) -> None:
        self.ensure(seats, anchors + block, self.spec.first_needed(anchors))

    def commit(self, seats: np.ndarray, new_len: np.ndarray) -> None:
        """Positions < new_len are kept; later ones (rejected drafts) roll back by the length
        alone: their pages stay, since the next round's block needs them again (they hold no
        more than a block past new_len, the reservation covers them, and every position is
        written before it is read). With a window, pages no future query can see are freed."""
        if self.spec.window:
            self.free_before(seats, self.spec.first_needed(new_len))

    # ------------------------------------------------------------------ addressing
    def slots(self, seat: int, positions: np.ndarray) -> np.ndarray:
        """KV slots (page * page_size + offset) of one seat's positions (host)."""
        pages = self._host[seat, positions // self.page_size].astype(np.int64)
        return pages * self.page_size + positions % self.page_size

    def flush(self) -> None:
        """Brings the device mirror of the block tables up to date (one copy + one scatter),
        queued behind the device's work: from pinned memory, so the host does not wait for the
        device (an overlapped round may still run; it read the entries before this)."""
        if not self._deltas:
            return
        cuda = self.tables.device.type == "cuda"
        d = torch.empty(2, len(self._deltas), dtype=torch.int64, pin_memory=cuda)
        d[0] = torch.as_tensor(list(self._deltas), dtype=torch.int64)
        d[1] = torch.as_tensor(list(self._deltas.values()), dtype=torch.int64)
        self._deltas.clear()
        dev = d.to(self.tables.device, non_blocking=True)
        self._flat[dev[0]] = dev[1].to(torch.int32)


class CacheManager:
    def __init__(self, target: PagedKVSpec, draft: PagedKVSpec | None, num_pages: int,
                 page_size: int, max_seats: int, max_position: int, block: int,
                 dtype: torch.dtype, device: torch.device,
                 recurrent: RecurrentCache | None = None, ahead: int = 0):
        """``recurrent``: a hybrid target's recurrent-state cache (a slot per running sequence,
        taken at admission like the pages). ``ahead``: positions the device's lengths may run
        ahead of the host's (overlapped rounds: a block), covered by every round's pages and
        every reservation."""
        max_pages = pages_for(max_position, page_size)  # a live row never reaches past it
        self.block = block
        self.reach = block + ahead  # positions past the host's anchor a round may touch
        self.page_size = page_size
        self.max_seats = max_seats
        self.padding_seat = max_seats
        self.target = PagedCache(target, num_pages, page_size, max_seats, max_pages, dtype,
                                 device)
        self.draft = (PagedCache(draft, num_pages, page_size, max_seats, max_pages, dtype,
                                 device) if draft is not None else None)
        self.caches = [c for c in (self.target, self.draft) if c is not None]
        self.recurrent = recurrent
        n = max_seats + 1
        self.kv_len = np.zeros(n, np.int64)
        self.draft_len = np.zeros(n, np.int64)
        self.pending = np.zeros(n, np.int64)
        self._free_seats = list(range(max_seats - 1, -1, -1))

    # ------------------------------------------------------------------ admission
    def _max_tokens(self, seq) -> int:
        return len(seq.prompt_ids) + seq.params.max_tokens

    def check_fits(self, seq) -> None:
        """Raises KVCacheFullError if the request could never be admitted."""
        for c in self.caches:
            need = c.spec.pages_to_reserve(self._max_tokens(seq), self.reach, self.page_size)
            if need > c.pool.num_pages:
                raise KVCacheFullError(
                    f"request needs {need} {c.spec.name} KV pages ({need * self.page_size} "
                    f"tokens: prompt {len(seq.prompt_ids)} + max_tokens {seq.params.max_tokens} "
                    f"+ {self.reach} tokens a round may reach past them) but the pool holds "
                    f"{c.pool.num_pages}; lower max_tokens or raise kv_cache_tokens")

    def admit(self, seq) -> bool:
        """Reserves the request's worst case in every cache and a seat; False if it must wait."""
        needs = [c.spec.pages_to_reserve(self._max_tokens(seq), self.reach, self.page_size)
                 for c in self.caches]
        if not self._free_seats or any(c.pool.available < n for c, n in zip(self.caches, needs)):
            return False
        seat = self._free_seats[-1]
        if self.recurrent is not None and not self.recurrent.admit(seat):
            return False  # every state slot is taken: wait for a sequence to finish
        self._free_seats.pop()
        for c, n in zip(self.caches, needs):
            c.reserve(seat, n)
        seq.seat = seat
        self.kv_len[seat] = self.draft_len[seat] = self.pending[seat] = 0
        return True

    def release(self, seq) -> None:
        seat = seq.seat
        if seat is None:
            return
        for c in self.caches:
            c.release(seat)
        if self.recurrent is not None:
            self.recurrent.release(seat)
        self.kv_len[seat] = self.draft_len[seat] = self.pending[seat] = 0
        self._free_seats.append(seat)
        seq.seat = None

    # ------------------------------------------------------------------ steps
    @staticmethod
    def seats_of(seqs) -> np.ndarray:
        return np.fromiter((s.seat for s in seqs), np.int64, len(seqs))

    def prepare_prefill(self, seqs) -> np.ndarray:
        """Pages for the prompts (the draft's only inside its window). Returns the seats."""
        seats = self.seats_of(seqs)
        lens = np.fromiter((len(s.prompt_ids) for s in seqs), np.int64, len(seqs))
        for c in self.caches:
            c.prepare_prefill(seats, lens)
        self.flush()
        return seats

    def commit_prefill(self, seqs) -> None:
        """The prompts' K/V (and draft context) are written: the anchor follows the prompt."""
        seats = self.seats_of(seqs)
        lens = np.fromiter((len(s.prompt_ids) for s in seqs), np.int64, len(seqs))
        self.kv_len[seats] = lens
        self.draft_len[seats] = lens
        self.pending[seats] = 0

    def prepare_round(self, seqs) -> np.ndarray:
        """Pages for one block per sequence at its anchor (and as far ahead as the device may
        be), in every cache. Returns the seats."""
        seats = self.seats_of(seqs)
        anchors = self.kv_len[seats]
        for c in self.caches:
            c.prepare_round(seats, anchors, self.reach)
        self.flush()
        return seats

    def commit(self, seats: np.ndarray, accepted: np.ndarray,
               context_written: bool = True) -> None:
        """After verification: the anchor and ``accepted`` drafts stay, the rest rolls back,
        their draft context is pending, and draft pages leaving the window are freed.
        ``context_written``: the round wrote the previously pending draft context (a draft
        forward, or a plain round's catch-up); else it stays pending and this round's
        positions join it."""
        p = self.kv_len[seats]
        new_len = p + accepted + 1
        self.kv_len[seats] = new_len
        if self.draft is not None:
            if context_written:
                self.draft_len[seats] = p
                self.pending[seats] = accepted + 1
            else:
                self.pending[seats] += accepted + 1
        for c in self.caches:
            c.commit(seats, new_len)
        if self.recurrent is not None:
            self.recurrent.commit(seats, accepted)

    def flush(self) -> None:
        for c in self.caches:
            c.flush()
        if self.recurrent is not None:
            self.recurrent.flush()

    # ------------------------------------------------------------------ checks
    def check_invariants(self, seqs) -> None:
        """Between rounds: target K/V length == anchor position == draft context length
        (written + pending); every seat's pages within its reservation."""
        for s in seqs:
            anchor_pos = s.total_len - 1
            assert self.kv_len[s.seat] == anchor_pos, (s.request_id, self.kv_len[s.seat],
                                                       anchor_pos)
            if self.draft is not None:
                assert self.draft_len[s.seat] + self.pending[s.seat] == anchor_pos
            for c in self.caches:
                assert c.live[s.seat] <= c.reserved[s.seat]
            if self.recurrent is not None:
                assert self.recurrent.slot(s.seat) >= 0, s.request_id
