"""Paged KV cache: a pool of fixed-size pages per model and the page bookkeeping of a sequence.

Admission reserves a request's worst case up front (prompt + max_tokens + one verify block), but
pages are taken from the free list only as the sequence grows and go back as soon as they hold
nothing needed (rollback past rejected drafts, positions outside the draft's sliding window).
A request that can never fit is refused with a clear error; one that fits later waits.
"""
from __future__ import annotations

import math

import torch


class KVCacheFullError(RuntimeError):
    """A request needs more KV pages than the pool can ever hold."""


def pages_for(tokens: int, page_size: int) -> int:
    return math.ceil(tokens / page_size) if tokens > 0 else 0


class PagePool:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self._promised = 0  # pages reserved by admitted sequences but not yet taken

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def available(self) -> int:
        """Pages a new request could still reserve."""
        return len(self._free) - self._promised

    def reserve(self, n: int) -> bool:
        if n > self.available:
            return False
        self._promised += n
        return True

    def take(self, n: int) -> list[int]:
        """Hands out n pages of an existing reservation."""
        assert n <= self._promised and n <= len(self._free), "page taken without a reservation"
        self._promised -= n
        return [self._free.pop() for _ in range(n)]

    def give_back(self, pages: list[int], still_reserved: bool) -> None:
        """Returns pages; they stay promised to the sequence when it may need them again."""
        self._free.extend(pages)
        if still_reserved:
            self._promised += len(pages)

    def unreserve(self, n: int) -> None:
        self._promised -= n
        assert self._promised >= 0


class SequencePages:
    """Pages of one sequence in one pool. Entries freed by the sliding window become -1 (the
    attention kernels never read a page no query can see)."""

    def __init__(self, pool: PagePool, page_size: int, reserved: int):
        self.pool = pool
        self.page_size = page_size
        self.reserved = reserved  # pages this sequence may hold at once
        self.table: list[int] = []
        self._live = 0  # entries that are real pages (not -1)

    def ensure(self, tokens: int, first_needed: int = 0) -> None:
        """Makes positions first_needed..tokens-1 addressable (earlier pages that were never
        allocated stay -1: a sliding-window draft never reads them)."""
        skip = first_needed // self.page_size
        while len(self.table) < min(skip, pages_for(tokens, self.page_size)):
            self.table.append(-1)
        need = pages_for(tokens, self.page_size) - len(self.table)
        if need > 0:
            if self._live + need > self.reserved:
                raise KVCacheFullError(
                    f"sequence needs {self._live + need} pages, reserved {self.reserved}")
            self.table.extend(self.pool.take(need))
            self._live += need

    def truncate(self, tokens: int) -> None:
        """Frees pages wholly beyond the first `tokens` positions (after a rollback)."""
        keep = pages_for(tokens, self.page_size)
        if keep < len(self.table):
            dropped = [p for p in self.table[keep:] if p >= 0]
            del self.table[keep:]
            self._live -= len(dropped)
            self.pool.give_back(dropped, still_reserved=True)

    def free_before(self, position: int) -> None:
        """Frees pages holding only positions < position (outside every future window)."""
        for i in range(min(position // self.page_size, len(self.table))):
            if self.table[i] >= 0:
                self.pool.give_back([self.table[i]], still_reserved=True)
                self.table[i] = -1
                self._live -= 1

    def release(self) -> None:
        """Returns everything (sequence finished): pages and the unused reservation."""
        live = [p for p in self.table if p >= 0]
        self.pool.give_back(live, still_reserved=False)
        self.pool.unreserve(self.reserved - self._live)
        self.table, self._live, self.reserved = [], 0, 0

    def slot(self, position: int) -> int:
        return self.table[position // self.page_size] * self.page_size + position % self.page_size


class KVCache:
    """The K and V pages of every layer of one model: ``[num_pages, page_size, kv_heads, dim]``."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device):
        shape = (num_pages, page_size, kv_heads, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.page_size = page_size
        self.pool = PagePool(num_pages)

    @staticmethod
    def bytes_per_page(num_layers, page_size, kv_heads, head_dim, dtype) -> int:
        return 2 * num_layers * page_size * kv_heads * head_dim * torch.finfo(dtype).bits // 8
