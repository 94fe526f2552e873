"""dspine_engine/models/dense.py + row_blocks.py: on the CPU a row's projection does not depend on
the rows beside it (a decode step's one row vs the same row inside a verify block), which greedy
speculative decoding needs to stay token-identical to autoregressive decoding."""
import pytest
import torch

from dspine_engine.models.dense import Dense
from dspine_engine.models.row_blocks import CANDIDATES, padded_matmul, row_block

SHAPES = [(576, 960), (1536, 576), (576, 4099), (96, 100)]  # (in, out): SmolLM2-like and odd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
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


def test_padded_matmul_pads_only_what_the_block_needs():
    torch.manual_seed(1)
    w, x = torch.randn(16, 8), torch.randn(7, 16)
    for block in (1, 4, 8):
        got = padded_matmul(x, w, block)
        assert got.shape == (7, 8) and torch.allclose(got, x @ w, atol=1e-5)
    assert padded_matmul(x[:0], w, 4).shape == (0, 8)


def test_row_block_is_probed_once_per_shape():
    w = torch.empty(576, 960)
    block = row_block(w)
    assert block in CANDIDATES and row_block(w) == block
