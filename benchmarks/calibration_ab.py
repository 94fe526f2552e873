"""A wrong verify-cost profile, with and without online calibration (issue 11).

Measures a verify-cost profile of this build (as the engine does at start-up), writes a copy
with one width's cost scaled (default: the 4-token round x3, the width the auto policy drafts
at on the CPU), and runs the default model with the shipped drafter under the auto policy at
concurrency 1 on the same prompts, in four configurations, each one engine kept for all its
runs (acceptance statistics and calibration carry over from run to run, as in a server):

  measured      the measured profile, no calibration
  measured+cal  the measured profile, calibrated online (opt-in: spec_calibration=True)
  wrong         the scaled profile, no calibration
  wrong+cal     the scaled profile, calibrated online

The runs alternate between the configurations, in an order rotated every run, so a busy spell
of a shared machine falls on all of them. Reported per configuration: the median tokens/s over
the runs (wall time of the engine's steps, and CPU time of the process), the median of each
run's ratio to ``wrong``, the drafts verified per round and the calibrated costs at the end.
Greedy outputs of every configuration are compared (they must be identical).

    python benchmarks/calibration_ab.py [--runs 5] [--prompts humaneval] [--num-prompts 4]
        [--max-new-tokens 128] [--width 4] [--scale 3]

Writes benchmarks/results/calibration_ab_<device>.json and the section "calibration_ab" of
docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, run_info, save_json, update_doc_section  # noqa: E402
from dspine_engine import Engine, SamplingParams  # noqa: E402
from dspine_engine.datasets import load_prompts  # noqa: E402
from dspine_engine.engine import verify_cost as vc  # noqa: E402

WIDTHS = [1, 2, 4, 8, 16]
CONFIGS = {"measured": ("measured", False), "measured+cal": ("measured", True),
           "wrong": ("wrong", False), "wrong+cal": ("wrong", True)}


def write_profiles(args, folder: Path) -> dict[str, Path]:
    """The measured profile (batch 1) and its copy with ``args.width`` scaled."""
    probe = Engine(None, draft="default", device=args.device, progress=False, max_num_seqs=1,
                   spec_policy="fixed")
    measured = vc.measure(probe.runner, WIDTHS, [1], *vc.probe_settings(probe.device))
    probe.close()
    wrong = vc.CostProfile({w: dict(row) for w, row in measured.seconds.items()})
    wrong.seconds[args.width] = {b: s * args.scale for b, s in wrong.seconds[args.width].items()}
    paths = {}
    for name, profile in (("measured", measured), ("wrong", wrong)):
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(profile.to_json()))
    return paths


def one_run(engine, prompts, params) -> tuple[dict, list]:
    engine.reset_stats()
    cpu = time.process_time()
    results = engine.generate(prompts, params)
    cpu = time.process_time() - cpu
    s = engine.stats
    return ({"tokens": s.new_tokens, "tokens_per_second": s.tokens_per_second,
             "tokens_per_cpu_second": s.new_tokens / cpu,
             "verify_lengths": {str(k): v for k, v in sorted(s.verify_lengths.items())}},
            [r.token_ids for r in results])


def summarise(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for name, rows in runs.items():
        ratios = [r["tokens_per_second"] / w["tokens_per_second"]
                  for r, w in zip(rows, runs["wrong"])]
        cpu_ratios = [r["tokens_per_cpu_second"] / w["tokens_per_cpu_second"]
                      for r, w in zip(rows, runs["wrong"])]
        out[name] = {"median_tokens_per_second": statistics.median(
                         r["tokens_per_second"] for r in rows),
                     "median_tokens_per_cpu_second": statistics.median(
                         r["tokens_per_cpu_second"] for r in rows),
                     "median_ratio_vs_wrong": statistics.median(ratios),
                     "median_cpu_ratio_vs_wrong": statistics.median(cpu_ratios)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--width", type=int, default=4, choices=WIDTHS[1:])
    ap.add_argument("--scale", type=float, default=3.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = ap.parse_args()
    prompts = load_prompts(args.prompts)[:args.num_prompts]
    params = SamplingParams(max_tokens=args.max_new_tokens)  # answers end at EOS
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_profiles(args, Path(tmp))
        engines = {name: Engine(None, draft="default", device=args.device, progress=False,
                                max_num_seqs=1, spec_policy="auto",
                                spec_cost_profile=str(paths[profile]), spec_calibration=cal)
                   for name, (profile, cal) in CONFIGS.items()}
        profiles = {name: json.loads(p.read_text()) for name, p in paths.items()}
    runs = {name: [] for name in CONFIGS}
    outputs = {}
    names = list(CONFIGS)
    for i in range(args.runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            row, tokens = one_run(engines[name], prompts, params)
            runs[name].append(row)
            outputs.setdefault(name, tokens)
            print(f"run {i} {name:>13}: {row['tokens_per_second']:6.1f} tok/s "
                  f"({row['tokens_per_cpu_second']:6.1f} per CPU s) {row['verify_lengths']}",
                  file=sys.stderr)
    summary = summarise(runs)
    identical = all(t == outputs["measured"] for t in outputs.values())
    calibrated = {name: engines[name].calibrated_costs() for name in CONFIGS}
    info = run_info(args.device)
    payload = {**info, "args": vars(args), "profiles": profiles, "summary": summary,
               "outputs_identical": identical, "calibrated_costs": calibrated, "runs": runs}
    path = save_json(f"calibration_ab_{args.device.split(':')[0]}", payload)
    print(f"wrote {path}", file=sys.stderr)
    table = markdown_table(
        ["config", "tok/s (median)", "tok/CPU-s (median)", "vs wrong (median of runs)",
         "vs wrong, CPU time", "drafts verified, last run"],
        [[name, s["median_tokens_per_second"], s["median_tokens_per_cpu_second"],
          s["median_ratio_vs_wrong"], s["median_cpu_ratio_vs_wrong"],
          " ".join(f"{k}x{v}" for k, v in runs[name][-1]["verify_lengths"].items())]
         for name, s in summary.items()])
    print(table)
    print(f"greedy outputs identical across configurations: {identical}")
    if not args.no_doc:
        update_doc_section("calibration_ab", table + f"\n\nGreedy outputs identical: "
                           f"{identical}. Width {args.width} priced x{args.scale:g} in the "
                           f"wrong profile; {args.runs} alternating runs of "
                           f"{len(prompts)} {args.prompts} prompts.", info)


if __name__ == "__main__":
    main()
