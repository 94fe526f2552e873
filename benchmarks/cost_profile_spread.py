"""How much a verify-cost profile moves between measurements of one build (issue 11).

The auto policy plans with the ratio of a round's cost at each width to a plain step's, from one
profile measured at start-up (dspine_engine/engine/verify_cost.py). This script measures that
profile N times each way, alternating: the points' runs back to back (``sweep=False``, before
2026-12-03) and in sweeps over the widths (the default), and reports the spread of each width's
cost in plain-step units.

    python benchmarks/cost_profile_spread.py [--profiles 8] [--device cpu] [--batch 1]

Writes benchmarks/results/cost_profile_spread_<device>.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dspine_engine import Engine
from dspine_engine.engine import verify_cost as vc

WIDTHS = [1, 2, 4, 8, 16]


def profile_ratios(runner, batch: int, sweep: bool) -> dict[int, float]:
    seconds = vc.measure(runner, WIDTHS, [batch], *vc.probe_settings(runner.device),
                         sweep=sweep).seconds
    return {w: seconds[w][batch] / seconds[1][batch] for w in WIDTHS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", type=int, default=8, help="profiles measured each way")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    engine = Engine(None, draft="default", device=args.device, progress=False,
                    max_num_seqs=args.batch, spec_policy="fixed")
    runs = {"back_to_back": [], "sweeps": []}
    for i in range(args.profiles):
        for name in (("back_to_back", "sweeps") if i % 2 == 0 else ("sweeps", "back_to_back")):
            runs[name].append(profile_ratios(engine.runner, args.batch, name == "sweeps"))
    summary = {name: {w: [min(r[w] for r in rows), max(r[w] for r in rows)] for w in WIDTHS[1:]}
               for name, rows in runs.items()}
    for name, spans in summary.items():
        print(f"{name:>12}: " + ", ".join(f"w={w} {lo:.2f}-{hi:.2f}" for w, (lo, hi) in spans.items())
              + " (plain steps)")
    out = Path(__file__).parent / "results" / f"cost_profile_spread_{engine.device.type}.json"
    out.write_text(json.dumps({"device": vc.device_name(engine.device), "batch": args.batch,
                               "summary": summary, "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
