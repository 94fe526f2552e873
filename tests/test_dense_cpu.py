"""The row-invariant dense CPU GEMM (ops.dense_matmul, csrc/cpu/dense_gemm.h) against its PyTorch
reference (ops.dense_matmul_ref): bitwise, in every instruction set this CPU has, for fp32,
bf16 and fp16, on any thread count. The row-invariance itself is tests/test_dense_rows.py."""
import math

import pytest
import torch

from dspine_engine import ops
from guarded_memory import Guarded

ISAS = ops._QUANT_ISAS[: ops._QUANT_ISAS.index(ops.quant_isa()) + 1]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    monkeypatch.setenv("DSPINE_CPU_ISA", request.param)
    assert ops.quant_isa() == request.param
    return request.param


@pytest.fixture(params=[(1, 0), (4, 0), (1, 4)], ids=["1thread", "4threads", "4kernel-threads"])
def threads(request):
    """No helper; helpers beyond this machine's cores (they lose their cores mid-call); the
    kernels' own count with torch on one thread (as in an engine's step)."""
    torch_threads, kernel_threads = request.param
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    ops.set_cpu_threads(kernel_threads)
    yield
    ops.set_cpu_threads(0)
    torch.set_num_threads(before)


def case(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g).to(dtype)
    x = torch.randn(m, k, generator=g).to(dtype)
    return x, ops.dense_pack(w), w


def exact(y, ref):
    """Bitwise equal, NaN where the reference has NaN (its bits may differ)."""
    torch.testing.assert_close(y, ref, rtol=0, atol=0, equal_nan=True)


