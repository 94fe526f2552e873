"""Row counts at which the CPU's GEMM gives a row the same value whatever rows share the call.

Greedy speculative decoding is token-identical to autoregressive decoding only if a position's
logits are the same in a one-row decode step and inside a verify block (and a prompt's keys the
same whatever prompts share its prefill). Torch's CPU GEMM (MKL's sgemm) may run full blocks of
rows through one kernel and the rows left over through another, whose sums differ in the last
bits: on an AMD EPYC (AVX-512), calls of 1 to 3 rows agreed with each other while the rows of
every multiple of 4 came out different (no MKL_CBWR setting changed that), and padded to a
multiple of 4 every row agreed with itself computed alone. So `Dense` pads a call's rows to the
library's block: every row then goes through the block kernel.

Why padding and not calls of at most 3 rows (each row through the small-call kernel, also
row-invariant): a small call costs about one weight read per row there, so a 450-token prefill
took 11x as long (55 s vs 5 s, on this 2-core machine under load), while padding costs only the
decode steps of a lone sequence (a 4-row call for one row). docs/DECISIONS.md has the numbers.

The block depends on the library, the CPU, the dtype, the thread count and the shape, so it is
probed once per (in, out, dtype, threads) in this process: the smallest candidate for which
every row of every row count up to 17 (or two blocks and one) equals that row computed alone;
1 (nothing padded) where the library is row-invariant, as on the Xeons measured before.
"""
from __future__ import annotations

import functools
import warnings

import torch

CANDIDATES = (1, 2, 4, 8, 16, 6, 12, 24, 48)


def padded_matmul(x: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
    """``x [M, in] @ weight [in, out]`` computed on ``M`` rounded up to a multiple of ``block``."""
    extra = -x.shape[0] % block
    if extra == 0:
        return x @ weight
    return (torch.cat([x, x.new_zeros(extra, x.shape[1])]) @ weight)[:x.shape[0]]


def _row_invariant(x: torch.Tensor, weight: torch.Tensor, block: int) -> bool:
    alone = torch.cat([padded_matmul(x[i:i + 1], weight, block) for i in range(x.shape[0])])
    return all(torch.equal(padded_matmul(x[:m], weight, block), alone[:m])
               for m in range(1, x.shape[0] + 1))


@functools.lru_cache(maxsize=None)
def _probe(in_features: int, out_features: int, dtype: torch.dtype, threads: int) -> int:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(in_features, out_features, generator=gen).to(dtype)
    for block in CANDIDATES:
        # At least 17 rows: block 1 passes up to 3 rows where the library's block is 4.
        x = torch.randn(max(17, 2 * block + 1), in_features, generator=gen).to(dtype)
        if _row_invariant(x, weight, block):
            return block
    warnings.warn(f"no row count makes this CPU's {dtype} GEMM ({in_features} -> {out_features}) "
                  "row-invariant: greedy speculative output may differ from autoregressive "
                  "output where two tokens nearly tie", RuntimeWarning, stacklevel=3)
    return 1


def row_block(weight: torch.Tensor) -> int:
    """The row multiple `Dense` pads a CPU GEMM with ``weight [in, out]`` to (1: none)."""
    return _probe(weight.shape[0], weight.shape[1], weight.dtype, torch.get_num_threads())
