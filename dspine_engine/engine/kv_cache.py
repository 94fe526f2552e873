"""Paged KV cache: the K/V tensors of one model and its pool of fixed-size pages.

Admission reserves a request's worst case up front (prompt + max_tokens + one verify block), but
pages are taken from the free list only as the sequence grows and go back as soon as they hold
nothing needed (rollback past rejected drafts, positions outside the draft's sliding window);
cache_manager.py does that bookkeeping. A request that can never fit is refused with a clear
error; one that fits later waits.
"""
from __future__ import annotations

import math

import torch


def resolve_kv_dtype(setting: str, compute: torch.dtype, device: torch.device,
                     quantized: bool) -> torch.dtype:
    """The KV cache's dtype for ``EngineConfig.kv_cache_dtype`` with a model computing in
    ``compute`` on ``device``: "auto" is fp16 on the CPU GGUF path (``quantized``) and
    ``compute`` elsewhere. The kernels read and write a cache of the compute dtype, and on the
    CPU also an fp16 cache under fp32 activations; any other pairing is a ValueError here, at
    construction, rather than at the first step."""
    if setting == "auto":
        return torch.float16 if quantized and device.type == "cpu" else compute
    dtype = getattr(torch, setting)
    mixed_ok = device.type == "cpu" and compute == torch.float32 and dtype == torch.float16
    if dtype == compute or mixed_ok:
        return dtype
    name = str(compute).replace("torch.", "")
    model = "the GGUF model (float32 activations)" if quantized else f"a {name} model"
    allowed = "'float16' or 'float32'" if compute == torch.float32 and device.type == "cpu" else (
        f"'{name}'")
    raise ValueError(f"kv_cache_dtype={setting!r} cannot run with {model} on {device.type}: the "
                     f"kernels take a cache of the model's compute dtype, or float16 under "
                     f"float32 on the CPU; use 'auto' or {allowed}")


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
        """Returns pages; they stay promised to the sequence when it may need them again.

        Pushed in reverse, so the next `take` pops them in the order they are given (a sequence's
        table order): pages handed out as an ascending run come back out as one. A prompt's pages
        taken together are then mostly consecutive, and the Hopper attention kernel loads a key
        tile on consecutive pages by TMA, which is faster than gathering it page by page
        (docs/DECISIONS.md, "Whole K/V tiles by TMA when their pages are consecutive")."""
        self._free.extend(reversed(pages))
        if still_reserved:
            self._promised += len(pages)

    def unreserve(self, n: int) -> None:
        self._promised -= n
        assert self._promised >= 0


class KVCache:
    """The K and V pages of every layer of one model: ``[num_pages, page_size, kv_heads, dim]``
    of the cache's dtype (`resolve_kv_dtype`), which ``bytes_per_page`` must be given too."""

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
