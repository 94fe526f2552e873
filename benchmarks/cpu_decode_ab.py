#!/usr/bin/env python
"""Two builds of the engine side by side on the CPU: autoregressive tokens/s of the default model,
or (--what gemm / stream) the quantised GEMM alone at the default model's shapes.

A is this checkout, B another one with its own built extension, e.g. the commit before a change:

    git worktree add /tmp/before <commit> && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/cpu_decode_ab.py --before /tmp/before [--what decode|gemm|stream] [--runs 9]
                                       [--tokens 128] [--out DIR]

Each measurement is a fresh process; A and B alternate, A B A B ..., after one warm-up pair, and
the ratio is taken pair by pair, so that a machine whose speed drifts (2 shared cores) moves both
sides of a pair alike.
- decode: the default model on its GGUF blocks, `--threads` kernel threads, batch 1, four chat
  prompts answered to `--tokens` tokens each, end to end (prefill included): tokens/s.
- gemm: `ops.quant_matmul` on random weights of the default model's lm_head (49152 x 576, Q8_0,
  the GGUF's format for it) and gate_up (3072 x 576, Q4_1) at 1 and 4 activation rows (a decode
  step's and a 4-token verify's), `--threads` kernel threads: calls/s, the median of 15 timed
  batches of calls after a warm-up (higher is faster, as tokens/s).
- stream: the gate_up GEMM over STREAM_COPIES separate copies of its weights (132 MB of Q4_1
  tiles, more than this machine's share of the cache, as a decode step's ~100 MB of weights
  are) at 1, 2 and 4 rows, one copy after another: GB/s of weights read, the median of 9 passes
  after 3 warm-up ones; beside them a plain read of as many bytes (numpy's sum over float32), the
  rate the memory gives one thread. What the weights' prefetch and huge pages are measured by.
Writes DIR/cpu_decode_ab[_gemm|_stream].json and prints a markdown table (quote the medians).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a haiku about the sea.", "Explain what a hash map is.",
           "Give three tips for writing clean Python.", "What causes the seasons on Earth?"]


def measure(tokens: int, threads: int) -> float:
    """Tokens/s of this process's engine: the prompts one at a time, every answer `tokens` long."""
    from dspine_engine import Engine, SamplingParams

    engine = Engine(progress=False, cpu_threads=threads)
    engine.generate(PROMPTS[:1], SamplingParams(max_tokens=8))  # first-call set-up, not timed
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    start, produced = time.perf_counter(), 0
    for prompt in PROMPTS:
        produced += len(engine.generate([prompt], params)[0].token_ids)
    return produced / (time.perf_counter() - start)


GEMMS = [("q8_0", 49152, 576), ("q4_1", 3072, 576)]  # (format, out, in): lm_head, gate_up


def calls_per_second(call, warmup: int, batches: int, per_batch: int) -> float:
    """The median over ``batches`` timed batches of ``per_batch`` calls each, after ``warmup``
    untimed calls, of calls a second."""
    for _ in range(warmup):
        call()
    rates = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call()
        rates.append(per_batch / (time.perf_counter() - t0))
    return statistics.median(rates)


def measure_gemm(threads: int) -> dict:
    """Calls/s of the quantised GEMM at the default model's shapes, 1 and 4 rows."""
    import torch

    from dspine_engine import ops
    from dspine_engine.engine.cpu_threads import CpuThreads
    from dspine_engine.models.quant_dense import quantize_weight

    g = torch.Generator().manual_seed(0)
    rates = {}
    with CpuThreads(threads, 1).scope():  # as the engine runs its quantised steps
        for fmt, n, k in GEMMS:
            qw = quantize_weight(torch.randn(n, k, generator=g) * 0.1, fmt)
            for m in (1, 4):
                x = torch.randn(m, k, generator=g)
                rates[f"{fmt} {n}x{k} m={m}"] = calls_per_second(
                    lambda: ops.quant_matmul(x, qw.data, fmt, n), warmup=20, batches=15, per_batch=20)
    return rates


STREAM_COPIES = 120  # x 3072 x 576 Q4_1 = 132 MB


