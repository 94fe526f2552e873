"""The CUDA dense GEMM for few rows (ops.dense_matmul: csrc/cuda/dense_sm90.cuh on Hopper,
csrc/cuda/dense_gemm.cuh elsewhere and with DSPINE_DENSE_SM90=0) against a float64 reference, and
its contract: a row's bits do not depend on the other rows of the call, on the row count, the
column tiling or a CUDA graph. Outputs start as NaN; NaN never passes.
Run: python -m pytest -q -m gpu tests/test_dense_gpu.py
"""
import pytest
import torch

from dspine_engine import ops
from dspine_engine.models.dense import Dense

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = "cuda"
HALVES = [torch.bfloat16, torch.float16]
ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}  # half an ulp, relative


def _inputs(m, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    return x, w


def _assert_close_to_exact(got, x, w):
    """|got - x W^T| within the output's rounding (one ulp) plus fp32 summation error."""
    got = got.double().cpu()
    assert torch.isfinite(got).all(), "output has NaN/inf"
    exact = x.double() @ w.double().T
    magnitude = x.double().abs() @ w.double().abs().T
    bound = 2 * ULP[x.dtype] * exact.abs() + 2.0 ** -16 * magnitude + 1e-30
    worst = float(((got - exact).abs() / bound).max())
    assert worst <= 1.0, f"error {worst:.3f} x the bound"


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def _sm90_launches():
    return torch.ops.dspine.dense_sm90_launches()


def _hopper_kernel_available() -> bool:
    """Whether calls take the Hopper kernel here (an H100/H200 and a build with its image)."""
    return torch.ops.dspine.dense_sm90_available() == 1


needs_hopper_kernel = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="the Hopper dense kernel needs an sm_90 GPU")


@pytest.mark.parametrize("kernel", ["default", "mma.sync"])
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("m,n,k", [(1, 576, 576), (3, 1000, 96), (8, 7, 32), (9, 100, 4096),
                                   (16, 1536, 576), (17, 64, 160), (33, 577, 64), (64, 2048, 128),
                                   (65, 96, 256), (130, 33, 96), (5, 1, 32), (16, 6144, 4096),
                                   (2, 4096, 12288)])
def test_dense_matmul_against_exact(m, n, k, dtype, kernel, monkeypatch):
    """Both kernels where both run: the default (Hopper's on an sm_90 GPU, which the launch
    counter proves) and the mma.sync one (DSPINE_DENSE_SM90=0)."""
    if kernel == "mma.sync":
        monkeypatch.setenv("DSPINE_DENSE_SM90", "0")
    x, w = _inputs(m, n, k, dtype)
    wd = ops.dense_pack(w.to(DEV))
    out = _poisoned((m, n), dtype)
    before = _sm90_launches()
    got = ops.dense_matmul(x.to(DEV), wd, n, out=out)
    hopper = kernel == "default" and torch.cuda.get_device_capability() == (9, 0)
    assert (_sm90_launches() > before) == hopper
    assert got.data_ptr() == out.data_ptr()
    _assert_close_to_exact(got, x, w)
    _assert_close_to_exact(ops.dense_matmul(x.to(DEV), wd, n), x, w)


# The stream-K plan's knobs (dense_sm90_plan.h): the plan's own choice, one CTA (no tile is cut),
# odd CTA counts that cut tiles at odd places (a tile then has up to ~20 contributors), one CTA
# short of the SMs, and each tile width. "sms-1" is resolved on the card.
HOPPER_KNOBS = {"plan": {}, "1 CTA": {"DSPINE_DENSE_SM90_CTAS": "1"},
                "7 CTAs": {"DSPINE_DENSE_SM90_CTAS": "7"},
                "sms-1 CTAs": {"DSPINE_DENSE_SM90_CTAS": "sms-1"},
                "64 wide": {"DSPINE_DENSE_SM90_BN": "64"},
                "128 wide, 29 CTAs": {"DSPINE_DENSE_SM90_BN": "128", "DSPINE_DENSE_SM90_CTAS": "29"},
                # The plan's default is one wgmma for a warpgroup's 32 / 64 rows (wide): rows alone
                # (one m64n16k16) must match rows in those calls for it to keep the row contract;
                # the narrow form (one m64n16k16 per 16 rows) stays a knob, and must keep it too.
                "narrow mma": {"DSPINE_DENSE_SM90_WIDE": "0"},
                "narrow mma, 7 CTAs": {"DSPINE_DENSE_SM90_WIDE": "0", "DSPINE_DENSE_SM90_CTAS": "7"}}


