"""Memory for the packed CPU weights, in transparent huge pages where the system offers them.

Why: a CPU decode step reads every weight once (~100 MB for the default model), more than the
caches hold, so the weights stream from memory every step. In 4 KiB pages that is ~25,000 TLB
misses a step, each a page walk (a two-level one under a hypervisor); in 2 MiB pages ~50. With
the GEMM kernels' prefetch, the weights stream 1.31-1.46x faster than before both
(docs/BENCHMARKS.md, "prefetching the weights, huge pages, ...").

How: Linux backs a private anonymous mapping with huge pages where it is advised to
(``madvise(MADV_HUGEPAGE)``, honoured when /sys/kernel/mm/transparent_hugepage/enabled is
``always`` or ``madvise``) and only on 2 MiB-aligned ranges of it. Most projections of the
default model are 70 KB - 1.1 MB, far below one huge page, so they are carved one after another
from shared slabs rather than mapped one by one. A slab is unmapped when the last tensor carved
from it is freed (each carved tensor is a view of the slab's tensor). Elsewhere (no ``mmap``
flags or ``madvise``) the buffers are plain ``torch.empty`` ones.
"""
from __future__ import annotations

import mmap
import threading

import torch

_SLAB_BYTES = 64 << 20  # address space only: pages exist once a weight is written into them
_ALIGN = 64  # a cache line: the kernels' loads never straddle one more than they must
_HUGE_PAGES = all(hasattr(mmap, n) for n in ("MAP_PRIVATE", "MAP_ANONYMOUS", "MADV_HUGEPAGE"))


def _advised_mapping(nbytes: int) -> torch.Tensor:
    """A fresh uint8 tensor over its own private anonymous mapping advised for huge pages,
    before any page of it is touched (a page faulted in small stays small)."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel built without THP: the mapping still works in small pages
        pass
    return torch.frombuffer(m, dtype=torch.uint8)  # the tensor keeps the mapping alive


class WeightArena:
    """Hands out uint8 buffers for packed weights, carved from huge-page slabs."""

    def __init__(self, slab_bytes: int = _SLAB_BYTES, huge_pages: bool = _HUGE_PAGES):
        self._slab_bytes = slab_bytes
        self._huge_pages = huge_pages
        self._slab: torch.Tensor | None = None
        self._used = 0
        self._lock = threading.Lock()  # loaders on several threads share the arena

    def empty(self, nbytes: int) -> torch.Tensor:
        """An uninitialised uint8 buffer of ``nbytes``, 64-byte aligned."""
        if not self._huge_pages or nbytes == 0:
            return torch.empty(nbytes, dtype=torch.uint8)
        if nbytes > self._slab_bytes // 4:  # a large table gets a mapping of its own
            return _advised_mapping(nbytes)
        with self._lock:
            if self._slab is None or self._used + nbytes > self._slab.numel():
                self._slab, self._used = _advised_mapping(self._slab_bytes), 0
            start = self._used
            self._used = -(-(start + nbytes) // _ALIGN) * _ALIGN
            return self._slab[start:start + nbytes]


_ARENA = WeightArena()


def weight_buffer(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 buffer for packed weights from the process's arena."""
    return _ARENA.empty(nbytes)
