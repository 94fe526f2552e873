"""Tensors flush against memory the process may not touch, for kernels' bounds.

A kernel that reads or writes a little past its buffers usually corrupts the heap silently and
something later crashes (a test further on, an exception being thrown). Here a tensor sits right
before (or right after) an inaccessible page, so the first byte touched past that end faults in
the kernel that touched it; the rest of its pages hold a poison byte, so a write past the other
end shows in `margins_intact`.
"""
from __future__ import annotations

import ctypes
import mmap

import torch

_PAGE = mmap.PAGESIZE
_PROT_NONE = 0
_POISON = 0xA5
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class Guarded:
    """A copy of `src` (as `.tensor`) ending at an inaccessible page (`at_end`) or starting right
    after one; the mapping is freed with the last reference to either."""

    def __init__(self, src: torch.Tensor, at_end: bool):
        nbytes = src.numel() * src.element_size()
        pages = max(1, -(-nbytes // _PAGE))
        self._map = mmap.mmap(-1, (pages + 2) * _PAGE)  # [no access][pages][no access]
        self._lo, self._hi = _PAGE, (pages + 1) * _PAGE
        self._map[self._lo:self._hi] = bytes([_POISON]) * (self._hi - self._lo)
        anchor = ctypes.c_char.from_buffer(self._map)
        base = ctypes.addressof(anchor)
        del anchor  # its export of the buffer would keep the mapping from ever closing
        for page_start in (0, self._hi):
            if _libc.mprotect(base + page_start, _PAGE, _PROT_NONE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect failed")
        self._start = self._hi - nbytes if at_end else self._lo
        self._stop = self._start + nbytes
        flat = torch.frombuffer(self._map, dtype=src.dtype, count=src.numel(), offset=self._start)
        self.tensor = flat.view(src.shape)
        self.tensor.copy_(src)

    def margins_intact(self) -> bool:
        """Whether every byte of its pages outside the tensor still holds the poison."""
        poison = bytes([_POISON])
        before, after = self._map[self._lo:self._start], self._map[self._stop:self._hi]
        return before.count(poison) == len(before) and after.count(poison) == len(after)
