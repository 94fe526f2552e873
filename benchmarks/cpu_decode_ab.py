#!/usr/bin/env python
"""Two builds of the engine side by side on the CPU: autoregressive tokens/s of the default model.

A is this checkout, B another one with its own built extension, e.g. the commit before a change:

    git worktree add /tmp/before <commit> && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/cpu_decode_ab.py --before /tmp/before [--runs 9] [--tokens 128] [--out DIR]

Each measurement is a fresh process (the default model on its GGUF blocks, `--threads` kernel
threads, batch 1, four chat prompts answered to `--tokens` tokens each, end to end: prefill
included); A and B alternate, A B A B ..., after one warm-up each, and the ratio is taken pair by
pair, so that a machine whose speed drifts (2 shared cores) moves both sides of a pair alike.
Writes DIR/cpu_decode_ab.json and prints a markdown table (quote the medians).
"""
from __future__ import annotations

import argparse
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


def child_env(tree: Path) -> dict:
    """The environment of a measurement of `tree`: its dspine_engine first on the path (the
    child drops an editable install's finder, which would otherwise win over the path)."""
    return dict(os.environ, DSPINE_AB_TREE=str(tree))


def run_child(tree: Path, tokens: int, threads: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(tokens),
                          "--threads", str(threads)], env=child_env(tree), capture_output=True,
                         text=True, check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def commit_of(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def compare(before: Path, runs: int, tokens: int, threads: int) -> dict:
    a_runs, b_runs = [], []
    for i in range(runs + 1):  # pair 0 is the warm-up
        a, b = run_child(ROOT, tokens, threads), run_child(before, tokens, threads)
        if i:
            a_runs.append(a)
            b_runs.append(b)
        print(f"pair {i}{' (warm-up)' if not i else ''}: A {a:.1f}, B {b:.1f} tokens/s", file=sys.stderr)
    ratios = [a / b for a, b in zip(a_runs, b_runs)]
    return {"a": {"tree": str(ROOT), "commit": commit_of(ROOT), "tokens_per_s": a_runs},
            "b": {"tree": str(before), "commit": commit_of(before), "tokens_per_s": b_runs},
            "median_a": statistics.median(a_runs), "median_b": statistics.median(b_runs),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "tokens": tokens, "threads": threads, "prompts": PROMPTS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="the other checkout (B), its extension built")
    p.add_argument("--runs", type=int, default=9, help="pairs measured after the warm-up pair")
    p.add_argument("--tokens", type=int, default=128, help="tokens per answer")
    p.add_argument("--threads", type=int, default=2, help="the engine's CPU kernel threads")
    p.add_argument("--out", type=Path, default=None, help="results folder (benchmarks/results)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        tree = os.environ.get("DSPINE_AB_TREE")
        if tree:
            sys.path.insert(0, tree)
            sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        print(f"{measure(args.tokens, args.threads):.3f}")
        return 0
    if args.before is None or not (args.before / "dspine_engine").is_dir():
        p.error("--before must be another checkout of the project (with its extension built)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import markdown_table, run_info, save_json

    result = dict(run_info("cpu"), **compare(args.before, args.runs, args.tokens, args.threads))
    path = save_json("cpu_decode_ab", result, args.out)
    print(markdown_table(["build", "commit", "tokens/s (median)", "A/B per pair: median (min-max)"],
                         [["A", result["a"]["commit"], result["median_a"],
                           f"{result['ratio_median']:.3f} ({result['ratio_min']:.3f}-{result['ratio_max']:.3f})"],
                          ["B", result["b"]["commit"], result["median_b"], "-"]]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
