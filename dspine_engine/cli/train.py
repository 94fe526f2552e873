"""dspine-train: make training data from a target model and train a DSpine (or DFlash) draft."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

DESCRIPTION = """\
Train a DSpine draft model for a target model, in two steps (and an optional first one):

  prompts  builds a diverse prompt corpus offline (code tasks from installed third-party
        packages' docstrings, math word problems, writing, extraction, roleplay, STEM,
        multi-turn, ...) and a held-out benchmark-like set; never HumanEval, MT-Bench or the
        standard library's docstrings.
  data  the target writes the training data: its own answers (greedy by default) to prompts
        from a JSONL file, or to user messages it writes itself (Magpie-style: the chat
        template is cut where a user turn starts and the target samples the user message).
        Token ids are stored, so nothing is re-tokenised. Re-running the same command
        continues an interrupted file.
  fit   trains the draft on that data, capturing the frozen target's tapped hidden states
        online. Writes OUT/config.json + OUT/model*.safetensors (load with
        Engine(target, draft=OUT) or dspine-generate --draft OUT) and OUT/train_state/ for
        --resume. --ablation dflash trains the same architecture without injection and
        transition (the DFlash baseline) under the same budget; --ablation-out DIR trains
        that baseline side by side with the DSpine draft, on the same batches.
  merge joins data files from several generators (one per GPU or process), dropping
        repeated prompts.

The target defaults to SmolLM2-135M-Instruct (fetched once into $DSPINE_CACHE). See
docs/TRAINING.md for the losses, masks and recommended GPU commands."""

EPILOG = """\
examples:
  dspine-train prompts --out prompts.jsonl --num 300000 --heldout-out heldout.jsonl
  dspine-train data --out data.jsonl --num 20000 --max-minutes 9
  dspine-train data --prompts prompts.jsonl --out data.jsonl
  dspine-train fit --data data.jsonl --out runs/dspine --steps 4000 --max-minutes 9 --resume
  dspine-train fit --data data.jsonl --out runs/dflash --steps 4000 --ablation dflash --resume
