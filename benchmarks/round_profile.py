#!/usr/bin/env python
"""Where a drafted round's time goes on this device, piece by piece, at each verify width.

Timers around the runner's and the draft's pieces (`ModelRunner.propose` / `verify` / `accept`,
`DSpineDraft.context` / `heads`, the transition walk) on the engine's own padding rounds
(`ModelRunner.padding_round`, what the verify-cost profile times), batch 1; medians of
``--reps`` rounds after two warm-ups, beside the autoregressive step of the plain engine.
The rest of `propose` (its layers: projections, attention, norms, the injection, the context
write) is ``propose - context - heads - walk``.

    python benchmarks/round_profile.py [--device cpu] [--reps 11] [--cpu-time] [--out DIR]

--cpu-time (CPU only) runs the engines' kernels on one thread and times pieces in CPU seconds
of the process (time.process_time): on a machine shared with other jobs the wall clock counts
the time the scheduler gave away, the CPU clock only the work (memory stalls included), so two
trees or variants compare within a few percent where wall medians move 2x.

Writes DIR/round_profile_<device>[_cputime].json and prints a markdown table (ms; last row in
AR steps).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import RESULTS, engine_threads, run_info, save_json  # noqa: E402

WIDTHS = (1, 2, 4, 8, 16)
clock = time.perf_counter  # time.process_time under --cpu-time


def add_timers(runner, pieces: dict) -> None:
    """Wraps each piece so its seconds add up in ``pieces`` (per round: cleared by the caller)."""
    import dspine_engine.models.dspine as dspine

    def wrap(owner, name, key):
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = clock()
            out = inner(*args, **kwargs)
            pieces[key] = pieces.get(key, 0.0) + clock() - t0
            return out
        setattr(owner, name, timed)

    wrap(runner, "propose", "draft forward (propose)")
    wrap(runner.draft, "context", "  fc + norm (context)")
    wrap(runner.draft, "heads", "  lm_head + W_h (heads)")
    wrap(dspine, "choose_drafts", "  transition walk")
    wrap(runner, "catch_up_context", "context catch-up (plain rounds)")
    wrap(runner, "verify", "verify forward")
    wrap(runner, "accept", "block verify + sync")


def profile(runner, reps: int) -> dict:
    pieces: dict = {}
    add_timers(runner, pieces)
    out = {}
    for w in WIDTHS:
        for _ in range(2):
            runner.padding_round(1, w)
        rounds = []
        for _ in range(reps):
            pieces.clear()
            t0 = clock()
            runner.padding_round(1, w)
            pieces["round"] = clock() - t0
            rounds.append(dict(pieces))
        keys = {k for r in rounds for k in r}
        out[w] = {k: statistics.median(r.get(k, 0.0) for r in rounds) for k in keys}
    return out


def ar_step(runner, reps: int) -> float:
    for _ in range(2):
        runner.padding_round(1, 1)
    runs = []
    for _ in range(reps):
        t0 = clock()
        runner.padding_round(1, 1)
        runs.append(clock() - t0)
    return statistics.median(runs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--cpu-time", action="store_true",
                   help="one kernel thread, pieces in CPU seconds (see above)")
    args = p.parse_args(argv)

    import torch

    from dspine_engine import Engine

    global clock
    kw = dict(device=args.device, progress=False, max_num_seqs=1)
    if args.cpu_time:
        clock = time.process_time
        kw.update(cpu_threads=1)
    ar = Engine(None, **kw)
    # auto: the engine then captures a CUDA graph at every verify width the profile times.
    dr = Engine(None, draft="default", spec_policy="auto", **kw)
    step = ar_step(ar.runner, args.reps)
    pieces = profile(dr.runner, args.reps)
    info = run_info(args.device)
    info.update(threads=torch.get_num_threads(), engine_threads=engine_threads(dr),
                quantized=dr.quantized,
                draft_weights=dr.draft_weight_format,
                clock="process CPU time" if args.cpu_time else "wall")
    name = f"round_profile_{ar.device.type}" + ("_cputime" if args.cpu_time else "")
    save_json(name, {"info": info, "ar_step_s": step, "pieces_s": pieces}, Path(args.out))
    keys = sorted({k for v in pieces.values() for k in v} - {"round"},
                  key=lambda k: (k.startswith("  "), k))
    order = ["draft forward (propose)"] + [k for k in keys if k.startswith("  ")] + [
        k for k in keys if not k.startswith("  ") and k != "draft forward (propose)"]
    print(f"AR step {step * 1e3:.2f} ms")
    print("| piece | " + " | ".join(f"w={w}" for w in WIDTHS) + " |")
    print("|---|" + "---|" * len(WIDTHS))
    for k in order + ["round"]:
        print(f"| {k} | " + " | ".join(f"{pieces[w].get(k, 0.0) * 1e3:.2f}" for w in WIDTHS)
              + " |")
    print("| round in AR steps | " + " | ".join(f"{pieces[w]['round'] / step:.2f}"
                                               for w in WIDTHS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
