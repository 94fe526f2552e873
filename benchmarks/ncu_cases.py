#!/usr/bin/env python
"""One kernel case, launched a few times, for a profiler to look at (ncu, nsys).

kernel_bench.py times every shape with many warm-up and timed runs; a profiler replaying each
launch of that (ncu --set full replays a kernel ~40 times) takes minutes and cannot easily pick
the batch-1 launches out of the sweep. Here one named case runs `--repeats` times on fresh random
inputs (the same ones each time), so `ncu -k regex:walk_ --launch-count 2 python
benchmarks/ncu_cases.py walk_b1_v49152` profiles exactly the launches of interest.

    python benchmarks/ncu_cases.py CASE [--repeats N]
    python benchmarks/ncu_cases.py --list

Cases (issue 12's latency-bound kernels):
  walk_b1_v49152      the transition walk of the default model's c = 1 round (15 rows)
  walk_b1_v151936     the same with Qwen3's vocabulary
  walk_b32_v151936    issue 12's floor row (480 rows)
  verify_qwen3_1k_b1  the paged attention of a 16-token verify block, Qwen3-8B heads, 1K context,
                      batch 1, in the engine's row-exact mode (the step table's round)
  block_verify_topk_b32  the block verify sampling at T = 1 with top-k 50 and top-p 0.9, batch 32,
                      V = 151936 (issue 12's 3.3 ms row, goal 50 us)
  dense_qkv_16, dense_o_16  our GEMM on Qwen3-8B's qkv / o projection for a batch-1 verify block
                      (16 rows; 24 / 19 us against cuBLAS's 20 / 16 on the H100, 37th session)
  dense_qkv_128, dense_o_128  the same for a batch-8 block (128 rows; 32 / 27 us against 21 / 15)
  cublas_*            cuBLAS on the same shapes (torch.matmul), to profile side by side
"""
from __future__ import annotations

import argparse
import math
import sys
from functools import partial

import torch

from cuda_dense_gemm import SHAPES as GEMM_SHAPES  # benchmarks/, this script's directory
from dspine_engine import ops


def walk_case(batch: int, vocab: int):
    block, rank, k = 16, 256, 8
    dev, bf16 = "cuda", torch.bfloat16
    logits = torch.randn(batch, block - 1, vocab, dtype=bf16, device=dev) * 3
    g = torch.randn(batch, block - 1, rank, dtype=bf16, device=dev)
    pred = torch.randn(vocab, rank, dtype=bf16, device=dev) * 0.3
    succ = torch.randn(vocab, rank, dtype=bf16, device=dev) * 0.3
    anchor = torch.randint(0, vocab, (batch,), device=dev)
    temp = torch.zeros(batch, device=dev)
    u = torch.rand(batch, block - 1, device=dev)
    return lambda: ops.transition_walk(logits, g, pred, succ, anchor, k, temp, u)


def verify_attention_case(context: int):
    q_heads, kv_heads, d, page, n = 32, 8, 128, 16, 16
    dev, bf16 = "cuda", torch.bfloat16
    pages = -(-context // page)
    k_cache = torch.randn(pages, page, kv_heads, d, dtype=bf16, device=dev)
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(pages, device=dev, dtype=torch.int32).view(1, pages)
    kv_lens = torch.tensor([context], dtype=torch.int32, device=dev)
    cu_q = torch.tensor([0, n], dtype=torch.int32, device=dev)
    q = torch.randn(n, q_heads, d, dtype=bf16, device=dev)
    scale = 1 / math.sqrt(d)
    return lambda: ops.paged_attention(q, k_cache, v_cache, table, kv_lens, cu_q, n, True, 0, scale,
                                       context, True)


def block_verify_case(batch: int, vocab: int, top_k: int, top_p: float):
    block, k = 16, 8
    dev = "cuda"
    logits = torch.randn(batch, block, vocab, dtype=torch.bfloat16, device=dev) * 2
    draft = torch.randint(0, vocab, (batch, block - 1), device=dev)
    cand_ids = torch.randint(0, vocab, (batch, block - 1, k), device=dev)
    cand_ids[..., 0] = draft
    cand_probs = torch.softmax(torch.randn(batch, block - 1, k, device=dev), -1)
    temp = torch.ones(batch, device=dev)
    tk = torch.full((batch,), top_k, dtype=torch.int32, device=dev)
    tp = torch.full((batch,), top_p, device=dev)
    u = torch.rand(batch, block, device=dev)
    return lambda: ops.block_verify(logits, draft, cand_ids, cand_probs, temp, tk, tp, u)


# Qwen3-8B's qkv and o projections, (k, n) as cuda_dense_gemm.py times them.
DENSE_SHAPES = {"qkv": GEMM_SHAPES["Qwen3-8B qkv"], "o": GEMM_SHAPES["Qwen3-8B o"]}


def dense_case(shape: str, rows: int, ours: bool):
    k, n = DENSE_SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(rows)
    weight = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16)
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
    if ours:
        return lambda: ops.dense_matmul(x, weight, n, out=out)
    return lambda: torch.matmul(x, weight.t(), out=out)


CASES = {
    "walk_b1_v49152": lambda: walk_case(1, 49152),
    "walk_b1_v151936": lambda: walk_case(1, 151936),
    "walk_b32_v151936": lambda: walk_case(32, 151936),
    "verify_qwen3_1k_b1": lambda: verify_attention_case(1024),
    "block_verify_topk_b32": lambda: block_verify_case(32, 151936, 50, 0.9),
    **{f"{who}_{shape}_{rows}": partial(dense_case, shape, rows, who == "dense")
       for who in ("dense", "cublas") for shape in DENSE_SHAPES for rows in (16, 128)},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", nargs="?", choices=sorted(CASES))
    parser.add_argument("--repeats", type=int, default=3, help="launches of the case (default 3)")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    args = parser.parse_args(argv)
    if args.list or args.case is None:
        print("\n".join(sorted(CASES)))
        return 0 if args.list else 2
    if not torch.cuda.is_available():
        print("ncu_cases.py needs a CUDA device", file=sys.stderr)
        return 1
    run = CASES[args.case]()
    for _ in range(args.repeats):
        run()
    torch.cuda.synchronize()
    print(f"{args.case}: {args.repeats} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