"""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def _steps(text: str) -> int:
    if text == "auto":
        return 0
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError("steps must be >= 0 or 'auto'")
    return n


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None,
                   help="target: HF model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop cleanly (saving everything) before this many minutes; run the same "
                        "command again (with --resume for fit) to continue")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling, data order, anchors")
    p.add_argument("--quiet", action="store_true", help="no progress bars while loading")


def _data_parser(sub) -> None:
    p = sub.add_parser("data", help="generate training data with the target",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Write a JSONL of {prompt_ids, response_ids} where the "
                                   "responses are the target's own answers.")
    _common(p)
    p.add_argument("--out", required=True, help="output JSONL (appended to / resumed if present)")
    p.add_argument("--num", type=int, default=None,
                   help="prompts the file should hold answers to (a multi-turn prompt counts "
                        "once; default: every prompt of --prompts; required for "
                        "self-generation)")
    p.add_argument("--prompts", default=None,
                   help="JSONL of prompts: "
                        "{prompt|instruction|question|text}, {turns: [q1, q2, ...]} (every turn "
                        "answered by the target, one record per turn), {messages|conversations} "
                        "(cut after the last user turn), {prompt_ids} or {magpie: true} (the "
                        "target writes that user prompt); without it the target writes them all")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="answer length cap")
    p.add_argument("--answer-temperature", type=float, default=0.0,
                   help="temperature of the answers (0 = greedy, the decoding to accelerate)")
    p.add_argument("--sampled-share", type=float, default=0.0,
                   help="share of the prompts (chosen per index from --seed) answered at "
                        "--sampled-temperature instead, for sampled decoding; each record "
                        "stores its temperature")
    p.add_argument("--sampled-temperature", type=float, default=1.0,
                   help="temperature of the --sampled-share answers")
    p.add_argument("--user-temperature", type=float, default=1.0,
                   help="temperature of self-generated user prompts (diversity)")
    p.add_argument("--user-top-p", type=float, default=1.0, help="top-p of user prompts")
    p.add_argument("--user-max-tokens", type=int, default=256,
                   help="longest self-generated user prompt; longer ones are dropped")
    p.add_argument("--keep-truncated", action="store_true",
                   help="keep user prompts cut at --user-max-tokens (for tiny test models that "
                        "never end a turn)")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="sequences the engine decodes concurrently (new requests are added as "
                        "others finish, so the batch stays full)")
    p.add_argument("--admission-batch", type=int, default=None,
                   help="new requests join the batch once this many seats are free, in one "
                        "prefill step (default: max-num-seqs / 8; each prefill step pauses all "
                        "decoding, so fewer, larger ones are faster)")
    p.add_argument("--dtype", default="auto", help="target dtype (auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="run the engine's forwards eagerly on CUDA")
    p.add_argument("--kv-cache-tokens", type=int, default=None,
                   help="target KV pool size in tokens (default: the engine's; set it when "
                        "several generators share one GPU)")


def _prompts_parser(sub) -> None:
    from ..train.prompts import DEFAULT_MIX

    p = sub.add_parser("prompts", help="build a training-prompt corpus (+ a held-out set)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Build a de-duplicated, shuffled JSONL of prompts for "
                                   "`dspine-train data --prompts`, offline, from the docstrings "
                                   "of installed third-party packages (read with ast, never "
                                   "imported) and templated task families; deterministic for a "
                                   "seed and an environment. Families: code, explain "
                                   "(third-party docstrings), math, arithmetic, logic, writing, "
                                   "extraction, roleplay, stem, humanities, chat, multiturn "
                                   "(templates), pyfunc (HumanEval-shaped completion of small "
                                   "self-contained functions written here) and openended (2-4-turn "
                                   "constrained writing/roleplay/reasoning/explanation/extraction "
                                   "conversations whose later turns rework the previous answer). "
                                   "docs/TRAINING.md describes them and the exclusions.")
    p.add_argument("--out", required=True, help="output JSONL of training prompts")
    p.add_argument("--num", type=int, default=200_000, help="training prompts to write")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the training corpus (a new seed gives fresh prompts)")
    p.add_argument("--mix", default=None,
                   help="family shares, e.g. code=0.4,math=0.2 (the other families share the rest "
                        "in proportion to their defaults; 0 drops one). Defaults: " +
                        ",".join(f"{k}={v:g}" for k, v in DEFAULT_MIX.items()))
    p.add_argument("--magpie-share", type=float, default=0.0,
                   help="share of {magpie: true} lines: user prompts the target writes itself "
                        "when `dspine-train data` answers the file")
    p.add_argument("--heldout-out", default=None,
                   help="also write the held-out benchmark-like set here (code completion from "
                        "reserved modules + two-turn conversations from reserved templates)")
    p.add_argument("--heldout-num", type=int, default=1000, help="held-out prompts to write")
    p.add_argument("--heldout-seed", type=int, default=0,
                   help="seed of the held-out set (keep it fixed across runs to compare them)")
    p.add_argument("--exclude", action="append", default=None,
                   help="a prompts JSONL (e.g. the held-out set of an earlier run) whose prompts "
                        "and shown code no training prompt may repeat (repeatable)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes reading the package sources (None: all cores)")
    p.add_argument("--site-dir", action="append", default=None,
                   help="read third-party sources from this directory instead of the "
                        "interpreter's site-packages/dist-packages (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _fit_parser(sub) -> None:
    from ..train.trainer import TrainConfig

    d = TrainConfig()
    p = sub.add_parser("fit", help="train a draft on generated data",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Train a DSpine draft (or its DFlash ablation) on data from "
                                   "`dspine-train data`.")
    _common(p)
    p.add_argument("--data", required=True, help="JSONL written by `dspine-train data`")
    p.add_argument("--out", required=True, help="output directory (the draft + train state)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run saved in --out (its saved settings win, except "
                        "--max-minutes/--save-every/--log-every/--ce-chunk/--eval-batches); "
                        "starts a new run when --out holds none")
    p.add_argument("--ablation", choices=["dflash"], default=None,
                   help="dflash: no injection, no transition, loss = final CE only")
    p.add_argument("--ablation-out", default=None, metavar="DIR",
                   help="also train the DFlash twin of the draft (same init, batches, steps "
                        "and flags; no injection, no transition) into DIR, side by side in "
                        "this process on the same target capture: the equal-budget baseline")
    p.add_argument("--ablation-draft", default=None, metavar="DIR",
                   help="with --ablation-out and --draft: start the DFlash twin from this "
                        "draft directory (the previous run's twin, so both drafters accumulate "
                        "the same budget) instead of from the DSpine draft's shared weights")
    p.add_argument("--eval-data", default=None, metavar="FILE",
                   help="held-out JSONL (from `dspine-train data` on held-out prompts) scored "
                        "at every checkpoint; OUT keeps the draft with the best held-out "
                        "tau_walk (default: the last records of --data)")
    g = p.add_argument_group("a new draft (ignored with --resume of a saved run)")
    g.add_argument("--init", action="store_true",
                   help="size a fresh draft for the target (the default without --draft)")
    g.add_argument("--draft", default=None, help="start from this draft directory instead")
    g.add_argument("--init-from-target", action="store_true",
                   help="copy the last N target layers' attention/MLP/norm weights into the N "
                        "draft layers (shapes must match the target's)")
    g.add_argument("--layers", type=int, default=5, help="draft layers")
    g.add_argument("--heads", type=int, default=None, help="attention heads (default: target's)")
    g.add_argument("--kv-heads", type=int, default=None, help="KV heads (default: target's)")
    g.add_argument("--head-dim", type=int, default=None, help="head dim (default: target's)")
    g.add_argument("--intermediate", type=int, default=None,
                   help="MLP intermediate size (default: target's)")
    g.add_argument("--block-size", type=int, default=16, help="block size B (drafts B-1 tokens)")
    g.add_argument("--sliding-window", type=int, default=8192,
                   help="draft attention window over the context (0 = none)")
    g.add_argument("--mask-token-id", type=int, default=None,
                   help="embed MASK as this target token (default: a learned mask embedding)")
    g.add_argument("--rank", type=int, default=256, help="transition rank r")
    g.add_argument("--top-k", type=int, default=8, help="transition candidates per position")
    g.add_argument("--target-layers", type=_ints, default=None,
                   help="tapped target layers, e.g. 1,7,14,20,27 (default: one per draft layer, "
                        "evenly spaced as in DFlash)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=_steps, default=d.steps,
                   help="optimizer steps (default: --epochs passes over the data); 'auto' (or "
                        "0): as many as fit --max-minutes, measured over the first steps, so "
                        "the learning-rate schedule completes inside the budget")
    t.add_argument("--epochs", type=float, default=d.epochs, help="passes when --steps is unset")
    t.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per micro-batch")
    t.add_argument("--grad-accum", type=int, default=d.grad_accum,
                   help="micro-batches per optimizer step")
    t.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    t.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio,
                   help="the cosine decays to lr * this")
    t.add_argument("--warmup", type=float, default=d.warmup,
                   help="warm-up: a fraction of the steps, or a step count when >= 1")
    t.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help="AdamW weight decay (matrices only)")
    t.add_argument("--clip", type=float, default=d.clip, help="gradient-norm clipping")
    t.add_argument("--blocks-per-seq", type=int, default=d.blocks_per_seq,
                   help="random anchors (blocks) per sequence, all inside the response")
    t.add_argument("--max-len", type=int, default=d.max_len,
                   help="cut sequences (prompt + response) at this many tokens")
    t.add_argument("--gamma", type=float, default=d.gamma,
                   help="position weight exp(-(j-1)/gamma) (default: 7 * block size / 16)")
    t.add_argument("--layer-weight", type=float, default=d.layer_weight,
                   help="weight of the layer-wise output-embedding CE (split evenly over layers)")
    t.add_argument("--transition-weight", type=float, default=d.transition_weight,
                   help="weight of the transition CE")
    t.add_argument("--soft-targets", type=float, default=d.soft_targets, metavar="ALPHA",
                   help="train the final and transition outputs on (1 - ALPHA) x the data's "
                        "token + ALPHA x the target's own next-token distribution (one more "
                        "forward-only vocabulary GEMM per term); what sampled (T > 0) "
                        "acceptance rewards. 0: the data's token alone")
    t.add_argument("--ce-chunk", type=int, default=d.ce_chunk,
                   help="rows per vocabulary-logits chunk (memory vs. speed)")
    t.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="train in fp32 on CUDA too (default: bf16 autocast, fp32 master weights)")
    t.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint period (steps)")
    t.add_argument("--log-every", type=int, default=d.log_every,
                   help="log period (steps) for the bar and OUT/train_log.jsonl")
    t.add_argument("--eval-batches", type=int, default=d.eval_batches,
                   help="held-out batches scored at each checkpoint")
    t.add_argument("--eval-fraction", type=float, default=0.02,
                   help="share of the data (its last records, at most 256) held out")


def _merge_parser(sub) -> None:
    p = sub.add_parser("merge", help="merge data files, dropping repeated prompts",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Concatenate JSONL files from several `dspine-train data` "
                                   "runs (e.g. one per GPU or process) in the order given, keep "
                                   "the first record of every prompt and renumber the indices.")
    p.add_argument("parts", nargs="+", help="data files, in order")
    p.add_argument("--out", required=True, help="merged JSONL (replaced atomically)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspine-train", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _prompts_parser(sub)
    _data_parser(sub)
    _fit_parser(sub)
    _merge_parser(sub)
    return p


# ------------------------------------------------------------------------------------- data
def run_data(args) -> int:
    import datetime

    from .. import Engine
    from ..engine.engine import resolve_device
    from ..prompt_file import load_prompts
    from ..train.data import DataGenerator, GenerationConfig, merge_samples
    from ..train.distributed import init_from_env, shutdown

    prompts = load_prompts(Path(args.prompts)) if args.prompts else None
    if prompts is None and args.num is None:
        print("dspine-train data: give --num (records to self-generate) or --prompts",
              file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    # torchrun: rank r answers prompts r, r + W, ... into its own shard; rank 0 merges them.
    ctx = init_from_env(device.type, backend="gloo", timeout=datetime.timedelta(days=1))
    device = ctx.device(device)
    out, total = Path(args.out), args.num if args.num is not None else len(prompts)
    num = len(ctx.shard(range(total)))  # this rank's share of the records
    if ctx.active:
        out = out.with_name(f"{out.name}.rank{ctx.rank}")
        prompts = ctx.shard(prompts) if prompts is not None else None
    admission = args.admission_batch or max(1, args.max_num_seqs // 8)
    engine = Engine(args.target, device=device, dtype=args.dtype,
                    max_num_seqs=args.max_num_seqs, cuda_graphs=args.cuda_graphs,
                    kv_cache_tokens=args.kv_cache_tokens, admission_batch=admission,
                    progress=not args.quiet)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens,
                           answer_temperature=args.answer_temperature,
                           sampled_share=args.sampled_share,
                           sampled_temperature=args.sampled_temperature,
                           user_temperature=args.user_temperature, user_top_p=args.user_top_p,
                           user_max_tokens=args.user_max_tokens,
                           keep_truncated=args.keep_truncated,
                           seed=args.seed + 1_000_033 * ctx.rank)  # ranks draw apart
    done = DataGenerator(engine, out, cfg).run(num, prompts, args.max_minutes)
    print(f"{out}: {done} records", file=sys.stderr)
    if ctx.active:
        ctx.barrier()
        if ctx.is_main:
            shards = [Path(args.out).with_name(f"{Path(args.out).name}.rank{r}")
                      for r in range(ctx.world)]
            counts = merge_samples(shards, Path(args.out))
            print(f"{args.out}: {counts['records']} records merged from {ctx.world} ranks "
                  f"({counts['duplicates_dropped']} repeated prompts dropped)", file=sys.stderr)
        shutdown(ctx)
    return 0


# ------------------------------------------------------------------------------------- fit
def _train_config(args):
    from ..train.trainer import TrainConfig

    return TrainConfig(**{f.name: getattr(args, f.name)
                          for f in dataclasses.fields(TrainConfig)})


def _new_draft(args, target):
    from ..models.dspine import DSpineDraft
    from ..train.draft_init import copy_target_layers, new_draft_config

    dflash = args.ablation == "dflash"
    if args.draft:
        draft = DSpineDraft.load(Path(args.draft), progress=not args.quiet)
        if dflash and (draft.config.injection or draft.config.transition):
            raise ValueError("--ablation dflash needs a draft without injection and transition")
        draft.config.check_target(target.config)
        return draft
    cfg = new_draft_config(target.config, layers=args.layers, heads=args.heads,
                           kv_heads=args.kv_heads, head_dim=args.head_dim,
                           intermediate=args.intermediate, block_size=args.block_size,
                           sliding_window=args.sliding_window, mask_token_id=args.mask_token_id,
                           rank=args.rank, top_k=args.top_k, target_layers=args.target_layers,
                           injection=not dflash, transition=not dflash)
    draft = DSpineDraft(cfg).init_weights(seed=args.seed)
    if args.init_from_target:
        used = copy_target_layers(draft, target)
        print(f"draft layers start from target layers {used}", file=sys.stderr)
    return draft


def _twin_config(config, architecture: str = "DSpineDraftModel"):
    """The DFlash form of a DSpine draft config: the same shape without injection and
    transition (the architecture name is the one thing a saved twin may spell differently)."""
    return dataclasses.replace(config, injection=False, transition=False,
                               architecture=architecture)


def _ablation_twin(draft):
    """The DFlash twin of ``draft``: the same config without injection and transition, and the
    same values for every parameter the two share (so both start from one init)."""
    from ..models.dspine import DSpineDraft

    if not (draft.config.injection or draft.config.transition):
        raise ValueError("--ablation-out needs a DSpine draft (with injection or transition) "
                         "to ablate")
    twin = DSpineDraft(_twin_config(draft.config))
    twin.load_state_dict(draft.state_dict(), strict=False)
    return twin


def _ablation_start(args, draft, target):
    """The twin's starting point: the previous run's twin (--ablation-draft), which must be
    the DFlash form of ``draft``'s architecture, or else ``draft``'s own shared weights."""
    from ..models.dspine import DSpineDraft

    if not args.ablation_draft:
        return _ablation_twin(draft)
    if not args.draft:
        raise ValueError("--ablation-draft continues a previous pair: pass that run's DSpine "
                         "draft as --draft too")
    twin = DSpineDraft.load(Path(args.ablation_draft), progress=not args.quiet)
    if twin.config != _twin_config(draft.config, twin.config.architecture):
        raise ValueError(f"--ablation-draft {args.ablation_draft} is not the DFlash twin of "
                         f"--draft {args.draft} (the configs differ beyond injection and "
                         "transition)")
    twin.config.check_target(target.config)
    return twin


def _resume_states(outs: list[Path], resume: bool):
    """The saved states of the runs in ``outs`` (all or none), or None for a fresh run."""
    import json

    from ..train.trainer import find_state

    dirs = [find_state(o) if resume else None for o in outs]
    for o, d in zip(outs, dirs):
        if d is None and (o / "train_state").exists() and not resume:
            raise ValueError(f"{o} already holds a run; pass --resume to continue it or "
                             "choose another output directory")
    if all(d is None for d in dirs):
        return None
    if any(d is None for d in dirs):
        raise ValueError("--resume: only some of the runs have a saved state: "
                         f"{[str(o) for o, d in zip(outs, dirs) if d is None]}")
    return dirs, [json.loads((d / "state.json").read_text()) for d in dirs]


def run_fit(args, t_start: float) -> int:
    from ..engine.engine import resolve_device, resolve_dtype
    from ..models.default_model import resolve_model_path
    from ..models.target import TargetModel
    from ..train.data import read_samples
    from ..train.distributed import init_from_env, shutdown
    from ..train.trainer import (SequenceData, Trainer, load_draft_for_resume, resume_config,
                                 split_records)

    outs = [Path(args.out)] + ([Path(args.ablation_out)] if args.ablation_out else [])
    if args.ablation_out and args.ablation:
        raise ValueError("--ablation-out trains the DFlash twin of a DSpine draft; drop "
                         "--ablation")
    cfg = _train_config(args)
    saved = _resume_states(outs, args.resume)
    if saved is not None:
        cfg, ignored = resume_config(saved[1][0]["config"], cfg)
        for item in ignored:
            print(f"--resume: ignoring {item}", file=sys.stderr)
    device = resolve_device(args.device)
    ctx = init_from_env(device.type)  # torchrun: one rank per GPU (or CPU process, gloo)
    device = ctx.device(device)
    say = print if ctx.is_main else (lambda *a, **k: None)
    dtype = resolve_dtype("bfloat16" if cfg.bf16 and device.type == "cuda" else "float32",
                          device)
    target = TargetModel.load(resolve_model_path(args.target), device, dtype,
                              progress=not args.quiet and ctx.is_main)
    records = read_samples(Path(args.data))
    if args.eval_data:
        train_recs, eval_recs = records, read_samples(Path(args.eval_data))
    else:
        train_recs, eval_recs = split_records(records, args.eval_fraction)
    data_info = {"path": str(Path(args.data).resolve()), "records": len(records)}
    if saved is not None and saved[1][0].get("data") != data_info:
        say(f"--resume: the data differs from the saved run's ({saved[1][0].get('data')})",
              file=sys.stderr)
    if saved is not None:
        draft = load_draft_for_resume(outs[0])
        twin = load_draft_for_resume(outs[1]) if args.ablation_out else None
    else:
        draft = _new_draft(args, target)
        twin = _ablation_start(args, draft, target) if args.ablation_out else None
    # Block positions run up to max_len + B - 2: keep them inside the RoPE table.
    cfg.max_len = min(cfg.max_len, target.config.max_position_embeddings - draft.config.block_size)
    trainer = Trainer(target, draft, SequenceData(train_recs, cfg.max_len),
                      SequenceData(eval_recs, cfg.max_len), cfg, outs[0], data_info,
                      ablation=(twin, outs[1]) if twin is not None else None, dist_ctx=ctx)
    if saved is not None:
        trainer.load_state(*saved)
        say(f"resuming {outs[0]} at step {trainer.step}/{trainer.total_steps}", file=sys.stderr)
    if ctx.active:
        say(f"data parallel over {ctx.world} ranks: {trainer.batch_size} sequences per rank, "
            f"global batch {trainer.global_batch}", file=sys.stderr)
    for run in trainer.runs:
        c = run.draft.config
        say(f"{run.name} draft -> {run.out}: {c.num_layers} layers, "
              f"{run.num_parameters / 1e6:.1f}M parameters, block {c.block_size}, taps "
              f"{c.target_layer_ids}, injection {c.injection}, transition {c.transition}",
              file=sys.stderr)
    say(f"{len(trainer.data)} training sequences, {len(trainer.eval_data)} held-out",
        file=sys.stderr)
    try:
        finished = trainer.run(t_start)
    finally:
        shutdown(ctx)
    best = ", ".join(f"{r.name} best tau_walk {r.best:.3f} at step {r.best_step}"
                     for r in trainer.runs if r.best is not None)
    say(f"{'finished' if finished else 'paused'} at step {trainer.step}/{trainer.total_steps}"
          f"; draft in {outs[0]}" + (f"; {best}" if best else ""), file=sys.stderr)
    return 0


def run_merge(args) -> int:
    from ..train.data import merge_samples

    counts = merge_samples([Path(p) for p in args.parts], Path(args.out))
    print(f"{args.out}: {counts['records']} records, {counts['response_tokens']} response "
          f"tokens ({counts['duplicates_dropped']} repeated prompts dropped)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    t_start = time.monotonic()
    args = build_parser().parse_args(argv)
    try:
        if args.command == "prompts":
            from ..train.prompts import main_prompts

            return main_prompts(args)
        if args.command == "data":
            return run_data(args)
        if args.command == "merge":
            return run_merge(args)
        return run_fit(args, t_start)
    except (ValueError, FileNotFoundError) as e:
        print(f"dspine-train {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