def measure_stream(threads: int) -> dict:
    """GB/s of the gate_up GEMM reading STREAM_COPIES copies of its weights (see the docstring)."""
    import numpy as np
    import torch

    from dspine_engine import ops
    from dspine_engine.engine.cpu_threads import CpuThreads
    from dspine_engine.models.quant_dense import quantize_blocks, quant_weight_from_blocks

    fmt, n, k = GEMMS[1]
    blocks = quantize_blocks(torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.1, fmt)
    copies = [quant_weight_from_blocks(blocks, fmt) for _ in range(STREAM_COPIES)]  # as a model loads
    nbytes = sum(w.data.numel() for w in copies)

    def rate(call) -> float:  # GB/s: the bytes one call reads, at the median of 9 timed calls
        return nbytes * calls_per_second(call, warmup=3, batches=9, per_batch=1) / 1e9

    rates = {}
    with CpuThreads(threads, 1).scope():
        for m in (1, 2, 4):
            x = torch.randn(m, k)
            rates[f"{fmt} GEMM GB/s, m={m}"] = rate(
                lambda: [ops.quant_matmul(x, w.data, fmt, n) for w in copies])
    plain = np.ones(nbytes // 4, np.float32)
    rates["plain read GB/s (numpy sum)"] = rate(lambda: plain.sum())
    return rates


def child_env(tree: Path) -> dict:
    """The environment of a measurement of `tree`: its dspine_engine first on the path (the
    child drops an editable install's finder, which would otherwise win over the path)."""
    return dict(os.environ, DSPINE_AB_TREE=str(tree))


def run_child(tree: Path, what: str, tokens: int, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", "--what", what, "--tokens", str(tokens),
                          "--threads", str(threads)], env=child_env(tree), capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit_of(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def compare(before: Path, what: str, runs: int, tokens: int, threads: int) -> dict:
    """Per measured quantity (tokens/s, or calls/s per GEMM): A's and B's runs, their medians, and
    the pairs' ratios A/B (median, min, max)."""
    a_runs, b_runs = [], []
    for i in range(runs + 1):  # pair 0 is the warm-up
        a, b = run_child(ROOT, what, tokens, threads), run_child(before, what, tokens, threads)
        if i:
            a_runs.append(a)
            b_runs.append(b)
        print(f"pair {i}{' (warm-up)' if not i else ''}: A {a}, B {b}", file=sys.stderr)
    quantities = {}
    for key in a_runs[0]:
        a_vals, b_vals = [r[key] for r in a_runs], [r[key] for r in b_runs]
        ratios = [x / y for x, y in zip(a_vals, b_vals)]
        quantities[key] = {"a": a_vals, "b": b_vals, "median_a": statistics.median(a_vals),
                           "median_b": statistics.median(b_vals), "ratio_median": statistics.median(ratios),
                           "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return {"a": {"tree": str(ROOT), "commit": commit_of(ROOT)},
            "b": {"tree": str(before), "commit": commit_of(before)}, "what": what,
            "quantities": quantities, "tokens": tokens, "threads": threads,
            "prompts": PROMPTS if what == "decode" else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="the other checkout (B), its extension built")
    p.add_argument("--what", choices=["decode", "gemm", "stream"], default="decode",
                   help="decode: tokens/s end to end; gemm: the quantised GEMM alone; stream: "
                        "the GEMM over more weights than the cache holds, GB/s")
    p.add_argument("--runs", type=int, default=9, help="pairs measured after the warm-up pair")
    p.add_argument("--tokens", type=int, default=128, help="tokens per answer (decode)")
    p.add_argument("--threads", type=int, default=2, help="the engine's CPU kernel threads")
    p.add_argument("--out", type=Path, default=None, help="results folder (benchmarks/results)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        tree = os.environ.get("DSPINE_AB_TREE")
        if tree:
            sys.path.insert(0, tree)
            sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        measures = {"gemm": lambda: measure_gemm(args.threads),
                    "stream": lambda: measure_stream(args.threads),
                    "decode": lambda: {"tokens/s": measure(args.tokens, args.threads)}}
        result = measures[args.what]()
        print(json.dumps(result))
        return 0
    if args.before is None or not (args.before / "dspine_engine").is_dir():
        p.error("--before must be another checkout of the project (with its extension built)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import markdown_table, run_info, save_json

    result = dict(run_info("cpu"), **compare(args.before, args.what, args.runs, args.tokens, args.threads))
    path = save_json("cpu_decode_ab" + ("" if args.what == "decode" else f"_{args.what}"), result,
                     args.out)
    rows = [[key, f"{q['median_a']:.1f}", f"{q['median_b']:.1f}",
             f"{q['ratio_median']:.3f} ({q['ratio_min']:.3f}-{q['ratio_max']:.3f})"]
            for key, q in result["quantities"].items()]
    print(f"A {result['a']['commit']} ({ROOT}), B {result['b']['commit']} ({args.before})")
    print(markdown_table(["quantity", "A (median)", "B (median)", "A/B per pair: median (min-max)"], rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
