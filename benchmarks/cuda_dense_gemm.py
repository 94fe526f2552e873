#!/usr/bin/env python
"""The CUDA dense GEMM for few rows (ops.dense_matmul, ours) vs torch's F.linear (cuBLAS), side by
side on the projections of a Qwen3-8B-shaped target (hidden 4096, intermediate 12288, 32/8 heads
of 128, vocab 151936) and of SmolLM2-135M, at decode / verify row counts.

As in the engine's rounds, the weights are cold: each timed CUDA graph runs the GEMM over enough
distinct copies of the weight (>= --cold-mb MB together) that none is still in L2 when its turn
comes, back to back; a call's time is the graph's over the copies. Also reported: whether each
row of a call is bitwise the row computed alone (ours by construction; cuBLAS's choice of kernel
changes with the rows). Ours runs every way it has: on Hopper the TMA / wgmma kernel (the default
there, dense_sm90.cuh), and the mma.sync kernel's two ways of streaming (register batches; a
cp.async ring, DSPINE_DENSE_RING=1; both with DSPINE_DENSE_SM90=0). Writes benchmarks/results/cuda_dense_gemm.json (or --out DIR) and prints a
markdown table.

    python benchmarks/cuda_dense_gemm.py [--rows 1 8 16 32 64 128] [--shapes NAME ...]
                                         [--dtype bfloat16|float16] [--iters 20] [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import env_knobs, markdown_table, run_info, save_json  # noqa: E402

SHAPES = {  # name: (k = in_features, n = out_features)
    "Qwen3-8B qkv": (4096, 6144), "Qwen3-8B o": (4096, 4096), "Qwen3-8B gate_up": (4096, 24576),
    "Qwen3-8B down": (12288, 4096), "Qwen3-8B lm_head": (4096, 151936),
    "SmolLM2 qkv": (576, 960), "SmolLM2 o": (576, 576), "SmolLM2 gate_up": (576, 3072),
    "SmolLM2 down": (1536, 576), "SmolLM2 lm_head": (576, 49152),
}


def graph_us(calls, iters: int) -> float:
    """Median microseconds a call of a CUDA graph that makes every call in `calls` once."""
    for fn in calls:  # warm-up (cuBLAS picks and allocates outside the capture)
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def rows_alone_equal(fn, x: torch.Tensor) -> float:
    """Share of the rows of fn(x) that are bitwise fn(that row alone)."""
    full = fn(x)
    same = sum(torch.equal(full[i], fn(x[i:i + 1])[0]) for i in range(x.shape[0]))
    return same / x.shape[0]


def copy_ceiling_GBps() -> float:
    n = 256 * 1024 * 1024
    src, dst = torch.randn(n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16, device="cuda")
    us = graph_us([lambda: dst.copy_(src)], 20)
    return 2 * n * 2 / us / 1e3


def hopper_kernel_available() -> bool:
    from dspine_engine import ops  # noqa: F401  (registers the extension's ops)

    return torch.ops.dspine.dense_sm90_available() == 1


def sweep_sm90(ours, iters: int) -> dict:
    """The Hopper kernel under each forced tile width and CTA count (all SMs, half of them):
    microseconds by "bn{width} ctas{count}" (the plan's own pick is one of them)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    timed = {}
    for width in (64, 128):
        for ctas in (sms, sms // 2):
            with env_knobs(DSPINE_DENSE_SM90_BN=str(width), DSPINE_DENSE_SM90_CTAS=str(ctas)):
                timed[f"bn{width} ctas{ctas}"] = graph_us(ours, iters)
    return timed


def run_shape(name: str, rows: int, dtype, iters: int, cold_bytes: int, hopper: bool, sweep: bool = False) -> dict:
    from dspine_engine import ops

    k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(rows)
    weight_bytes = n * k * torch.finfo(dtype).bits // 8
    copies = max(1, -(-cold_bytes // weight_bytes))
    weights = [(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(dtype) for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", generator=g).to(dtype)
    outs = [torch.empty(rows, n, dtype=dtype, device="cuda") for _ in range(copies)]
    ours = [lambda w=w, o=o: ops.dense_matmul(x, w, n, out=o) for w, o in zip(weights, outs)]
    cublas = [lambda w=w, o=o: torch.matmul(x, w.t(), out=o) for w, o in zip(weights, outs)]
    mma = {"DSPINE_DENSE_SM90": "0"}
    with env_knobs(**mma, DSPINE_DENSE_RING="0"):  # the register batches
        us = {"ours": graph_us(ours, iters)}
    us["cublas"] = graph_us(cublas, iters)
    with env_knobs(**mma, DSPINE_DENSE_RING="1"):
        us["ours_ring"] = graph_us(ours, iters)
    if hopper:
        with env_knobs(DSPINE_DENSE_SM90_WIDE="0"):  # one m64n16k16 for each 16 rows
            us["ours_sm90"] = graph_us(ours, iters)
        with env_knobs(DSPINE_DENSE_SM90_WIDE="1"):  # one wgmma for a warpgroup's 32 / 64 rows
            us["ours_sm90_wide"] = graph_us(ours, iters)
    with env_knobs(**mma, DSPINE_DENSE_RING="0"):
        us["ours_again"] = graph_us(ours, iters)  # the first and last runs bracket the card's drift
    best_ours = min(v for key, v in us.items() if key != "cublas")
    swept = sweep_sm90(ours, iters) if hopper and sweep else {}
    return {"shape": name, "k": k, "n": n, "rows": rows, "copies": copies, "us": us, "sm90_sweep_us": swept,
            "ours_GBps": weight_bytes / best_ours / 1e3, "cublas_GBps": weight_bytes / us["cublas"] / 1e3,
            "cublas_over_ours": us["cublas"] / best_ours,
            "rows_exact": {"ours": sm90_rows_alone_equal(weights[0], n, x, wide="0"),
                           "ours_wide": sm90_rows_alone_equal(weights[0], n, x, wide="1") if hopper else None,
                           "cublas": rows_alone_equal(lambda t: F.linear(t, weights[0]), x)}}


def sm90_rows_alone_equal(weight, n: int, x, wide: str) -> float:
    """rows_alone_equal of our kernel in the narrow (wide="0") or wide ("1") wgmma form (the knob
    is ignored off Hopper, where the mma.sync kernel runs)."""
    from dspine_engine import ops

    with env_knobs(DSPINE_DENSE_SM90_WIDE=wide):
        return rows_alone_equal(lambda t: ops.dense_matmul(t, weight, n), x)


def exactness(shares: dict) -> str:
    """The rows-alone shares as "ours / ours wide / cuBLAS" ("-" where the wide form did not run)."""
    wide = "-" if shares["ours_wide"] is None else f"{shares['ours_wide']:.0%}"
    return f"{shares['ours']:.0%} / {wide} / {shares['cublas']:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), metavar="NAME")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--iters", type=int, default=20, help="graph replays a row (median)")
    parser.add_argument("--cold-mb", type=int, default=512, help="weight copies a graph cycles through (MB)")
    parser.add_argument("--out", type=Path, default=None, help="directory of the JSON (benchmarks/results)")
    parser.add_argument("--sweep", action="store_true",
                        help="also time the Hopper kernel under each forced tile width (64, 128) and CTA count "
                             "(all SMs, half): a second table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_dense_gemm.py needs a CUDA device")
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_GBps()
    hopper = hopper_kernel_available()
    results = []
    for name in args.shapes:
        for rows in args.rows:
            results.append(run_shape(name, rows, dtype, args.iters, args.cold_mb << 20, hopper, args.sweep))
            r = results[-1]
            sm90 = f", sm90 {r['us']['ours_sm90']:.1f}" if hopper else ""
            print(f"{name} rows {rows}: ours {min(r['us']['ours'], r['us']['ours_again']):.1f} us "
                  f"(ring {r['us']['ours_ring']:.1f}{sm90}), cuBLAS {r['us']['cublas']:.1f} us", flush=True)
    info = run_info("cuda")
    path = save_json("cuda_dense_gemm", {**info, "dtype": args.dtype, "copy_GBps": ceiling, "results": results},
                     args.out)
    table = [[r["shape"], r["rows"], r["us"].get("ours_sm90", "-"), r["us"].get("ours_sm90_wide", "-"),
              min(r["us"]["ours"], r["us"]["ours_again"]), r["us"]["ours_ring"], r["us"]["cublas"], r["ours_GBps"],
              r["cublas_GBps"], r["cublas_over_ours"], exactness(r["rows_exact"])] for r in results]
    print(f"\n{info['device']}, {args.dtype}, copy ceiling {ceiling:.0f} GB/s (read + write); wrote {path}\n")
    print(markdown_table(["shape", "rows", "ours, sm90 us", "ours, sm90 wide us", "ours, mma.sync us",
                          "ours, ring us", "cuBLAS us", "ours GB/s (best)", "cuBLAS GB/s", "cuBLAS / ours (best)",
                          "rows = alone (ours / ours wide / cuBLAS)"], table))
    swept = [r for r in results if r["sm90_sweep_us"]]
    if swept:
        keys = list(swept[0]["sm90_sweep_us"])
        print("\nThe Hopper kernel under forced plans (us):\n")
        print(markdown_table(["shape", "rows", "plan's pick", *keys, "cuBLAS"],
                             [[r["shape"], r["rows"], r["us"]["ours_sm90"], *r["sm90_sweep_us"].values(),
                               r["us"]["cublas"]] for r in swept]))


if __name__ == "__main__":
    main()
