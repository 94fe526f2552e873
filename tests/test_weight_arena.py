"""The packed weights' arena: buffers carved from huge-page slabs (dspine_engine/models/weight_arena.py)."""
import gc
from pathlib import Path

import pytest
import torch

from dspine_engine.models import weight_arena
from dspine_engine.models.quant_dense import pack_gguf_blocks, quantize_blocks
from dspine_engine.models.weight_arena import WeightArena

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not weight_arena._HUGE_PAGES or not THP.exists() or "[never]" in THP.read_text(),
    reason="no transparent huge pages on this system")


def vma_of(address: int) -> dict | None:
    """The /proc/self/smaps entry of the mapping holding ``address`` (its range and VmFlags)."""
    entry = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            entry = {"lo": lo, "hi": hi} if lo <= address < hi else None
        elif entry is not None and line.startswith("VmFlags:"):
            entry["flags"] = line.split()[1:]
            return entry
    return None


def test_buffers_are_aligned_disjoint_and_exact():
    arena = WeightArena(slab_bytes=1 << 20)
    sizes = [1, 63, 64, 65, 4000, 70_000, 100_000]
    bufs = [arena.empty(n) for n in sizes]
    assert [b.numel() for b in bufs] == sizes
    assert all(b.dtype == torch.uint8 and b.data_ptr() % 64 == 0 for b in bufs)
    for i, b in enumerate(bufs):  # each holds its own bytes: no two overlap
        b.fill_(i + 1)
    assert [int(b.min()) for b in bufs] == [int(b.max()) for b in bufs] == list(range(1, 8))


def test_a_full_slab_starts_another_and_large_tables_get_their_own():
    arena = WeightArena(slab_bytes=1 << 20)
    small = [arena.empty(200_000) for _ in range(6)]  # 5 fit in a 1 MiB slab
    bases = {b.untyped_storage().data_ptr() for b in small}
    assert len(bases) == 2
    big = arena.empty(600_000)  # > a quarter slab: a mapping of its own
    assert big.untyped_storage().data_ptr() not in bases and big.untyped_storage().nbytes() == 600_000


@needs_thp
def test_slabs_are_advised_for_huge_pages_and_unmapped_when_freed():
    arena = WeightArena(slab_bytes=4 << 20)
    buf = arena.empty(100_000)
    buf.fill_(7)
    vma = vma_of(buf.data_ptr())
    assert vma is not None and "hg" in vma["flags"], vma  # hg: MADV_HUGEPAGE
    address = buf.untyped_storage().data_ptr()
    del buf, arena
    gc.collect()
    after = vma_of(address)
    assert after is None or (after["lo"], after["hi"]) != (vma["lo"], vma["hi"])


@needs_thp
def test_packed_weights_live_in_advised_memory():
    # (their values: test_quant_cpu.py's packing and kernel tests)
    packed = pack_gguf_blocks(quantize_blocks(torch.randn(48, 96), "q4_1"), "q4_1")
    assert "hg" in vma_of(packed.data_ptr())["flags"]


def test_without_huge_pages_buffers_are_plain_tensors():
    buf = WeightArena(huge_pages=False).empty(5000)
    assert buf.numel() == 5000 and buf.untyped_storage().nbytes() == 5000