def _set_knobs(monkeypatch, knobs):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, value in knobs.items():
        monkeypatch.setenv(name, str(sms - 1) if value == "sms-1" else value)


@needs_hopper_kernel
@pytest.mark.parametrize("knobs", list(HOPPER_KNOBS), ids=list(HOPPER_KNOBS))
@pytest.mark.parametrize("n,k", [(4096, 4096), (100, 96), (1000, 1056), (6144, 512), (17, 4096)])
def test_hopper_rows_do_not_depend_on_the_call(n, k, knobs, monkeypatch):
    """The Hopper kernel under its own plan and forced CTA counts and widths (which move the
    stream-K cuts, so each is checked against itself): row i alone, in the first m rows for every
    m up to 130 (16-, 32- and 64-row tiles, 128 rows as two warpgroups, a second launch), in
    another order: the same bits; and the values right."""
    assert _hopper_kernel_available()
    _set_knobs(monkeypatch, HOPPER_KNOBS[knobs])
    x, w = _inputs(130, n, k, torch.bfloat16, seed=9)
    x, wd = x.to(DEV), w.to(DEV)
    full = ops.dense_matmul(x, wd, n, out=_poisoned((130, n), torch.bfloat16))
    _assert_close_to_exact(full, x.cpu(), w)
    alone = torch.cat([ops.dense_matmul(x[i:i + 1], wd, n) for i in range(x.shape[0])])
    assert torch.equal(full, alone)
    for m in (2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129):
        assert torch.equal(ops.dense_matmul(x[:m], wd, n), full[:m]), f"m = {m}"
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(10)).to(DEV)
    assert torch.equal(ops.dense_matmul(x[order], wd, n), full[order])


@needs_hopper_kernel
def test_hopper_kernel_in_a_graph_captured_first_on_a_new_stream():
    """The stream-K workspace of a stream first seen inside a CUDA graph's capture (allocated and
    zeroed outside the capture): the replays and eager calls on that stream give the eager bits,
    two shapes in one graph share it, and a second stream's calls keep their own."""
    assert _hopper_kernel_available()
    (x1, w1), (x2, w2) = _inputs(16, 6144, 4096, torch.bfloat16, 3), _inputs(16, 4096, 12288, torch.bfloat16, 4)
    x1, w1, x2, w2 = x1.to(DEV), w1.to(DEV), x2.to(DEV), w2.to(DEV)
    want1, want2 = ops.dense_matmul(x1, w1, 6144), ops.dense_matmul(x2, w2, 4096)
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        got1 = ops.dense_matmul(x1, w1, 6144)
        got2 = ops.dense_matmul(x2, w2, 4096)
    for _ in range(3):
        got1.fill_(float("nan")), got2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got1, want1) and torch.equal(got2, want2)
    other = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        on_stream = ops.dense_matmul(x1, w1, 6144)
    with torch.cuda.stream(other):
        on_other = ops.dense_matmul(x2, w2, 4096)
    torch.cuda.synchronize()
    assert torch.equal(on_stream, want1) and torch.equal(on_other, want2)


@pytest.mark.parametrize("name,value,message", [
    ("DSPINE_DENSE_SM90_BN", "96", "DSPINE_DENSE_SM90_BN must be 64 or 128"),
    ("DSPINE_DENSE_SM90_CTAS", "100000", "DSPINE_DENSE_SM90_CTAS must be 1 to"),
    ("DSPINE_DENSE_SM90_CTAS", "-1", "DSPINE_DENSE_SM90_CTAS must be 1 to"),
    ("DSPINE_DENSE_SM90_WIDE", "2", "DSPINE_DENSE_SM90_WIDE must be 0 or 1")])
def test_a_bad_hopper_knob_is_an_error(name, value, message, monkeypatch):
    monkeypatch.setenv(name, value)
    x, w = _inputs(4, 64, 96, torch.bfloat16)
    with pytest.raises(RuntimeError, match=message):
        ops.dense_matmul(x.to(DEV), w.to(DEV), 64)


