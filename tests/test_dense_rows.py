"""dspine_engine/models/dense.py + ops.dense_matmul: on the CPU a row's projection does not depend
on the rows beside it (a decode step's one row vs the same row inside a verify block or a
prefill), which greedy speculative decoding needs to stay token-identical to autoregressive
decoding. Torch's GEMM (MKL's sgemm) breaks this on an AMD EPYC (rows of multiples of 4 differ
from calls of 1-3 rows): docs/DECISIONS.md."""
import pytest
import torch

from dspine_engine import ops
from dspine_engine.models.dense import Dense

SHAPES = [(576, 960), (1536, 576), (576, 4099), (96, 100)]  # (in, out): SmolLM2-like and odd
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ISAS = ops._QUANT_ISAS[: ops._QUANT_ISAS.index(ops.quant_isa()) + 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cpu_dense_row_is_the_same_whatever_rows_share_the_call(shape, dtype):
    torch.manual_seed(0)
    inp, out = shape
    dense = Dense(torch.randn(out, inp).to(dtype), torch.randn(out).to(dtype))
    x = torch.randn(21, inp).to(dtype)
    alone = torch.cat([dense(x[i:i + 1]) for i in range(x.shape[0])])
    for m in range(1, x.shape[0] + 1):
        assert torch.equal(dense(x[:m]), alone[:m]), f"{m} rows: a row's value changed"
    assert torch.equal(dense(x[:20].view(4, 5, inp)).reshape(20, out), alone[:20])
    plain = x.float() @ dense.checkpoint_weight.float().t() + dense.bias.float()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert torch.allclose(alone.float(), plain, rtol=tol, atol=tol * inp ** 0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_dense_runs_the_row_invariant_kernel(dtype):
    """Dense's CPU product is dense_matmul's order exactly (then the bias), not torch's GEMM."""
    torch.manual_seed(1)
    w, b, x = torch.randn(70, 33).to(dtype), torch.randn(70).to(dtype), torch.randn(5, 33).to(dtype)
    dense = Dense(w, b)
    assert torch.equal(dense.checkpoint_weight, w)
    assert torch.equal(dense(x), ops.dense_matmul_ref(x, dense.weight, 70) + b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_row_is_the_row_alone_for_1_to_33_rows(shape, dtype, isa, threads, monkeypatch):
    """ops.dense_matmul for every call of M = 1..33 rows gives each row the bits of that row
    computed alone: every row group size and remainder of every instruction set, on one thread
    and on two."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    ops.set_cpu_threads(threads)
    try:
        g = torch.Generator().manual_seed(2)
        inp, out = shape
        w = ops.dense_pack(torch.randn(out, inp, generator=g).to(dtype))
        x = torch.randn(33, inp, generator=g).to(dtype)
        alone = torch.cat([ops.dense_matmul(x[i:i + 1], w, out) for i in range(33)])
        for m in range(1, 34):
            assert torch.equal(ops.dense_matmul(x[:m], w, out), alone[:m]), f"{m} rows"
            assert torch.equal(ops.dense_matmul(x[33 - m:], w, out), alone[33 - m:]), f"last {m} rows"
    finally:
        ops.set_cpu_threads(0)
