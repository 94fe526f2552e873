"""Where a round's GPU time goes (CUDA): its phases in stream order and its kernels.

`round_profile.py` times a round's pieces on the host; on a GPU the draft is launched
asynchronously, so its cost lands in the round's one wait (`accept`). This script looks at the
device instead, on the same padding rounds (`ModelRunner.padding_round`, batch 1):

* phases: CUDA events recorded before and after each of `stage_padding`, `propose`, `verify` and
  `accept`, in stream order, so each phase's milliseconds are the device's time from its first to
  its last piece of work (gaps where the device waited for the host included: that is what a
  launch-bound phase looks like);
* kernels: `torch.profiler` over the same rounds, every device kernel, memset and copy with its
  launches a round and microseconds a round (kernels inside CUDA graphs included), summed into
  launches a round and busy time a round.

For the autoregressive step (a plain engine) and drafted rounds at each `--widths`. Writes
DIR/round_kernels_cuda.json and prints markdown tables.

    python benchmarks/round_kernels.py [--widths 4 16] [--reps 21] [--top 25] [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import RESULTS, device_kernels, kernel_rows_markdown, run_info, save_json  # noqa: E402

PHASES = ("stage_padding", "propose", "verify", "accept")


def mark_phases(runner, torch) -> list:
    """Wraps the round's phases so that each records a CUDA event before and after it; returns
    the list the marks (phase, start, end) are appended to (cleared by the caller)."""
    marks: list = []

    def wrap(name):
        inner = getattr(runner, name)

        def marked(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = inner(*args, **kwargs)
            end.record()
            marks.append((name, start, end))
            return out
        setattr(runner, name, marked)

    for name in PHASES:
        wrap(name)
    return marks


def phase_ms(runner, marks: list, width: int, reps: int, torch) -> dict:
    """Median device milliseconds per phase and for the whole round (first start to last end)."""
    for _ in range(2):
        runner.padding_round(1, width)
    per = defaultdict(list)
    for _ in range(reps):
        marks.clear()
        runner.padding_round(1, width)
        torch.cuda.synchronize()
        for name, start, end in marks:
            per[name].append(start.elapsed_time(end))
        per["round"].append(marks[0][1].elapsed_time(marks[-1][2]))
    return {k: statistics.median(v) for k, v in per.items()}


def kernel_table(runner, width: int, reps: int) -> dict:
    """The device kernels of `reps` rounds (common.device_kernels), after two warm-ups."""
    for _ in range(2):
        runner.padding_round(1, width)
    return device_kernels(lambda: runner.padding_round(1, width), reps)


def measure(engine, widths, reps: int, torch) -> dict:
    runner = engine.runner
    marks = mark_phases(runner, torch)
    out = {}
    for w in widths:
        out[w] = {"phases_ms": phase_ms(runner, marks, w, reps, torch),
                  **kernel_table(runner, w, reps)}
    return out


def print_tables(ar: dict, drafted: dict, top: int) -> None:
    cols = [("AR", ar[1])] + [(f"w={w}", r) for w, r in drafted.items()]
    print("| phase (device ms) | " + " | ".join(c for c, _ in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for k in PHASES + ("round",):
        print(f"| {k} | " + " | ".join(f"{r['phases_ms'].get(k, 0.0):.3f}" for _, r in cols) + " |")
    print("| kernels a round | " + " | ".join(f"{r['launches']:.0f}" for _, r in cols) + " |")
    print("| kernel time a round (ms) | " + " | ".join(f"{r['busy_us'] / 1e3:.3f}" for _, r in cols) + " |")
    for label, r in cols:
        print(f"\n{label}: " + kernel_rows_markdown(r, top))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[4, 16],
                   help="drafted rounds' verify widths (2..16)")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--top", type=int, default=25, help="kernels listed per column")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("benchmarks/round_kernels.py needs a CUDA device", file=sys.stderr)
        return 1
    if any(not 2 <= w <= 16 for w in args.widths):
        p.error("--widths: drafted rounds verify 2 to 16 tokens")
    from dspine_engine import Engine

    kw = dict(device="cuda", progress=False, max_num_seqs=1)
    ar = Engine(None, **kw)
    # auto: the engine captures a CUDA graph at every verify width.
    dr = Engine(None, draft="default", spec_policy="auto", **kw)
    ar_rows = measure(ar, [1], args.reps, torch)
    drafted = measure(dr, args.widths, args.reps, torch)
    save_json("round_kernels_cuda", {"info": run_info("cuda"), "ar": ar_rows, "drafted": drafted},
              Path(args.out))
    print_tables(ar_rows, drafted, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
