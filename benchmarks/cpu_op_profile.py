#!/usr/bin/env python
"""Where a CPU round's time goes, op by op: torch.profiler over padding rounds of the default
model with the shipped drafter (batch 1), the self CPU time and calls a round of every op
(ours, `dspine::*`, and torch's, `aten::*`), at each verify width (1 = a plain decode step).

What it is for: `round_profile.py` splits a round into the engine's pieces; this splits it into
ops, which shows what the quantised GEMMs leave (the activation, norms, attention, and the
dispatch of torch's small view/allocation ops between them).

    python benchmarks/cpu_op_profile.py [--widths 1 4] [--reps 15] [--threads 1] [--top 25] [--out DIR]

Writes DIR/cpu_op_profile.json and prints a markdown table (us a round; largest first at the
last width).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import RESULTS, run_info, save_json  # noqa: E402


def op_table(runner, width: int, reps: int) -> dict:
    """{op: {"us": self CPU us a round, "calls": calls a round}} over `reps` padding rounds."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        runner.padding_round(1, width)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            runner.padding_round(1, width)
    return {e.key: {"us": e.self_cpu_time_total / reps, "calls": e.count / reps}
            for e in prof.key_averages()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4],
                   help="verify widths (1: a plain step; 2-16: drafted rounds)")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=1, help="the engine's CPU kernel threads")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if any(not 1 <= w <= 16 for w in args.widths):
        p.error("--widths: 1 to 16 tokens a round")

    from dspine_engine import Engine

    engine = Engine(None, draft="default", spec_policy="auto", device="cpu", progress=False,
                    max_num_seqs=1, cpu_threads=args.threads)
    tables = {w: op_table(engine.runner, w, args.reps) for w in args.widths}
    info = dict(run_info("cpu"), threads=args.threads, reps=args.reps,
                quantized=engine.quantized, draft_weights=engine.draft_weight_format)
    save_json("cpu_op_profile", {"info": info, "ops": tables}, Path(args.out))
    last = tables[args.widths[-1]]
    names = sorted(set().union(*tables.values()), key=lambda k: -last.get(k, {}).get("us", 0.0))
    cols = [f"w={w} us" for w in args.widths] + [f"w={w} calls" for w in args.widths]
    print("| op | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    cell = lambda w, k, f: tables[w].get(k, {}).get(f, 0.0)  # noqa: E731
    for k in names[:args.top]:
        print(f"| {k} | " + " | ".join(f"{cell(w, k, 'us'):.0f}" for w in args.widths) + " | "
              + " | ".join(f"{cell(w, k, 'calls'):.1f}" for w in args.widths) + " |")
    for prefix in ("dspine::", "aten::"):
        print(f"| all {prefix}* | " + " | ".join(
            f"{sum(v['us'] for k, v in tables[w].items() if k.startswith(prefix)):.0f}"
            for w in args.widths) + " |" + " |" * len(args.widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
