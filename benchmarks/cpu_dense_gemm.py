#!/usr/bin/env python
"""The row-invariant dense GEMM (ops.dense_matmul, ours) vs torch's (MKL's) `x @ Wt`, plain and
with the rows padded to a multiple of 4 (how `Dense` kept fp32 MKL row-invariant on an AMD EPYC
before ours: docs/DECISIONS.md; bf16 needed 1 or 2 there, so for --dtype bfloat16 the plain
column is the one to read), on SmolLM2-135M's projections (hidden 576, intermediate 1536,
vocab 49152) and a tiny model's (hidden 64, intermediate 96), at decode / verify row counts and
a prefill's. Ours reads its weights from the weight arena (huge pages, as `Dense` allocates
them) and, with --plain-memory, from a plain tensor too.

The variants are timed in alternating blocks (common.paired_medians) on --threads threads
(torch's and the kernels'); writes benchmarks/results/cpu_dense_gemm_<threads>t.json (or --out
DIR) and prints a markdown table of median microseconds a call and the ratios.

    python benchmarks/cpu_dense_gemm.py [--threads 1] [--rows 1 2 3 4 8 16 256] [--reps 60]
                                        [--shapes NAME ...] [--dtype float32|bfloat16|float16]
                                        [--plain-memory] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, paired_medians, run_info, save_json  # noqa: E402

SHAPES = {"qkv 576x960": (576, 960), "o 576x576": (576, 576), "gate_up 576x3072": (576, 3072),
          "down 1536x576": (1536, 576), "lm_head 576x49152": (576, 49152),
          "tiny gate_up 64x192": (64, 192), "tiny lm_head 64x49152": (64, 49152)}


def padded(x: torch.Tensor, wt: torch.Tensor, block: int = 4) -> torch.Tensor:
    extra = -x.shape[0] % block
    return x @ wt if extra == 0 else (torch.cat([x, x.new_zeros(extra, x.shape[1])]) @ wt)[:x.shape[0]]


def run_shape(name: str, rows: int, reps: int, plain_memory: bool, dtype) -> dict:
    from dspine_engine import ops
    from dspine_engine.models.dense import Dense

    k, n = SHAPES[name]
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    x = torch.randn(rows, k, generator=g).to(dtype)
    dense = Dense(w)  # packed into the weight arena, as the engine's
    wt = w.t().contiguous()
    fns = {"ours": lambda: dense(x), "mkl_padded": lambda: padded(x, wt),
           "mkl": lambda: x @ wt}
    if plain_memory:
        packed = ops.dense_pack(w)
        fns["ours_plain_memory"] = lambda: ops.dense_matmul(x, packed, n)
    medians = paired_medians(list(fns.values()), reps)
    us = {key: m * 1e6 for key, m in zip(fns, medians)}
    return {"shape": name, "rows": rows, "us": us,
            "mkl_padded_over_ours": us["mkl_padded"] / us["ours"], "mkl_over_ours": us["mkl"] / us["ours"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16, 64, 256])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--plain-memory", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    results = []
    for name in args.shapes:
        for rows in args.rows:
            r = run_shape(name, rows, args.reps, args.plain_memory, dtype)
            results.append(r)
            print(f"{name} m={rows}: " + ", ".join(f"{k} {v:.0f} us" for k, v in r["us"].items()),
                  flush=True)
    keys = list(results[0]["us"])
    print(markdown_table(["shape", "rows"] + [f"{k} us" for k in keys]
                         + ["padded MKL / ours", "MKL / ours"],
                         [[r["shape"], r["rows"]] + [r["us"][k] for k in keys]
                          + [r["mkl_padded_over_ours"], r["mkl_over_ours"]] for r in results]))
    suffix = "" if args.dtype == "float32" else "_" + args.dtype
    save_json(f"cpu_dense_gemm_{args.threads}t{suffix}", {**run_info("cpu"), "results": results},
              args.out)


if __name__ == "__main__":
    main()
