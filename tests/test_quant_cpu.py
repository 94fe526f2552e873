"""The quantised CPU kernels (GGUF Q4_1 / Q8_0 blocks) against their PyTorch references.

The references define every rounding step, so kernels must match them bitwise, in every
instruction set this CPU has, and a row's result must not depend on the rows beside it (what
keeps greedy speculative decoding token-identical to plain decoding on the CPU).
"""
import os

import gguf
import numpy as np
import pytest
import torch

from dspine_engine import ops
from dspine_engine.models.quant_dense import (FORMATS, pack_gguf_blocks, quant_weight_from_blocks,
                                              quantize_blocks, quantize_weight)
from guarded_memory import Guarded

ISAS = ops._QUANT_ISAS[: ops._QUANT_ISAS.index(ops.quant_isa()) + 1]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    monkeypatch.setenv("DSPINE_CPU_ISA", request.param)
    assert ops.quant_isa() == request.param
    return request.param


def random_weight(fmt, rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    return quantize_weight(torch.randn(rows, cols, generator=g) * 0.1, fmt)


@pytest.fixture(params=[(1, 0), (4, 0), (1, 4)],
                ids=["1thread", "4threads", "4kernel-threads"])
def threads(request):
    """The chunk pool with no helper, and with helpers beyond this machine's cores (CI has 2),
    so that helpers lose their cores mid-call as on a loaded host: through torch's thread count,
    and through the kernels' own (ops.set_cpu_threads, torch on one thread, as in an engine's
    step on the GGUF path)."""
    torch_threads, kernel_threads = request.param
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    ops.set_cpu_threads(kernel_threads)
    yield max(torch_threads, kernel_threads)
    ops.set_cpu_threads(0)
    torch.set_num_threads(before)


def pool_threads() -> int:
    """Threads of this process now (the chunk pool's helpers are never torn down)."""
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_kernel_threads_reach_the_pool_whatever_torch_says():
    """With torch on one thread, ops.set_cpu_threads(n) still runs a GEMM on n threads: the
    pool starts its n - 1 helpers (more than any other test here asks for)."""
    qw = random_weight("q8_0", 960, 576)
    x = torch.randn(16, 576)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ops.set_cpu_threads(24)
        assert ops.cpu_threads() == 24
        ops.quant_matmul(x, qw.data, qw.format, qw.rows)
        assert pool_threads() >= 24
    finally:
        ops.set_cpu_threads(0)
        torch.set_num_threads(before)
    assert ops.cpu_threads() == 0
    with pytest.raises(RuntimeError, match="set_cpu_threads"):
        ops.set_cpu_threads(-1)


def poisoned_matmul(x, qw):
    """qw(x) written into NaN, so that an output the kernel leaves unwritten shows."""
    return ops.quant_matmul(x, qw.data, qw.format, qw.rows,
                            out=torch.full((x.shape[0], qw.rows), float("nan")))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,rows,cols", [(1, 16, 32), (1, 40, 96), (3, 33, 64), (5, 17, 576),
                                         (16, 960, 576), (37, 80, 1536)])
def test_matmul_matches_reference_bitwise(fmt, m, rows, cols, isa):
    qw = random_weight(fmt, rows, cols, seed=m)
    x = torch.randn(m, cols) * 3
    y = poisoned_matmul(x, qw)
    ref = ops.quant_matmul_ref(x, qw.data, fmt, rows)
    assert torch.isfinite(ref).all()
    assert torch.equal(y, ref)