# Every tail: 1 row and row groups of 2-6 with remainders, one column and panels of 64 cut
# anywhere, k of 1 and odd lengths; the last is large enough for several threads.
SHAPES = [(1, 1, 1), (1, 64, 1), (2, 65, 7), (3, 127, 33), (5, 100, 96), (7, 130, 64),
          (13, 64, 200), (33, 200, 77), (9, 1100, 96)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matmul_matches_reference_bitwise(m, n, k, dtype, isa):
    x, w, _ = case(m, n, k, dtype, seed=m + n + k)
    out = torch.full((m, n), float("nan"), dtype=dtype)  # an output left unwritten shows
    y = ops.dense_matmul(x, w, n, out=out)
    assert y.data_ptr() == out.data_ptr()
    ref = ops.dense_matmul_ref(x, w, n)
    assert torch.isfinite(ref).all()
    exact(y, ref)
    exact(ops.dense_matmul(x.view(m, 1, k), w, n), ref.view(m, 1, n))


def test_reference_rounds_each_step_once():
    """a * b + c whose exact value lies just below an fp32 midpoint that float64 rounds onto:
    rounded twice it would tie to even (1 + 2^-22); one rounding, as an FMA, gives 1 + 2^-23.
    The kernel (one fma a step) and the reference agree on it."""
    a, b, c = 1 + 2 ** -23, 2 ** -24 * (1 - 2 ** -23), 1 + 2 ** -23
    x, w = torch.tensor([[1.0, a]]), torch.tensor([[c, b]])  # acc = 1 * c, then fma(a, b, acc)
    twice = (torch.tensor(c, dtype=torch.float64) + a * b).float().item()
    assert twice == 1 + 2 ** -22
    assert ops.dense_matmul_ref(x, ops.dense_pack(w), 1).item() == 1 + 2 ** -23
    assert ops.dense_matmul(x, ops.dense_pack(w), 1).item() == 1 + 2 ** -23


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("at_end", [True, False], ids=["guard_after", "guard_before"])
def test_matmul_stays_inside_its_buffers(dtype, at_end, isa, threads):
    """x, the weight and the output flush against inaccessible pages: a kernel that reads or
    writes past an end faults right there instead of corrupting the heap for a later test."""
    for m, n, k in SHAPES:
        x, w, _ = case(m, n, k, dtype, seed=m)
        xg, wg = Guarded(x, at_end), Guarded(w, at_end)
        out = Guarded(torch.full((m, n), float("nan"), dtype=dtype), at_end)
        y = ops.dense_matmul(xg.tensor, wg.tensor, n, out=out.tensor)
        exact(y, ops.dense_matmul_ref(x, w, n))
        assert xg.margins_intact() and wg.margins_intact() and out.margins_intact(), (m, n, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_instruction_sets_and_threads_agree(dtype, monkeypatch):
    x, w, _ = case(21, 1000, 576, dtype, seed=2)
    results = []
    for name in ISAS:
        monkeypatch.setenv("DSPINE_CPU_ISA", name)
        for kernel_threads in (1, 3):
            ops.set_cpu_threads(kernel_threads)
            try:
                results.append(ops.dense_matmul(x, w, 1000))
            finally:
                ops.set_cpu_threads(0)
    assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_reach_only_their_outputs(bad, isa):
    """A non-finite activation poisons its row only, a non-finite weight its column only, with
    the reference's values (an infinity stays one, with its sign, unless it meets 0 or -inf)."""
    x, w, dense = case(4, 70, 96, torch.float32, seed=3)
    clean = ops.dense_matmul(x, w, 70)
    x[2, 50] = bad
    dense = dense.clone()
    dense[65, 7] = bad
    w = ops.dense_pack(dense)
    y = ops.dense_matmul(x, w, 70)
    exact(y, ops.dense_matmul_ref(x, w, 70))
    assert not torch.isfinite(y[2]).any() and not torch.isfinite(y[:, 65]).any()
    keep_rows, keep_cols = [0, 1, 3], [c for c in range(70) if c != 65]
    assert torch.equal(y[keep_rows][:, keep_cols], clean[keep_rows][:, keep_cols])


def test_overflow_gives_infinity_as_the_reference():
    x = torch.full((2, 8), 3e38)
    x[1] = -3e38
    w = ops.dense_pack(torch.ones(3, 8))
    y = ops.dense_matmul(x, w, 3)
    exact(y, ops.dense_matmul_ref(x, w, 3))
    assert (y[0] == math.inf).all() and (y[1] == -math.inf).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_close_to_the_float64_product(dtype):
    x, w, dense = case(8, 300, 576, dtype, seed=4)
    y = ops.dense_matmul(x, w, 300).double()
    want = x.double() @ dense.double().T
    assert (y - want).norm() / want.norm() < (1e-6 if dtype == torch.float32 else 1e-2)


def test_pack_round_trips_and_pads_with_zeros():
    w = torch.randn(70, 5)
    packed = ops.dense_pack(w)
    assert packed.shape == (2, 5, ops.DENSE_PANEL)
    assert torch.equal(packed[1, :, 6:], torch.zeros(5, ops.DENSE_PANEL - 6))
    assert torch.equal(packed[1, 3, 5], w[69, 3])
    assert torch.equal(ops.dense_unpack(packed, 70), w)
    into = torch.empty(2, 5, ops.DENSE_PANEL)
    assert ops.dense_pack(w, out=into).data_ptr() == into.data_ptr() and torch.equal(into, packed)


def test_layout_per_device():
    """Off the CPU (the CUDA kernel) the packed weight is the checkpoint's [N, K] itself; which
    dtypes and widths each backend takes (dense_matmul_supports) decides Dense's path."""
    assert ops.dense_packed_shape(70, 5) == (2, 5, ops.DENSE_PANEL)
    assert ops.dense_packed_shape(70, 5, "cuda") == (70, 5)
    w = torch.randn(70, 64)
    off_cpu = ops.dense_pack(w.to("meta").t().contiguous().t())  # a strided view made contiguous
    assert off_cpu.device.type == "meta" and off_cpu.shape == (70, 64) and off_cpu.is_contiguous()
    assert torch.equal(ops.dense_unpack(w, 70), w) and torch.equal(ops.dense_unpack(w, 9), w[:9])
    packed = ops.dense_pack(w)
    assert all(ops.dense_matmul_supports(t, packed.to(t)) for t in (torch.float32, torch.bfloat16, torch.float16))
    assert not ops.dense_matmul_supports(torch.float64, packed.double())
    assert not ops.dense_matmul_supports(torch.bfloat16, packed)  # x and weight dtypes differ
    meta = torch.empty(70, 64, dtype=torch.bfloat16, device="meta")
    assert ops.dense_matmul_supports(torch.bfloat16, meta)
    assert not ops.dense_matmul_supports(torch.float32, meta.float())  # fp32 stays on cuBLAS
    assert not ops.dense_matmul_supports(torch.bfloat16, meta[:, :48])  # k not a multiple of 32


def test_empty_products():
    w = ops.dense_pack(torch.randn(10, 6))
    assert ops.dense_matmul(torch.randn(0, 6), w, 10).shape == (0, 10)
    nothing = ops.dense_pack(torch.randn(10, 0))
    assert torch.equal(ops.dense_matmul(torch.randn(3, 0), nothing, 10), torch.zeros(3, 10))


def test_bad_arguments_are_refused():
    x, w, _ = case(2, 70, 8, torch.float32)
    with pytest.raises(RuntimeError, match="dtype"):
        ops.dense_matmul(x.bfloat16(), w, 70)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        ops.dense_matmul(x.double(), w.double(), 70)
    with pytest.raises(RuntimeError, match="packed"):
        ops.dense_matmul(x, w, 129)  # 3 panels' worth of outputs, 2 panels
    with pytest.raises(RuntimeError, match="packed"):
        ops.dense_matmul(x[:, :7], w, 70)
    with pytest.raises(RuntimeError, match="out must be"):
        ops.dense_matmul(x, w, 70, out=torch.empty(2, 71))


def test_the_lm_heads_are_vocabulary_projections(tiny_llama):
    """DSPINE_DENSE_CUDA=auto gives our GPU kernel the vocabulary projections only: the target's
    lm_head, a draft's own copy of it and a tensor-parallel shard of it are marked, the layers'
    projections are not."""
    from dspine_engine.distributed.sharding import _vocab_shard
    from dspine_engine.models.dspine import DSpineDraft
    from dspine_engine.models.target import TargetModel
    from dspine_engine.train.draft_init import new_draft_config

    target = TargetModel.load(tiny_llama, progress=False)
    assert target.lm_head_dense.vocabulary
    layer_projections = [p for layer in target.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert layer_projections and not any(p.vocabulary for p in layer_projections)
    draft = DSpineDraft(new_draft_config(target.config, layers=1, block_size=4, target_layers=[0])).init_weights(seed=0)
    draft.bind(target.embed, target.lm_head, target.config)
    assert draft.bound.lm_head_dense.vocabulary and draft.bound.lm_head_dense is not target.lm_head_dense
    vocab = target.config.vocab_size
    assert _vocab_shard(target.lm_head_dense, vocab, 1, 2).dense.vocabulary
