#!/usr/bin/env python
"""Tensor parallelism through the engine: tokens/s and step time at TP = 1, 2, ... on a random
Qwen3-shaped target, each size's outputs compared token for token with the first size's.

The target is a checkpoint of random weights written once (safetensors, in the engine's dtype:
fp32 on the CPU, bf16 on CUDA), so every rank loads its shard through the engine's own path
(workers read the target directory). Its tensors are exactly the ones `TargetModel.from_store`
asks for (recorded on the meta device), under their Hugging Face names, drawn as step_table.py
draws them. With --draft, a random DSpine draft (step_table.py's layout for the shape: 5 layers
for Qwen3-8B) drafts 16-token blocks under the fixed policy, so a step is a speculative round;
the draft runs on rank 0 only. The tokenizer is the default model's (ids past its vocabulary
decode to nothing).

Engines for every TP size are built first, then timed in alternation (trial by trial, median
kept), so a drifting machine moves all alike. Per TP size and batch: tokens/s, ms per step (wall
time / engine steps), the step's all-reduce time (2 a layer, each over the step's rows x hidden
in the dtype, timed alone on a group of that size: gloo on the CPU, NCCL on GPUs) and on CUDA
the per-GPU weight-read floor of a step ((target bytes / TP + draft bytes) / the copy bandwidth
measured in the same run).

    python benchmarks/tp_bench.py                       # CPU, gloo: TP 1 and 2, the small shape
    python benchmarks/tp_bench.py --device cuda --tp 1 2 4 --batches 1 8 32 --draft
                                                        # GPUs, NCCL: the Qwen3-8B shape

Writes DIR/tp_<device>.json and updates the "tp-<device>" table in docs/BENCHMARKS.md (not with
--no-doc).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
from common import RESULTS, markdown_table, run_info, save_json, update_doc_section  # noqa: E402
from dspine_engine.engine.engine import resolve_dtype  # noqa: E402
from step_table import (DSPINE_5L, QWEN3_8B, TINY_DRAFT, RandomWeights,  # noqa: E402
                        draft_config, measure_bandwidth, random_draft)

# The CPU's shape: small enough for 2 shared cores, 8 layers deep so the all-reduces add up.
SMALL = dict(QWEN3_8B, vocab_size=49152, hidden_size=512, intermediate_size=1536,
             num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=1024)
SHAPES = {"small": (SMALL, TINY_DRAFT), "qwen3-8b": (QWEN3_8B, DSPINE_5L)}
PROMPTS = ["Explain tensor parallelism.", "Write a poem about the sea.", "def quicksort(xs):",
           "List five prime numbers:", "Summarise the plot of Hamlet.", "Why is the sky blue?",
           "Translate 'good morning' into French.", "What is a KV cache?"]


# --------------------------------------------------------------------------------------------
# Random checkpoints
# --------------------------------------------------------------------------------------------

class _Recorder:
    """A weight store on the meta device that notes every tensor the loader asks for."""

    def __init__(self):
        self.shapes: dict[str, tuple] = {}

    def has(self, name: str) -> bool:
        return RandomWeights.has(self, name)  # the same tensors as step_table.py's models

    def get(self, name: str, shape: tuple) -> torch.Tensor:
        self.shapes[name] = tuple(shape)
        return torch.empty(shape, device="meta")


def write_random_target(out: Path, shape: dict, dtype, device) -> Path:
    """config.json, random weights (drawn on `device`, saved in `dtype`) and the default model's
    tokenizer in `out`."""
    from tiny_models import copy_tokenizer

    from dspine_engine.models.config import TargetConfig
    from dspine_engine.models.default_model import default_model_dir
    from dspine_engine.models.target import target_class
    from dspine_engine.models.weights import save_checkpoint

    cfg = TargetConfig.from_dict(shape)
    recorder = _Recorder()
    target_class(cfg).from_store(cfg, recorder, torch.device("meta"), dtype)
    draw = RandomWeights(device, dtype)
    tensors = {name: draw.get(name, s).cpu() for name, s in recorder.shapes.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(tensors, out, max_shard_bytes=4 << 30)
    (out / "config.json").write_text(json.dumps(dict(shape, model_type="qwen3"), indent=2))
    copy_tokenizer(default_model_dir(progress=False), out)
    return out


def write_random_draft(out: Path, shape: dict, spec: dict, dtype, device) -> Path:
    from dspine_engine.models.config import TargetConfig

    random_draft(draft_config(TargetConfig.from_dict(shape), spec), device, dtype).save(out, dtype)
    return out


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------

def _allreduce_rank(rank: int, world: int, store: str, backend: str, rows: int, hidden: int,
                    dtype, reps: int, out) -> None:
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group(backend, store=dist.FileStore(store, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    x = torch.randn(rows, hidden, device=device).to(dtype)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    for _ in range(max(1, reps // 10)):
        dist.all_reduce(x)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x)
    sync()
    if rank == 0:
        out.put((time.perf_counter() - t0) / reps)
    dist.destroy_process_group()


def allreduce_seconds(world: int, backend: str, rows: int, hidden: int, dtype,
                      reps: int = 200) -> float:
    """Seconds per all-reduce of [rows, hidden] on a fresh group of `world` processes."""
    import torch.multiprocessing as mp

    out = mp.get_context("spawn").SimpleQueue()
    store = tempfile.mktemp(prefix="tp-bench-store-")
    mp.start_processes(_allreduce_rank, args=(world, store, backend, rows, hidden, dtype, reps,
                                              out), nprocs=world, start_method="spawn")
    return out.get()


def timed_run(engine, prompts, tokens: int):
    """Wall seconds, engine steps and the token ids of one generate call."""
    from dspine_engine import SamplingParams
    from dspine_engine.distributed.layout import available_ranks

    if engine.device.type == "cpu":  # the cores shared among the ranks, set before each run
        cores = available_ranks(engine.device)[0]
        torch.set_num_threads(max(1, cores // engine.config.tensor_parallel_size))
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    seconds = time.perf_counter() - t0
    steps = max(r.stats.rounds for r in out)  # sequences of one call step together
    return seconds, steps, [r.token_ids for r in out]


def weight_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="target shape (default: small on the CPU, qwen3-8b on CUDA)")
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="TP sizes, the first the "
                   "reference the others' outputs are compared with")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--draft", action="store_true",
                   help="speculative rounds with a random DSpine draft (fixed policy)")
    p.add_argument("--workdir", default=None, help="where the random checkpoints go (default: "
                   "a temporary directory)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--no-doc", action="store_true", help="leave docs/BENCHMARKS.md as it is")
    return p.parse_args(argv)


def build_engines(args, target_dir: Path, draft_dir: Path | None, dtype) -> dict:
    from dspine_engine import Engine

    max_batch = max(args.batches)
    kv_tokens = max_batch * (128 + args.tokens + 32) + 1024  # prompts, answers, one block
    return {tp: Engine(target_dir, draft=draft_dir, device=args.device, dtype=dtype,
                       progress=False, max_num_seqs=max_batch, kv_cache_tokens=kv_tokens,
                       tensor_parallel_size=tp, spec_policy="fixed")
            for tp in args.tp}


def main(argv=None) -> int:
    args = parse_args(argv)
    shape_name = args.shape or ("small" if args.device == "cpu" else "qwen3-8b")
    shape, draft_spec = SHAPES[shape_name]
    device = torch.device(args.device)
    dtype = resolve_dtype(None, device)  # the engine's own: fp32 on the CPU, bf16 on CUDA
    info = run_info(args.device)  # before any engine: the thread count it names is every core
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tp-bench-"))
    target_dir = write_random_target(work / "target", shape, dtype, device)
    draft_dir = (write_random_draft(work / "draft", shape, draft_spec, dtype, device)
                 if args.draft else None)
    engines = build_engines(args, target_dir, draft_dir, dtype)
    ceilings = measure_bandwidth(device) if args.device == "cuda" else {}
    target_bytes = weight_bytes(target_dir)
    draft_bytes = weight_bytes(draft_dir) if draft_dir else 0
    rows_per_seq = draft_spec["block_size"] if args.draft else 1
    backend = "gloo" if args.device == "cpu" else "nccl"

    rows = []
    for b in args.batches:
        prompts = (PROMPTS * (b // len(PROMPTS) + 1))[:b]
        runs = {tp: [] for tp in args.tp}
        outputs = {}
        for eng in engines.values():  # warm-up
            timed_run(eng, prompts, 4)
        for _ in range(args.trials):
            for tp, eng in engines.items():
                seconds, steps, outputs[tp] = timed_run(eng, prompts, args.tokens)
                runs[tp].append((seconds, steps))
        reference = outputs[args.tp[0]]
        for tp in args.tp:
            seconds = statistics.median(s for s, _ in runs[tp])
            steps = statistics.median(n for _, n in runs[tp])
            step_reduce = 0.0
            if tp > 1:
                step_reduce = 2 * shape["num_hidden_layers"] * allreduce_seconds(
                    tp, backend, b * rows_per_seq, shape["hidden_size"], dtype)
            row = dict(batch=b, tp=tp, tokens=b * args.tokens, seconds=[s for s, _ in runs[tp]],
                       tokens_per_second=b * args.tokens / seconds,
                       step_ms=1e3 * seconds / steps, steps=steps,
                       step_allreduce_ms=1e3 * step_reduce,
                       identical=outputs[tp] == reference)
            if ceilings:
                row["floor_ms"] = 1e3 * (target_bytes / tp + draft_bytes) / (
                    ceilings["copy_GBps"] * 1e9)
            rows.append(row)
            print(row, file=sys.stderr)
    for eng in engines.values():
        eng.close()

    payload = dict(info, shape=shape_name, target=shape, draft=draft_spec if args.draft else None,
                   target_bytes=target_bytes, draft_bytes=draft_bytes, ceilings=ceilings,
                   trials=args.trials, rows=rows)
    print(f"wrote {save_json(f'tp_{args.device}', payload, Path(args.out))}", file=sys.stderr)
    header = ["batch", "TP", "tok/s", "ms / step", "all-reduce ms / step"]
    header += ["floor ms / step (per GPU)"] if ceilings else []
    header += [f"= TP={args.tp[0]}"]
    table = markdown_table(header, [
        [r["batch"], r["tp"], r["tokens_per_second"], r["step_ms"], r["step_allreduce_ms"]]
        + ([r["floor_ms"]] if ceilings else []) + ["yes" if r["identical"] else "no"]
        for r in rows])
    table += (f"\n\nShape {shape_name} ({target_bytes / 1e9:.2f} GB of target weights"
              + (f", a {draft_spec['num_layers']}-layer DSpine draft of {draft_bytes / 1e9:.2f} GB"
                 f", {rows_per_seq}-token rounds" if args.draft else ", autoregressive")
              + f"); {args.tokens} new tokens a request; medians of {args.trials} trials.")
    if not args.no_doc:
        update_doc_section(f"tp-{args.device}", table, info)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
