"""dspine-bench: measure a drafter's acceptance and the engine's end-to-end speed.

  dspine-bench accept --draft DIR --prompts humaneval|mtbench|FILE.jsonl [--temperature T]
      mean tau (tokens per round, bonus included) and acceptance by block position, as JSON and
      a PNG plot. Every block is verified in full, so tau is a property of the drafter.
  dspine-bench e2e --draft NAME=DIR ... [--concurrency 1 8 32] [--spec-policy fixed auto]
      output tokens/s of autoregressive decoding and of each draft (under each verification
      policy), same prompts, one run; greedy outputs of every draft run are compared with the
      autoregressive ones; rows carry the drafts verified per round (verify_lengths) and the
      auto policy's calibrated round costs (calibrated_costs, with --spec-calibration).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..lossless import compare_with_ties, describe
from .generate import (_positive_int, add_attention_argument, add_kv_cache_argument,
                       add_overlap_argument, add_parallel_argument, format_lengths)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="target model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="auto",
                   help="gguf / float32 / bfloat16 (default: bf16 on CUDA, the GGUF's quantised "
                        "blocks on the CPU for the default model)")
    p.add_argument("--prompts", default="mtbench",
                   help="humaneval, mtbench, or a JSONL prompts file, read as dspine-train data "
                        "reads it (first turns; default: mtbench)")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per answer")
    p.add_argument("--out", default="benchmarks/results", help="directory for JSON and PNG")
    p.add_argument("--name", default=None, help="file name stem of the results")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_parallel_argument(p)
    add_kv_cache_argument(p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspine-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("accept", help="acceptance (tau, by position) of a drafter")
    _common(a)
    a.add_argument("--draft", required=True, help="draft directory (or 'default')")
    a.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    a.add_argument("--seed", type=int, default=0, help="base seed of sampled runs")
    a.add_argument("--batch", type=int, default=32, help="requests in flight")
    e = sub.add_parser("e2e", help="end-to-end tokens/s: autoregressive vs drafts")
    _common(e)
    e.add_argument("--draft", action="append", default=[], metavar="NAME=DIR",
                   help="a drafter to compare (repeatable), e.g. dspine=path")
    e.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                   help="requests in flight (default: 1 8 32)")
    e.add_argument("--no-ar", action="store_true", help="skip the autoregressive baseline")
    e.add_argument("--stop-at-eos", action="store_true",
                   help="answers end at the end-of-sequence token, as users get them (tau and "
                        "tokens/s without the text a model writes past its answer); default: "
                        "every answer is --max-new-tokens long")
    e.add_argument("--spec-policy", nargs="+", choices=("auto", "fixed"), default=["auto"],
                   help="verification policies to run each drafter under, e.g. 'fixed auto' "
                        "(rows named NAME-POLICY; default: auto)")
    e.add_argument("--num-speculative-tokens", type=_positive_int, default=None, metavar="N",
                   help="drafts verified per round (fixed) or at most (auto); default block - 1")
    e.add_argument("--reprofile", action="store_true",
                   help="measure the verify-cost profile again instead of reading the cache")
    e.add_argument("--spec-calibration", action="store_true",
                   help="correct the verify-cost profile online from the rounds' observed times "
                        "(auto policy) instead of planning from it as measured")
    add_attention_argument(e)
    add_overlap_argument(e)
    return p


def _prompts(args) -> list:
    from ..datasets import load_prompts

    prompts = load_prompts(args.prompts)
    return prompts[: args.num_prompts] if args.num_prompts else prompts


# ------------------------------------------------------------------------------ accept
def acceptance(engine, prompts, params_for, batch: int, progress: bool = False) -> dict:
    """Runs prompts through a drafted engine; returns tau and acceptance by position."""
    engine.reset_stats()
    engine.max_num_seqs = batch
    t0 = time.perf_counter()
    results = engine.generate(prompts, [params_for(i) for i in range(len(prompts))],
                              progress=progress)
    s = engine.stats
    return {"tau": s.tau, "rounds": s.rounds, "new_tokens": s.new_tokens,
            "acceptance_by_position": s.acceptance_by_position(),
            "per_request_tau": [r.stats.tau for r in results],
            "seconds": time.perf_counter() - t0}


def cmd_accept(args) -> dict:
    from .. import Engine, SamplingParams

    prompts = _prompts(args)
    engine = Engine(args.target, draft=args.draft, device=args.device, dtype=args.dtype,
                    progress=not args.quiet, max_num_seqs=args.batch,
                    tensor_parallel_size=args.tensor_parallel_size,
                    kv_cache_dtype=args.kv_cache_dtype)
    res = acceptance(engine, prompts, lambda i: SamplingParams(
        max_tokens=args.max_new_tokens, temperature=args.temperature,
        seed=args.seed + i if args.temperature > 0 else None), args.batch, not args.quiet)
    res.update(draft=str(args.draft), prompts=args.prompts, num_prompts=len(prompts),
               temperature=args.temperature, max_new_tokens=args.max_new_tokens,
               device=str(engine.device), dtype=str(engine.dtype),
               kv_cache_dtype=str(engine.kv_dtype))
    name = args.name or f"accept_{Path(str(args.draft)).name}_{Path(args.prompts).stem}_t{args.temperature:g}"
    _write(args.out, name, res)
    plot_acceptance({name: res["acceptance_by_position"]}, Path(args.out) / f"{name}.png")
    print(f"tau {res['tau']:.3f} over {res['rounds']} rounds; acceptance by position: "
          + " ".join(f"{a:.2f}" for a in res["acceptance_by_position"]))
    return res


def plot_acceptance(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, acc in curves.items():
        ax.plot(range(1, len(acc) + 1), acc, marker="o", label=label)
    ax.set_xlabel("draft position j in the block")
    ax.set_ylabel("P(d_j accepted)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------ e2e
def throughput(engine, prompts, max_new_tokens: int, concurrency: int,
               progress: bool = False, stop_at_eos: bool = False) -> tuple[dict, list[list[int]]]:
    """Greedy answers (fixed-length unless `stop_at_eos`) with `concurrency` requests in flight."""
    from .. import SamplingParams

    engine.max_num_seqs = concurrency
    engine.reset_stats()
    engine.generate(prompts[:min(len(prompts), concurrency)],
                    SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
    engine.reset_stats()
    _sync(engine)
    t0 = time.perf_counter()
    results = engine.generate(prompts, SamplingParams(max_tokens=max_new_tokens,
                                                      ignore_eos=not stop_at_eos),
                              progress=progress)
    _sync(engine)
    dt = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in results)
    # With fewer prompts than `concurrency`, at most len(prompts) are ever in flight, and a
    # batch that only drains: the row says so (`requests`), the printed line too.
    return ({"concurrency": concurrency, "requests": len(prompts), "tokens": tokens, "seconds": dt,
             "tokens_per_second": tokens / dt, "tau": engine.stats.tau,
             "mean_batch": engine.stats.mean_batch},
            [r.token_ids for r in results])


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        import torch

        torch.cuda.synchronize(engine.device)


def cmd_e2e(args) -> dict:
    from .. import Engine

    prompts = _prompts(args)
    drafts = [("ar", None, "fixed")] if not args.no_ar else []
    for spec in args.draft:
        name, _, path = spec.partition("=")
        drafts += [(f"{name}-{policy}" if len(args.spec_policy) > 1 else name, path or name,
                    policy) for policy in args.spec_policy]
    rows, outputs = [], {}
    for name, path, policy in drafts:
        engine = Engine(args.target, draft=path, device=args.device, dtype=args.dtype,
                        progress=not args.quiet, max_num_seqs=max(args.concurrency),
                        spec_policy=policy, num_speculative_tokens=args.num_speculative_tokens,
                        reprofile=args.reprofile and path is not None,
                        spec_calibration=args.spec_calibration, attention=args.attention,
                        overlap=args.overlap,
                        tensor_parallel_size=args.tensor_parallel_size,
                        kv_cache_dtype=args.kv_cache_dtype)
        prompt_ids = [engine.encode_prompt(p) for p in prompts]  # for the tie check of differences
        for c in args.concurrency:
            row, toks = throughput(engine, prompts, args.max_new_tokens, c, not args.quiet,
                                   args.stop_at_eos)
            row.update(mode=name)
            if path is not None:
                s = engine.stats
                row.update(spec_policy=policy, path=s.path(),
                           verify_lengths={str(k): v for k, v in sorted(s.verify_lengths.items())},
                           calibrated_costs=engine.calibrated_costs())
            if name != "ar" and ("ar", c) in outputs:
                row["vs_ar_greedy"] = compare_with_ties(engine.model_dir, prompt_ids,
                                                        outputs[("ar", c)], toks)
            outputs[(name, c)] = toks
            rows.append(row)
            capped = f" (only {len(prompts)} requests)" if len(prompts) < c else ""
            print(f"{name:>8} c={c:<3} {row['tokens_per_second']:9.1f} tok/s  tau {row['tau']:.2f}"
                  f"  batch {row['mean_batch']:.1f}" + capped
                  + (f"  drafts verified {format_lengths(engine.stats.verify_lengths)}"
                     if path is not None else "")
                  + (f"  vs AR: {describe(row['vs_ar_greedy'])}" if "vs_ar_greedy" in row else ""),
                  file=sys.stderr)
            res = _e2e_result(args, prompts, rows, engine)
            _write(args.out, args.name or f"e2e_{engine.device.type}", res)  # after every row
        engine.close()
        del engine
    return res


def _e2e_result(args, prompts, rows, engine) -> dict:
    for row in rows:
        base = next((r for r in rows if r["mode"] == "ar" and r["concurrency"] == row["concurrency"]),
                    None)
        row["speedup_vs_ar"] = row["tokens_per_second"] / base["tokens_per_second"] if base else None
    return {"rows": rows, "prompts": args.prompts, "num_prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens, "stop_at_eos": args.stop_at_eos,
            "device": str(engine.device),
            "tensor_parallel_size": engine.config.tensor_parallel_size,
            "dtype": str(engine.dtype), "kv_cache_dtype": str(engine.kv_dtype)}


def _write(out: str, name: str, payload: dict) -> None:
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path / (name + '.json')}", file=sys.stderr)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    {"accept": cmd_accept, "e2e": cmd_e2e}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
