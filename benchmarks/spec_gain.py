#!/usr/bin/env python
"""Can speculation pay on this device? The predicted gain of each verify width, from costs
measured here and the drafter's acceptance measured by `drafter_eval.py`.

Times, on the engine's own padding rounds (`ModelRunner.padding_round`, what the verify-cost
profile of dynamic verification times: verify_cost.py), for each batch size:
- an autoregressive step of the plain engine (no draft loaded);
- a round of the drafted engine at each verify width w (w = 1: a plain round of the drafted
  engine; w > 1: the draft forward + a w-token verify + block verify);
- the draft forward alone (`ModelRunner.propose`).
The two engines are timed in alternation (A B A B ...), the median of each kept, so a machine
whose speed drifts moves both alike.

Predicted gain of width w = E(w) * t_AR / t_round(w), where E(w) = 1 + sum_{j<w} P(d_j accepted)
is the expected tokens of a round verifying w - 1 drafts (P from the acceptance JSON, every
block verified) and t_AR the autoregressive step: above 1 the width beats plain decoding.

    python benchmarks/spec_gain.py [--device cpu] [--batches 1 8] [--trials 5]
        [--acceptance benchmarks/results/h200_run6/accept_cuda.json] [--out DIR]

Writes DIR/spec_gain_<device>.json and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import (RESULTS, engine_threads, median_seconds as timed, run_info,  # noqa: E402
                    save_json)

WIDTHS = (1, 2, 4, 8, 16)


def draft_forward(runner, b: int):
    """The draft forward alone, on ``b`` padding rows."""
    def run():
        with runner.threads():  # the engine's CPU thread counts, as a round runs under
            runner.stage_padding(b, runner.block)
            runner.propose()
    return run


def measure(ar, dr, batches, trials: int, reps: int) -> dict:
    samples: dict[str, list[float]] = {}
    for _ in range(trials):  # alternate the engines, trial by trial
        for b in batches:
            samples.setdefault(f"ar/{b}", []).append(
                timed(lambda: ar.runner.padding_round(b, 1), reps))
            for w in WIDTHS:
                samples.setdefault(f"w{w}/{b}", []).append(
                    timed(lambda: dr.runner.padding_round(b, w), reps))
            samples.setdefault(f"draft/{b}", []).append(timed(draft_forward(dr.runner, b), reps))
    return {k: statistics.median(v) for k, v in samples.items()}


def expected_tokens(acceptance: list[float], width: int) -> float:
    return 1.0 + sum(acceptance[:width - 1])


def acceptance_rows(path: Path, draft: str) -> dict[str, list[float]]:
    rows = json.loads(path.read_text())["rows"]
    return {f"{r['prompts']} T={r['temperature']:g}": r["acceptance_by_position"]
            for r in rows if r.get("draft", draft) == draft}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--trials", type=int, default=5, help="alternating trials (median kept)")
    p.add_argument("--reps", type=int, default=5, help="calls per trial (median kept)")
    p.add_argument("--acceptance", default=str(ROOT / "benchmarks/results/h200_run6/"
                                                      "accept_cuda.json"))
    p.add_argument("--draft-name", default="dspine", help="the acceptance rows' draft name")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    import torch

    from dspine_engine import Engine

    kw = dict(device=args.device, progress=False, max_num_seqs=max(args.batches))
    ar = Engine(None, **kw)
    dr = Engine(None, draft="default", spec_policy="fixed", **kw)
    t = measure(ar, dr, args.batches, args.trials, args.reps)
    accept = acceptance_rows(Path(args.acceptance), args.draft_name)
    rows = []
    for b in args.batches:
        step = t[f"ar/{b}"]
        row = {"batch": b, "ar_step_s": step, "draft_forward_s": t[f"draft/{b}"],
               "draft_forward_in_steps": t[f"draft/{b}"] / step,
               "round_s": {w: t[f"w{w}/{b}"] for w in WIDTHS},
               "round_in_steps": {w: t[f"w{w}/{b}"] / step for w in WIDTHS},
               "predicted_gain": {name: {w: expected_tokens(a, w) * step / t[f"w{w}/{b}"]
                                         for w in WIDTHS} for name, a in accept.items()}}
        rows.append(row)
    info = run_info(args.device)
    info.update(threads=torch.get_num_threads(), engine_threads=engine_threads(dr),
                dtype=str(dr.dtype), quantized=dr.quantized,
                acceptance=str(args.acceptance))
    save_json(f"spec_gain_{ar.device.type}", {"info": info, "rows": rows}, Path(args.out))
    print("| batch | AR step ms | draft fwd (steps) | round w=1 / 2 / 4 / 8 / 16 (steps) | "
          + " | ".join(f"gain {n}" for n in accept) + " |")
    print("|---|---|---|---|" + "---|" * len(accept))
    for r in rows:
        steps = " / ".join(f"{r['round_in_steps'][w]:.2f}" for w in WIDTHS)
        gains = " | ".join(" / ".join(f"{g:.2f}" for g in r["predicted_gain"][n].values())
                           for n in accept)
        print(f"| {r['batch']} | {r['ar_step_s'] * 1e3:.1f} | {r['draft_forward_in_steps']:.2f} | "
              f"{steps} | {gains} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
