#!/usr/bin/env python
"""Time to first token of long prompts through the engine, with the prefill's attention on the
Hopper wgmma kernel (the default on sm_90) and on the mma.sync kernel (``DSPINE_ATTN_SM90=0``).

The kernel benchmarks time the attention alone; this is what a user sees: `Engine.generate` of
``batch`` prompts of ``length`` random tokens with ``max_tokens=1`` (the prefill and its first
token), the target alone (no draft: a draft's own prefill is the same for both settings). The
two settings alternate in blocks (A B A B, `paired_medians`), since the knob is read at every
call; each row also says whether both settings chose the same first tokens (the kernels sum in
different orders, so a near-tie may part; reported, not asserted: the lossless tests check the
engine's promises).

    python benchmarks/prefill_ttft.py [--lengths 1024 4096 8000] [--batches 1 4] [--reps 6]

Writes DIR/prefill_ttft_<device>.json and the "prefill-ttft" table of docs/BENCHMARKS.md
(--no-doc leaves the doc alone).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (RESULTS, env_knobs, markdown_table, paired_medians, run_info,  # noqa: E402
                    save_json, update_doc_section)

from dspine_engine import Engine, SamplingParams  # noqa: E402

KNOB = "DSPINE_ATTN_SM90"
SETTINGS = (("wgmma (default)", None), ("mma.sync", "0"))


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    # Ids from 10 up: the lowest ids are special tokens in the default model's vocabulary.
    return [torch.randint(10, vocab, (length,), generator=gen).tolist() for _ in range(batch)]


def first_tokens(engine: Engine, batch_prompts: list[list[int]]) -> list[int]:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    results = engine.generate(batch_prompts, params)
    bad = [r.error for r in results if r.finish_reason == "error"]
    if bad:
        raise RuntimeError(f"a prompt was refused: {bad[0]}")
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return [r.token_ids[0] for r in results]


def measure(engine: Engine, length: int, batch: int, reps: int, seed: int) -> dict:
    batch_prompts = prompts(batch, length, engine.target.config.vocab_size, seed)
    chosen = {}

    def run(name, value):
        def call():
            with env_knobs(**{KNOB: value}):
                chosen[name] = first_tokens(engine, batch_prompts)
        return call

    fns = [run(name, value) for name, value in SETTINGS]
    seconds = paired_medians(fns, reps=reps, warmup=1, rounds=2)
    wgmma, mma = seconds
    return {"length": length, "batch": batch, "ms": {n: s * 1e3 for (n, _), s in zip(SETTINGS, seconds)},
            "speedup": mma / wgmma, "tokens_per_s": batch * length / wgmma,
            "same_first_tokens": chosen[SETTINGS[0][0]] == chosen[SETTINGS[1][0]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cuda",
                   help="cuda (the knob matters only on sm_90; cpu runs the same loop, for tests)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8000],
                   help="prompt tokens (at most the target's context minus one)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4], help="prompts a call")
    p.add_argument("--reps", type=int, default=6, help="timed calls per setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS), help="directory for the JSON")
    p.add_argument("--no-doc", action="store_true", help="leave docs/BENCHMARKS.md alone")
    args = p.parse_args(argv)

    longest, widest = max(args.lengths), max(args.batches)
    with env_knobs(**{KNOB: None}):  # the engine's graphs captured under the default dispatch
        engine = Engine(args.target, device=args.device, dtype=args.dtype, progress=False,
                        max_num_seqs=widest, max_prefill_tokens=widest * longest,
                        kv_cache_tokens=widest * (longest + 64))
        rows = [measure(engine, n, b, args.reps, args.seed) for n in args.lengths for b in args.batches]
        engine.close()

    info = run_info(args.device)
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    path = save_json(f"prefill_ttft_{device}", {**info, "rows": rows}, Path(args.out))
    names = [n for n, _ in SETTINGS]
    table = markdown_table(
        ["prompt tokens", "batch"] + [f"{n} ms" for n in names] + ["speed-up", "prompt tok/s", "same first tokens"],
        [[r["length"], r["batch"]] + [r["ms"][n] for n in names]
         + [r["speedup"], f"{r['tokens_per_s']:.0f}", r["same_first_tokens"]] for r in rows])
    print(table)
    print(f"wrote {path}")
    if not args.no_doc:
        update_doc_section("prefill-ttft", table, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
