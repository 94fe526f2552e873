"""Weights laid out for the fastest GEMM of their device.

On the CPU, `x @ W^T` through F.linear runs MKL's transposed-B path, which is 2-3x slower than a
plain `x @ Wt` with Wt stored [in, out] at the 1-16 rows a decode or verify step multiplies
(measured: 49 vs 110 GFLOP/s at 8 rows, 110 vs 140 at 16, on 2 Xeon cores). So on the CPU weights
are stored transposed; on CUDA, cuBLAS is indifferent and F.linear keeps the checkpoint layout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .row_blocks import padded_matmul, row_block


class Dense:
    """``y = x @ W^T + b`` for a checkpoint weight ``W [out, in]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.transposed = weight.device.type == "cpu"
        self.weight = weight.t().contiguous() if self.transposed else weight.contiguous()
        self.bias = bias
        self.out_features = weight.shape[0]

    @property
    def checkpoint_weight(self) -> torch.Tensor:
        """The weight in the checkpoint's [out, in] layout (a view, no copy)."""
        return self.weight.t() if self.transposed else self.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.transposed:
            return F.linear(x, self.weight, self.bias)
        # Rows padded to the library's row block keep their values whatever rows share the call
        # (a decode step vs a verify block: row_blocks.py says why).
        rows = x.reshape(-1, x.shape[-1])
        y = padded_matmul(rows, self.weight, row_block(self.weight))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], y.shape[-1])
