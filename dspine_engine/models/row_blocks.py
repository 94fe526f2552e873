"""How many rows the CPU's GEMM may take per call and still give a row the same value whatever
rows share the call.

Greedy speculative decoding is token-identical to autoregressive decoding only if a position's
logits are the same in a one-row decode step and inside a verify block. Torch's CPU GEMM (MKL's
sgemm) may run full blocks of rows through one kernel and the rows left over through another,
whose sums differ in the last bits: on an AMD EPYC (AVX-512), calls of 1 to 3 rows agreed with
each other while every row of a 4-row block came out different (no MKL_CBWR setting changed
that). Calls of at most that many rows then give every row its one-row value, so `Dense` splits
its rows into such calls. (Padding to the 4-row block instead would make every decode step cost
a 4-row GEMM: 3.5x a one-row call there, where calls of up to 3 rows cost about one per row.)

The limit depends on the library, the CPU, the dtype, the thread count and the shape, so it is
probed once per (in, out, dtype, threads) in this process; where every call of up to 17 rows is
row-invariant (the Xeons this project measured on, bf16 here) nothing is split.
"""
from __future__ import annotations

import functools

import torch

PROBE_ROWS = 17  # beyond a verify block of 16 rows


def chunked_matmul(x: torch.Tensor, weight: torch.Tensor, rows_per_call: int) -> torch.Tensor:
    """``x [M, in] @ weight [in, out]`` in calls of at most ``rows_per_call`` rows (0: one call)."""
    if rows_per_call == 0 or x.shape[0] <= rows_per_call:
        return x @ weight
    return torch.cat([part @ weight for part in x.split(rows_per_call)])


def _agrees(x: torch.Tensor, weight: torch.Tensor, rows_per_call: int, alone: torch.Tensor) -> bool:
    return all(torch.equal(chunked_matmul(x[:m], weight, rows_per_call), alone[:m])
               for m in range(1, x.shape[0] + 1))


@functools.lru_cache(maxsize=None)
def _probe(in_features: int, out_features: int, dtype: torch.dtype, threads: int) -> int:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(in_features, out_features, generator=gen).to(dtype)
    x = torch.randn(PROBE_ROWS, in_features, generator=gen).to(dtype)
    alone = torch.cat([x[i:i + 1] @ weight for i in range(PROBE_ROWS)])
    if _agrees(x, weight, 0, alone):
        return 0
    most = 1  # the largest call whose rows all keep their one-row values
    while torch.equal(x[:most + 1] @ weight, alone[:most + 1]):
        most += 1
    return most if _agrees(x, weight, most, alone) else 1


def rows_per_call(weight: torch.Tensor) -> int:
    """The most rows `Dense` gives one CPU GEMM with ``weight [in, out]`` (0: no limit)."""
    return _probe(weight.shape[0], weight.shape[1], weight.dtype, torch.get_num_threads())
