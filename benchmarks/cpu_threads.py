#!/usr/bin/env python
"""Which split of the CPU's threads makes a round fastest: torch's ops vs our kernels.

Times the engine's own padding rounds (`ModelRunner.padding_round`: the autoregressive step of
the plain engine, drafted rounds of w = 4 and 16 tokens, at batch 1 and 8) under each setting
"tT kK" = torch's intra-op threads T during the step, our kernels on K threads (the engine's
`CpuThreads`; t2 k2 is what the engine did before cpu_threads, where the kernels followed torch
and torch kept its threads). One process, the settings alternating block by block
(common.paired_medians) so that load from other processes hits them alike.

    python benchmarks/cpu_threads.py [--settings 2,2 1,2 1,1] [--reps 9] [--out DIR]

Writes DIR/cpu_threads_cpu.json and prints a markdown table (ms, and each setting / the first).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import RESULTS, markdown_table, paired_medians, run_info, save_json  # noqa: E402

# (name, engine: "ar" or "spec", batch, tokens verified per row)
CASES = [("AR step b=1", "ar", 1, 1), ("drafted round w=4 b=1", "spec", 1, 4),
         ("drafted round w=16 b=1", "spec", 1, 16), ("AR step b=8", "ar", 8, 1),
         ("drafted round w=16 b=8", "spec", 8, 16)]


def round_under(runner, threads, b: int, tokens: int):
    """One padding round with the engine's thread setting replaced by ``threads``."""
    def run():
        runner.cpu_threads = threads
        runner.padding_round(b, tokens)
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=["2,2", "1,2", "1,1"],
                   help="torch threads,kernel threads")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    from dspine_engine import Engine
    from dspine_engine.engine.cpu_threads import CpuThreads

    settings = [tuple(int(x) for x in s.split(",")) for s in args.settings]
    kw = dict(device="cpu", progress=False, max_num_seqs=8)
    engines = {"ar": Engine(None, **kw), "spec": Engine(None, draft="default",
                                                        spec_policy="fixed", **kw)}
    rows = []
    for name, which, b, tokens in CASES:
        runner = engines[which].runner
        fns = [round_under(runner, CpuThreads(k, t), b, tokens) for t, k in settings]
        ms = [s * 1e3 for s in paired_medians(fns, args.reps)]
        rows.append({"case": name, "ms": dict(zip(args.settings, ms))})
    labels = [f"t{t} k{k}" for t, k in settings]
    table = markdown_table(["case"] + [f"{s} ms" for s in labels] +
                           [f"{s} / {labels[0]}" for s in labels[1:]],
                           [[r["case"]] + list(r["ms"].values()) +
                            [m / list(r["ms"].values())[0] for m in list(r["ms"].values())[1:]]
                            for r in rows])
    save_json("cpu_threads_cpu", {"info": run_info("cpu"), "settings": args.settings,
                                  "rows": rows}, Path(args.out))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
