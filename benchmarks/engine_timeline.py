#!/usr/bin/env python
"""Where an engine's rounds spend their wall time as they run: round_timeline.py's marks on a
real engine (by default the default model and its shipped drafter, under the fixed policy),
real prompts (MT-Bench's first turns, through the chat template), every answer the same length
so the batch stays whole, rounds back to back through `Engine.step()`.

Per engine and concurrency: medians per engine call of host and device time (see
round_timeline.py), the round's wall time, the device's busy time in it (the draft and verify
graphs, the block verify and the copy back: the device intervals of `runner.propose`,
`runner.verify` and `ops.block_verify`) and the rest, where the device waited on the host;
tokens a round (tau) and tokens/s while timed. The first ``--skip`` rounds (warm-up) are left
out; prefill steps are not rounds. ``--overlap on off`` runs each engine both ways (overlapped
rounds, driver.py): a step then launches a round and reads the one before it back, so its wall
time is a round's and its device intervals mix two rounds (read the round and tokens/s).

    python benchmarks/engine_timeline.py [--device cuda] [--concurrency 1 8] [--engines dspine ar]
        [--overlap off] [--max-new-tokens 128] [--target PATH --draft PATH] [--out DIR]

Writes DIR/engine_timeline_<device>.json and prints one table per engine and concurrency.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import RESULTS, run_info, save_json  # noqa: E402
from round_timeline import CallStamps, intervals, medians, timeline_markdown  # noqa: E402

GRAPH_CALLS = ("runner.propose", "runner.verify", "ops.block_verify")  # the device's work


def build_engine(name: str, args, batch: int, overlap: str):
    from dspine_engine import Engine

    draft = None if name == "ar" else args.draft
    extra = {"spec_policy": "fixed"} if draft is not None else {}
    return Engine(args.target, draft=draft, device=args.device, progress=False,
                  max_num_seqs=batch, overlap=overlap, **extra)


def timed_rounds(engine, prompts: list[str], batch: int, max_new: int, skip: int) -> dict:
    """Runs ``batch`` requests of ``max_new`` tokens each and times every round after ``skip``."""
    from dspine_engine import SamplingParams

    params = SamplingParams(max_tokens=max_new, ignore_eos=True)
    for i in range(batch):
        engine.add_request(prompts[i % len(prompts)], params)
    steps, seen, tokens = [], 0, 0
    with CallStamps(engine.runner, engine.scheduler) as stamps:
        while engine.has_unfinished():
            stamps.marks = []
            stamps.mark("start")
            outs = engine.step()
            stamps.mark("end")
            if not any(name == "scheduler.prepare_round" for name, _, _ in stamps.marks):
                continue  # a prefill step
            seen += 1
            if seen > skip and len(outs) == batch:  # a whole batch's round
                steps.append(stamps.marks)
                tokens += sum(len(o.new_token_ids) for o in outs)
    # The events are read once every step has run: reading them waits for the device, which,
    # between two overlapped steps, would hide the wait for the round in flight from the walls.
    return summary([intervals(marks) for marks in steps], tokens, batch)


def summary(rounds: list[dict], tokens: int, batch: int) -> dict:
    """The rounds' wall times are their host intervals, start mark to end mark, summed."""
    walls = [sum(host for host, _ in r.values()) for r in rounds]
    busy = [sum(r[c][1] for c in GRAPH_CALLS if c in r) for r in rounds]
    return {"batch": batch, "rounds": len(rounds), "calls": medians(rounds),
            "round_us": statistics.median(walls), "device_busy_us": statistics.median(busy),
            "device_waits_us": statistics.median(w - b for w, b in zip(walls, busy)),
            "tokens_per_round": tokens / batch / len(rounds),
            "tokens_per_second": tokens / (sum(walls) * 1e-6)}


def row_markdown(engine: str, row: dict) -> str:
    title = (f"{engine}, concurrency {row['batch']}: round {row['round_us']:.0f} us, device busy "
             f"{row['device_busy_us']:.0f} us and waiting on the host {row['device_waits_us']:.0f} "
             f"us, {row['tokens_per_round']:.2f} tokens a round per request, "
             f"{row['tokens_per_second']:.0f} tokens/s; {row['rounds']} rounds")
    return timeline_markdown(title, row["calls"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--engines", nargs="+", choices=("dspine", "ar"), default=["dspine", "ar"])
    p.add_argument("--overlap", nargs="+", choices=("on", "off"), default=["off"],
                   help="overlapped rounds: each engine once per value")
    p.add_argument("--max-new-tokens", type=int, default=128, help="every answer's length")
    p.add_argument("--skip", type=int, default=3, help="warm-up rounds left out")
    p.add_argument("--target", default=None, help="the target (default: the default model)")
    p.add_argument("--draft", default="default", help="the DSpine drafter (default: shipped)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    from dspine_engine.datasets import mtbench_prompts

    prompts = mtbench_prompts()
    rows = []
    for name in args.engines:
        for overlap in args.overlap:
            engine = build_engine(name, args, max(args.concurrency), overlap)
            label = f"{name} (overlapped)" if overlap == "on" else name
            for batch in args.concurrency:
                row = dict(timed_rounds(engine, prompts, batch, args.max_new_tokens, args.skip),
                           engine=name, overlap=overlap)
                rows.append(row)
                print("\n" + row_markdown(label, row), flush=True)
            device = engine.device.type
            del engine
    info = run_info(args.device)
    info.update(max_new_tokens=args.max_new_tokens, target=args.target or "default",
                draft=args.draft)
    path = save_json(f"engine_timeline_{device}", {"info": info, "rows": rows},
                     Path(args.out))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
