"""Weights laid out for the GEMM of their device.

On the CPU the projections run our own GEMM (`ops.dense_matmul`, csrc/cpu/dense_gemm.h) on
weights packed once into panels of 64 output columns (in huge pages: weight_arena.py). Why not
torch's (MKL's): greedy speculative decoding is token-identical to autoregressive decoding only
if a position's row gives the same bits in a one-row decode step and inside a verify block or a
prefill, and MKL's sgemm is not row-invariant on every CPU (on an AMD EPYC rows of multiples of
4 came out different from calls of 1-3 rows; padding every call to 4 rows made a decode step
~3.5x slower). Ours computes each output as one chain of fused multiply-adds over k in order
whatever rows share the call, and was faster than MKL from 1 to 256 rows on the shapes measured
(docs/DECISIONS.md, "CPU dense GEMM of our own").

On CUDA the weight keeps the checkpoint layout. ``DSPINE_DENSE_CUDA`` (read when a Dense is
built) chooses who runs the layer projections' calls of up to CUDA_MAX_ROWS rows and the
vocabulary projections' calls of any size: ``auto`` (the default) our row-invariant kernel
(ops.dense_matmul) for the vocabulary projections (lm_head) where the Hopper kernel runs
(csrc/cuda/dense_sm90.cuh), cuBLAS for the rest and elsewhere; ``0`` cuBLAS for all; ``1`` our
kernel for every projection on every GPU (the mma.sync kernel off Hopper: a measurement aid).
Why auto: cuBLAS ran the Qwen3-8B-shaped draft's lm_head (15 rows a sequence) on a 16-row tile,
reading the 1.2 GB weight once per 16 rows (3.5 ms at batch 8, 13.4 ms at batch 32 on the H100),
and the round took 13.18 -> 10.31 ms at batch 8 and 32.19 -> 21.95 ms at batch 32 with it on
ours, 9.11 -> 8.98 at batch 1, while our kernel trails cuBLAS on the layer projections
(0.82-0.98x at 16 rows, 0.57-0.87x at 128; docs/BENCHMARKS.md, 37th session). F.linear
otherwise (a bias, other dtypes, layer projections of more rows).
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from .. import ops
from .weight_arena import weight_buffer

DENSE_CUDA_DEFAULT = "auto"  # measured in the round and the engine GPU tests (above)
CUDA_MAX_ROWS = 128  # the Hopper kernel reads the weight once for up to 128 rows; more re-read it


def _own_cuda_gemm(weight: torch.Tensor, bias: torch.Tensor | None, vocabulary: bool) -> bool:
    """Whether a CUDA Dense of this weight runs ops.dense_matmul (DSPINE_DENSE_CUDA: auto, 1, 0)."""
    if weight.device.type != "cuda" or bias is not None or not ops.dense_matmul_supports(weight.dtype, weight):
        return False
    choice = os.environ.get("DSPINE_DENSE_CUDA", DENSE_CUDA_DEFAULT)
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"DSPINE_DENSE_CUDA must be auto, 0 or 1, got {choice!r}")
    if choice == "auto":
        if not vocabulary:
            return False
        with torch.cuda.device(weight.device):
            return torch.ops.dspine.dense_sm90_available() == 1
    return choice == "1"


def _packed(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` packed for ops.dense_matmul into a buffer of the weight arena."""
    if weight.dtype not in ops.DENSE_CPU_DTYPES:
        raise ValueError(f"a CPU projection must be one of {ops.DENSE_CPU_DTYPES}, got {weight.dtype}")
    shape = ops.dense_packed_shape(*weight.shape)
    buffer = weight_buffer(math.prod(shape) * weight.element_size())
    return ops.dense_pack(weight, out=buffer.view(weight.dtype).view(shape))


class Dense:
    """``y = x @ W^T + b`` for a checkpoint weight ``W [out, in]``; ``vocabulary``: the weight is
    an lm_head (or a shard of one), which DSPINE_DENSE_CUDA=auto gives our kernel."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, vocabulary: bool = False):
        self.packed = weight.device.type == "cpu"
        self.weight = _packed(weight) if self.packed else weight.contiguous()
        self.bias = bias
        self.out_features = weight.shape[0]
        self.vocabulary = vocabulary
        self.own_cuda_gemm = _own_cuda_gemm(self.weight, bias, vocabulary)

    @property
    def checkpoint_weight(self) -> torch.Tensor:
        """The weight in the checkpoint's [out, in] layout (on the CPU a copy, unpacked)."""
        return ops.dense_unpack(self.weight, self.out_features) if self.packed else self.weight

    def _runs_own_cuda_gemm(self, x: torch.Tensor) -> bool:
        """Layer projections: up to CUDA_MAX_ROWS rows. Vocabulary projections: any rows (a
        launch per 128, each reading the weight once): on the H100 cuBLAS ran the Qwen3-8B-shaped
        draft's lm_head at 480 rows (batch 32) in 13.4 ms on a 16-row tile, and one kernel for
        every row count gives a position the same logits in decode, draft and verify."""
        if not self.own_cuda_gemm or x.dtype != self.weight.dtype:
            return False
        return self.vocabulary or x.numel() <= CUDA_MAX_ROWS * x.shape[-1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed:
            if self._runs_own_cuda_gemm(x):
                return ops.dense_matmul(x, self.weight, self.out_features)
            return F.linear(x, self.weight, self.bias)
        y = ops.dense_matmul(x, self.weight, self.out_features)
        return y if self.bias is None else y + self.bias
