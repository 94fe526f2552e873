"""Acceptance of drafters on HumanEval and MT-Bench at temperature 0 and 1, one engine per
drafter, plus the greedy lossless check of the first drafter against autoregressive decoding.

    python benchmarks/drafter_eval.py --draft dspine=DIR --draft dflash=DIR [--out DIR]
        [--widths 2 4 8]

--widths W ... measures each drafter at fixed verify widths (spec_policy fixed, W - 1 drafts a
round: what a round of that width accepts, e.g. on the CPU where rounds are short) instead of
the whole block; its rows carry "width".

Writes accept_<device>.json (tau and acceptance by position per drafter / prompt set /
temperature), accept_<device>_<set>_t<T>.png (the curves side by side) and, with
--lossless N, lossless_<device>.json (greedy outputs of the first drafter vs plain decoding,
batch 1 and batched, N prompts x 128 tokens, in the engine's dtype and in fp32; in bf16/fp16
each first difference with its tie gaps: how far below the target's best fp32 logit both tokens
are, dspine_engine/lossless.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_info  # noqa: E402


def acceptance_table(drafts, target, device, dtype, sets, temps, max_new, batch, out,
                     num_prompts=None, widths=(None,)):
    from dspine_engine import Engine, SamplingParams
    from dspine_engine.cli.bench import acceptance, plot_acceptance
    from dspine_engine.datasets import load_prompts

    prompts = {s: load_prompts(s)[:num_prompts] for s in sets}
    rows = []
    for (name, path), w in ((d, w) for d in drafts for w in widths):
        fixed = {} if w is None else dict(spec_policy="fixed", num_speculative_tokens=w - 1)
        eng = Engine(target, draft=path, device=device, dtype=dtype, max_num_seqs=batch,
                     progress=False, **fixed)
        for s in sets:
            for t in temps:
                res = acceptance(eng, prompts[s], lambda i, t=t: SamplingParams(
                    max_tokens=max_new, temperature=t, seed=i if t > 0 else None), batch)
                res.update(draft=name, prompts=s, temperature=t, num_prompts=len(prompts[s]),
                           width=w or eng.config.block_size)
                res.pop("per_request_tau")
                rows.append(res)
                print(f"{name:>8} w={res['width']:<2} {s:>9} T={t:g}: tau {res['tau']:.3f}",
                      file=sys.stderr)
        del eng
    dev = device_tag(device)
    for s in sets:
        for t in temps:
            curves = {f"{r['draft']} w={r['width']}" if len(widths) > 1 else r["draft"]:
                      r["acceptance_by_position"] for r in rows
                      if r["prompts"] == s and r["temperature"] == t}
            plot_acceptance(curves, Path(out) / f"accept_{dev}_{s}_t{t:g}.png")
    return rows


def lossless_check(draft, target, device, n_prompts, out_dtype):
    """Greedy speculative vs greedy autoregressive, token by token."""
    from dspine_engine import Engine, SamplingParams
    from dspine_engine.lossless import compare_outputs, compare_with_ties, describe
    from dspine_engine.datasets import humaneval_prompts, mtbench_prompts

    prompts = humaneval_prompts()[: n_prompts // 2] + mtbench_prompts()[: n_prompts - n_prompts // 2]
    params = SamplingParams(max_tokens=128, ignore_eos=True)
    report = {}
    for dtype in out_dtype:
        ar = Engine(target, device=device, dtype=dtype, progress=False, max_num_seqs=32)
        model_dir, prompt_ids = ar.model_dir, [ar.encode_prompt(p) for p in prompts]
        ref_b1 = [ar.generate(p, params)[0].token_ids for p in prompts]
        ref_batch = [r.token_ids for r in ar.generate(prompts, params)]
        del ar
        sp = Engine(target, draft=draft, device=device, dtype=dtype, progress=False,
                    max_num_seqs=32)
        got_b1 = [sp.generate(p, params)[0].token_ids for p in prompts]
        got_batch = [r.token_ids for r in sp.generate(prompts, params)]
        del sp
        pairs = {"spec_batch1_vs_ar_batch1": (ref_b1, got_b1),
                 "spec_batched_vs_ar_batched": (ref_batch, got_batch),
                 "ar_batched_vs_ar_batch1": (ref_b1, ref_batch)}
        # In half precision, what holds: differences only at near-ties (fp32 is exact).
        report[dtype] = {name: compare_outputs(ref, got) if dtype == "float32" else
                         compare_with_ties(model_dir, prompt_ids, ref, got)
                         for name, (ref, got) in pairs.items()}
        print(f"lossless {dtype}: " + "; ".join(f"{k} {describe(v)}" for k, v in report[dtype].items()),
              file=sys.stderr)
    return report


def device_tag(device: str | None) -> str:
    from dspine_engine.engine.engine import resolve_device

    return resolve_device(device).type


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--target", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--sets", nargs="+", default=["humaneval", "mtbench"])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=None, help="cap each prompt set")
    ap.add_argument("--widths", type=int, nargs="+", default=[None],
                    help="fixed verify widths (tokens a round, anchor included); default: "
                         "the whole block")
    ap.add_argument("--lossless", type=int, default=0, help="prompts for the lossless check")
    ap.add_argument("--lossless-dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    drafts = [tuple(d.split("=", 1)) for d in args.draft]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    dev = device_tag(args.device)
    payload = {"info": run_info(args.device or dev), "max_new_tokens": args.max_new_tokens}
    payload["rows"] = acceptance_table(drafts, args.target, args.device, args.dtype, args.sets,
                                       args.temperatures, args.max_new_tokens, args.batch,
                                       args.out, args.num_prompts, args.widths)
    (Path(args.out) / f"accept_{dev}.json").write_text(json.dumps(payload, indent=2) + "\n")
    if args.lossless:
        report = lossless_check(drafts[0][1], args.target, args.device, args.lossless,
                                args.lossless_dtypes)
        (Path(args.out) / f"lossless_{dev}.json").write_text(
            json.dumps({"info": payload["info"], "draft": drafts[0][0], **report}, indent=2))


if __name__ == "__main__":
    main()