# Every tail of the tile kernels: row groups of 1-4 rows and a remainder, full 16-output tiles and
# padded last tiles (1 and 15 outputs), one block along k and several; the last shape has enough
# blocks (33 rows x 32) for the activations to be quantised by several threads.
BOUNDS_SHAPES = [(1, 16, 32), (2, 17, 32), (3, 31, 96), (4, 48, 64), (5, 33, 32), (7, 47, 96),
                 (33, 17, 1024)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("at_end", [True, False], ids=["guard_after", "guard_before"])
def test_matmul_stays_inside_its_buffers(fmt, at_end, isa, threads):
    """x, the weight and the output flush against inaccessible pages: a kernel that reads or
    writes past an end faults right there instead of corrupting the heap for a later test."""
    for m, n, k in BOUNDS_SHAPES:
        qw = random_weight(fmt, n, k, seed=m)
        x = torch.randn(m, k)
        xg, wg = Guarded(x, at_end), Guarded(qw.data, at_end)
        out = Guarded(torch.full((m, n), float("nan")), at_end)
        y = ops.quant_matmul(xg.tensor, wg.tensor, fmt, n, out=out.tensor)
        assert y.data_ptr() == out.tensor.data_ptr()
        assert torch.equal(y, ops.quant_matmul_ref(x, qw.data, fmt, n)), (m, n, k)
        assert xg.margins_intact() and wg.margins_intact() and out.margins_intact(), (m, n, k)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("at_end", [True, False], ids=["guard_after", "guard_before"])
def test_embedding_stays_inside_its_buffers(fmt, at_end):
    qw = random_weight(fmt, 33, 64, seed=7)
    ids = torch.tensor([[0, 32, 15], [16, 31, 1]])  # first and last rows, both sides of tiles
    ig, wg = Guarded(ids, at_end), Guarded(qw.data, at_end)
    out = Guarded(torch.full((2, 3, 64), float("nan")), at_end)
    rows = ops.quant_embedding(ig.tensor, wg.tensor, fmt, 33, out=out.tensor)
    assert rows.data_ptr() == out.tensor.data_ptr()
    assert torch.equal(rows, ops.quant_embedding_ref(ids, qw.data, fmt, 33))
    assert ig.margins_intact() and wg.margins_intact() and out.margins_intact()


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_independent_of_the_batch(fmt, isa):
    """Decode (1 row), verify (16) and prefill (odd, large) give each row the same bits."""
    qw = random_weight(fmt, 200, 576, seed=1)
    x = torch.randn(41, 576)
    all_rows = qw(x)
    block = qw(x[:16])
    for i in range(16):
        assert torch.equal(qw(x[i:i + 1])[0], all_rows[i])
        assert torch.equal(block[i], all_rows[i])
    order = torch.randperm(41)
    assert torch.equal(qw(x[order]), all_rows[order])
    assert torch.equal(qw(x.view(41, 1, 576)).view(41, -1), all_rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_instruction_sets_agree(fmt, monkeypatch):
    qw = random_weight(fmt, 96, 1536, seed=2)
    x = torch.randn(7, 1536)
    results = []
    for name in ISAS:
        monkeypatch.setenv("DSPINE_CPU_ISA", name)
        results.append(qw(x))
    assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_poisons_its_row_only(fmt, bad, isa):
    qw = random_weight(fmt, 48, 96, seed=3)
    x = torch.randn(4, 96)
    clean = qw(x)
    x[2, 50] = bad
    y = qw(x)
    assert torch.isnan(y[2]).all()
    assert torch.equal(y[[0, 1, 3]], clean[[0, 1, 3]])
    assert torch.equal(torch.isnan(ops.quant_matmul_ref(x, qw.data, fmt, 48)), torch.isnan(y))


@pytest.mark.parametrize("fmt", FORMATS)
def test_close_to_the_dequantised_matmul(fmt):
    """Quantising activations per block to int8 costs little against fp32 on the same blocks."""
    qw = random_weight(fmt, 256, 576, seed=4)
    x = torch.randn(8, 576)
    exact = x.double() @ qw.dequantize().double().T
    err = (qw(x).double() - exact).norm() / exact.norm()
    assert err < 1e-2


@pytest.mark.parametrize("fmt", FORMATS)
def test_embedding_lookup(fmt):
    qw = random_weight(fmt, 50, 96, seed=5)
    ids = torch.tensor([[0, 49, 17], [16, 15, 3]])
    rows = qw.lookup(ids)
    assert rows.shape == (2, 3, 96)
    assert torch.equal(rows, ops.quant_embedding_ref(ids, qw.data, fmt, 50))
    with pytest.raises(RuntimeError, match="outside"):
        qw.lookup(torch.tensor([50]))
    with pytest.raises(RuntimeError, match="outside"):
        qw.lookup(torch.tensor([-1]))


@pytest.mark.parametrize("fmt,qtype", [("q8_0", gguf.GGMLQuantizationType.Q8_0),
                                       ("q4_1", gguf.GGMLQuantizationType.Q4_1)])
def test_packed_gguf_blocks_decode_like_gguf(fmt, qtype):
    """Blocks quantised by the gguf package, packed, read back exactly as gguf dequantises."""
    w = np.random.default_rng(6).standard_normal((37, 128)).astype(np.float32)
    blocks = gguf.quants.quantize(w, qtype)
    qw = quant_weight_from_blocks(blocks, fmt)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).astype(np.float32))
    assert torch.equal(qw.dequantize(), expected)
    ours = quantize_blocks(torch.from_numpy(w), fmt)
    assert ours.shape == blocks.shape


def test_bad_arguments_are_clear_errors(monkeypatch):
    qw = random_weight("q4_1", 32, 64)
    with pytest.raises(RuntimeError, match="fp32"):
        qw(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="does not hold"):
        qw(torch.randn(2, 96))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.quant_matmul(torch.randn(2, 40), qw.data, "q4_1", 32)
    with pytest.raises(RuntimeError, match="unknown weight format"):
        ops.quant_matmul(torch.randn(2, 64), qw.data, "q5_k", 32)
    with pytest.raises(RuntimeError, match="does not hold"):
        ops.quant_matmul(torch.randn(2, 64), qw.data, "q8_0", 32)
    with pytest.raises(RuntimeError, match="does not hold"):
        ops.quant_matmul(torch.randn(2, 64), qw.data, "q4_1", 33)
    with pytest.raises(ValueError, match="whole blocks"):
        pack_gguf_blocks(np.zeros((4, 30), np.uint8), "q4_1")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_weight(torch.randn(4, 40), "q8_0")
    x = torch.randn(2, 64)
    for out in (torch.empty(2, 33), torch.empty(2, 32, dtype=torch.float64), torch.empty(32, 2).T):
        with pytest.raises(RuntimeError, match="out must be a contiguous fp32"):
            ops.quant_matmul(x, qw.data, "q4_1", 32, out=out)
    with pytest.raises(RuntimeError, match="out must be a contiguous fp32"):
        ops.quant_embedding(torch.tensor([1]), qw.data, "q4_1", 32, out=torch.empty(2, 64))
    monkeypatch.setenv("DSPINE_CPU_ISA", "sse9")
    with pytest.raises(RuntimeError, match="DSPINE_CPU_ISA"):
        qw(torch.randn(1, 64))


def test_empty_batches():
    qw = random_weight("q8_0", 32, 64)
    assert qw(torch.randn(0, 64)).shape == (0, 32)
    assert qw.lookup(torch.zeros(0, dtype=torch.long)).shape == (0, 64)


def test_fake_kernels_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    qw = random_weight("q4_1", 40, 64)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.randn(3, 5, 64))
        data = mode.from_tensor(qw.data)
        assert ops.quant_matmul(x, data, "q4_1", 40).shape == (3, 5, 40)
        ids = mode.from_tensor(torch.zeros(2, 7, dtype=torch.long))
        out = ops.quant_embedding(ids, data, "q4_1", 40)
        assert out.shape == (2, 7, 64) and out.dtype == torch.float32
