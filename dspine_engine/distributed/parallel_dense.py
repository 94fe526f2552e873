"""The two projections of a sharded target that talk to the other ranks.

Column-parallel projections (q|k|v, gate|up) need no communication: each rank computes its own
heads / intermediate features from the replicated hidden state, so they stay plain `Dense`.
The projections here end a rank's share of the work:
- `RowParallelDense` (o and down): each rank multiplies its slice of the input features; one
  all-reduce sums the partial outputs, so every rank holds the same full hidden state again;
- `VocabParallelHead` (lm_head): each rank scores its slice of the vocabulary; the slices are
  gathered on rank 0, which samples and verifies (the workers get None).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..models.dense import Dense


class RowParallelDense:
    """``y = sum over ranks of x_r @ W_r^T`` for this rank's input slice ``W_r [out, in/N]``."""

    def __init__(self, dense: Dense):
        if dense.bias is not None:  # a bias would be added N times by the all-reduce
            raise ValueError("a row-parallel projection cannot carry a bias")
        self.dense = dense
        self.out_features = dense.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dense(x)
        dist.all_reduce(y)
        return y


class VocabParallelHead:
    """Logits over this rank's vocabulary rows, gathered into ``[rows, vocab]`` on rank 0.

    Every rank holds ``ceil(vocab / N)`` rows (the last padded with zero rows, so the gather has
    equal shapes); the padding columns are cut after the gather."""

    def __init__(self, dense: Dense, vocab_size: int, rank: int, world: int):
        self.dense, self.vocab_size, self.rank, self.world = dense, vocab_size, rank, world
        self.out_features = vocab_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        local = self.dense(x).contiguous()
        if self.rank != 0:
            dist.gather(local, None, dst=0)
            return None
        parts = [torch.empty_like(local) for _ in range(self.world)]
        dist.gather(local, parts, dst=0)
        logits = torch.cat(parts, dim=-1)
        return logits if logits.shape[-1] == self.vocab_size else \
            logits[..., :self.vocab_size].contiguous()