@pytest.mark.parametrize("dtype", HALVES)
def test_dense_matmul_writes_only_its_output(dtype):
    """The output is the head of a NaN buffer: everything past it stays NaN, all of it is written."""
    m, n, k = 19, 41, 96
    x, w = _inputs(m, n, k, dtype, seed=1)
    buffer = _poisoned((m * n + 4096,), dtype)
    out = buffer[:m * n].view(m, n)
    ops.dense_matmul(x.to(DEV), w.to(DEV), n, out=out)
    assert torch.isnan(buffer[m * n:]).all()
    _assert_close_to_exact(out, x, w)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("n,k", [(576, 576), (1536, 576), (4096, 4096), (100, 96)])
def test_rows_do_not_depend_on_the_call(n, k, dtype, monkeypatch):
    """The mma.sync kernel (DSPINE_DENSE_SM90=0: its knobs are its own): row i alone, inside the
    first m rows for every m up to 66, at another position of the call, under every column tiling
    and through either loader: the same bits."""
    monkeypatch.setenv("DSPINE_DENSE_SM90", "0")
    x, w = _inputs(66, n, k, dtype, seed=2)
    x, wd = x.to(DEV), w.to(DEV)
    monkeypatch.setenv("DSPINE_DENSE_RING", "0")  # the register batches
    full = ops.dense_matmul(x, wd, n)
    monkeypatch.delenv("DSPINE_DENSE_RING")  # each call's own choice (the ring for few rows, n < 16384)
    alone = torch.cat([ops.dense_matmul(x[i:i + 1], wd, n) for i in range(x.shape[0])])
    assert torch.equal(full, alone)
    for m in (2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65):
        assert torch.equal(ops.dense_matmul(x[:m], wd, n), full[:m]), f"m = {m}"
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(3)).to(DEV)
    assert torch.equal(ops.dense_matmul(x[order], wd, n), full[order])
    for cols in ("1", "2", "4"):
        monkeypatch.setenv("DSPINE_DENSE_COLS", cols)
        assert torch.equal(ops.dense_matmul(x[:16], wd, n), full[:16]), f"{cols} column tiles"
    monkeypatch.delenv("DSPINE_DENSE_COLS")
    monkeypatch.setenv("DSPINE_DENSE_RING", "1")  # the cp.async variant: the same chunks, same order
    for m in (1, 8, 9, 16, 17, 33, 64, 66):
        assert torch.equal(ops.dense_matmul(x[:m], wd, n), full[:m]), f"ring, m = {m}"


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("m,n,k", [(1, 576, 576), (16, 1000, 96), (8, 7, 32), (33, 577, 4096), (64, 96, 256)])
def test_ring_variant_against_exact(m, n, k, dtype, monkeypatch):
    """DSPINE_DENSE_RING=1 (chunks through a cp.async ring in shared memory) on a poisoned output."""
    monkeypatch.setenv("DSPINE_DENSE_SM90", "0")
    monkeypatch.setenv("DSPINE_DENSE_RING", "1")
    x, w = _inputs(m, n, k, dtype, seed=8)
    out = _poisoned((m, n), dtype)
    _assert_close_to_exact(ops.dense_matmul(x.to(DEV), w.to(DEV), n, out=out), x, w)


def test_a_nan_row_stays_in_its_row():
    x, w = _inputs(16, 300, 128, torch.bfloat16, seed=4)
    x[5, 17] = float("nan")
    got = ops.dense_matmul(x.to(DEV), w.to(DEV), 300)
    assert torch.isnan(got[5]).all()
    others = torch.cat([got[:5], got[6:]])
    assert torch.isfinite(others).all()
    assert torch.equal(others, ops.dense_matmul(torch.cat([x[:5], x[6:]]).to(DEV), w.to(DEV), 300))


def test_batched_leading_dims_and_a_strided_view():
    x, w = _inputs(24, 200, 256, torch.bfloat16, seed=5)
    xd, wd = x.to(DEV), w.to(DEV)
    flat = ops.dense_matmul(xd, wd, 200)
    assert torch.equal(ops.dense_matmul(xd.view(4, 6, 256), wd, 200), flat.view(4, 6, 200))
    wide = torch.zeros(24, 300, dtype=torch.bfloat16, device=DEV)
    wide[:, 3:259] = xd  # rows 300 elements apart: made contiguous, same bits
    assert torch.equal(ops.dense_matmul(wide[:, 3:259], wd, 200), flat)
    buffer = torch.zeros(24 * 256 + 3, dtype=torch.bfloat16, device=DEV)
    odd = buffer[3:].view(24, 256)  # contiguous, but not on a 16-byte boundary: copied
    odd.copy_(xd)
    assert torch.equal(ops.dense_matmul(odd, wd, 200), flat)


def test_graph_replay_gives_the_eager_result():
    x, w = _inputs(16, 1024, 512, torch.bfloat16, seed=6)
    xd, wd = x.to(DEV), w.to(DEV)
    eager = ops.dense_matmul(xd, wd, 1024)
    static_x = xd.clone()
    out = _poisoned((16, 1024), torch.bfloat16)
    ops.dense_matmul(static_x, wd, 1024, out=out)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.dense_matmul(static_x, wd, 1024, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_bad_arguments_are_errors():
    x, w = _inputs(4, 64, 96, torch.bfloat16)
    xd, wd = x.to(DEV), w.to(DEV)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.dense_matmul(xd[:, :80], wd[:, :80].contiguous(), 64)
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        ops.dense_matmul(xd.float(), wd.float(), 64)
    with pytest.raises(RuntimeError, match="differs"):
        ops.dense_matmul(xd, wd.half(), 64)
    with pytest.raises(RuntimeError, match=r"\[out_features, k\]"):
        ops.dense_matmul(xd, wd, 65)
    with pytest.raises(RuntimeError, match=r"\[out_features, k\]"):
        ops.dense_matmul(xd, ops.dense_pack(w).to(DEV), 64)  # a CPU-packed table
    with pytest.raises(RuntimeError, match="out must be"):
        ops.dense_matmul(xd, wd, 64, out=torch.empty(4, 63, dtype=torch.bfloat16, device=DEV))
    assert not ops.dense_matmul_supports(torch.float32, wd)
    assert not ops.dense_matmul_supports(torch.bfloat16, wd[:, :80].contiguous())
    assert ops.dense_matmul_supports(torch.bfloat16, wd)


def test_dense_takes_the_kernel_where_asked(monkeypatch):
    """auto (the default): the vocabulary projections where the Hopper kernel runs; 0: never;
    1: always; anything else an error."""
    x, w = _inputs(16, 512, 256, torch.bfloat16, seed=7)
    xd, wd = x.to(DEV), w.to(DEV)
    for auto in (None, "auto"):
        if auto is None:
            monkeypatch.delenv("DSPINE_DENSE_CUDA", raising=False)
        else:
            monkeypatch.setenv("DSPINE_DENSE_CUDA", auto)
        assert not Dense(wd).own_cuda_gemm
        head = Dense(wd, vocabulary=True)
        assert head.own_cuda_gemm == _hopper_kernel_available()
        assert torch.equal(head(xd), ops.dense_matmul(xd, wd, 512) if head.own_cuda_gemm
                           else torch.nn.functional.linear(xd, wd))
    monkeypatch.setenv("DSPINE_DENSE_CUDA", "0")
    assert not Dense(wd).own_cuda_gemm and not Dense(wd, vocabulary=True).own_cuda_gemm
    monkeypatch.setenv("DSPINE_DENSE_CUDA", "yes")
    with pytest.raises(ValueError, match="DSPINE_DENSE_CUDA must be auto, 0 or 1"):
        Dense(wd)
    monkeypatch.setenv("DSPINE_DENSE_CUDA", "1")
    dense = Dense(wd)
    assert dense.own_cuda_gemm and not Dense(wd, bias=torch.zeros(512, dtype=torch.bfloat16, device=DEV)).own_cuda_gemm
    assert torch.equal(dense(xd), ops.dense_matmul(xd, wd, 512))
    many = torch.randn(200, 256, dtype=torch.bfloat16, device=DEV)  # past CUDA_MAX_ROWS: cuBLAS
    assert torch.equal(dense(many), torch.nn.functional.linear(many, wd))
    # a vocabulary projection stays on our kernel at any row count (a launch per 128 rows)
    head = Dense(wd, vocabulary=True)
    assert torch.equal(head(many), ops.dense_matmul(many, wd, 512))
    assert torch.equal(head(many)[150:170], head(many[150:170]))
