#!/usr/bin/env python
"""Tensor parallelism on the CPU: TP=1 vs TP=2 (gloo) on a small random Qwen3-shaped target.

Autoregressive greedy decoding (fixed length, EOS ignored) at each batch size, the two engines
timed in alternation (trial by trial, median kept) so a drifting machine moves both alike. TP=1
runs one process with every core; TP=2 runs two processes with half the cores each (the thread
count is process-wide, so it is set before each engine's run), so the
ratio says what the sharding and its collectives (two all-reduces per layer, one broadcast
and one logits gather per step) cost or gain on this machine, not on GPUs. The outputs of the
two are compared token for token.

    python benchmarks/tp_cpu.py [--batches 1 4] [--tokens 48] [--trials 3] [--out DIR]

Writes DIR/tp_cpu.json and updates the "tp-cpu" table in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
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

SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=1024)
PROMPTS = ["Explain tensor parallelism.", "Write a poem about the sea.", "def quicksort(xs):",
           "List five prime numbers:", "Summarise the plot of Hamlet.", "Why is the sky blue?",
           "Translate 'good morning' into French.", "What is a KV cache?"]


def _allreduce_rank(rank: int, store: str, hidden: int, reps: int, out) -> None:
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    x = torch.randn(1, hidden)
    for _ in range(reps // 10):
        dist.all_reduce(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x)
    if rank == 0:
        out.put((time.perf_counter() - t0) / reps)
    dist.destroy_process_group()


def allreduce_latency(hidden: int, reps: int = 500) -> float:
    """Seconds per gloo all-reduce of one decode row [1, hidden] between 2 processes: what
    each of a step's 2 x layers all-reduces costs here."""
    import torch.multiprocessing as mp

    out = mp.get_context("spawn").SimpleQueue()
    store = tempfile.mktemp(prefix="tp-bench-store-")
    mp.start_processes(_allreduce_rank, args=(store, hidden, reps, out), nprocs=2,
                       start_method="spawn")
    return out.get()


def timed_run(engine, prompts, tokens: int):
    from dspine_engine import SamplingParams
    from dspine_engine.distributed.layout import available_ranks

    cores = available_ranks(engine.device)[0]
    torch.set_num_threads(max(1, cores // engine.config.tensor_parallel_size))
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    return time.perf_counter() - t0, [r.token_ids for r in out]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()

    from dspine_engine import Engine
    from dspine_engine.models.default_model import default_model_dir
    from tiny_models import write_tiny_model

    info = run_info("cpu")  # before any engine: the thread count it names is every core
    model = write_tiny_model(Path(tempfile.mkdtemp()) / "qwen3", "qwen3",
                             default_model_dir(progress=False), **SHAPE)
    engines = {tp: Engine(model, progress=False, max_num_seqs=max(args.batches),
                          tensor_parallel_size=tp) for tp in (1, 2)}
    rows = []
    for b in args.batches:
        prompts = PROMPTS[:b]
        times = {1: [], 2: []}
        outputs = {}
        for tp, eng in engines.items():  # warm-up
            timed_run(eng, prompts, 4)
        for _ in range(args.trials):
            for tp, eng in engines.items():
                dt, outputs[tp] = timed_run(eng, prompts, args.tokens)
                times[tp].append(dt)
        t1, t2 = statistics.median(times[1]), statistics.median(times[2])
        n = b * args.tokens
        rows.append(dict(batch=b, tokens=n, tp1_tokens_per_second=n / t1,
                         tp2_tokens_per_second=n / t2, tp2_over_tp1=t1 / t2,
                         identical=outputs[1] == outputs[2], seconds={"tp1": times[1],
                                                                      "tp2": times[2]}))
        print(rows[-1], file=sys.stderr)
    for eng in engines.values():
        eng.close()
    latency = allreduce_latency(SHAPE["hidden_size"])
    payload = dict(info, shape=SHAPE, rows=rows, trials=args.trials,
                   allreduce_seconds=latency)
    print(f"wrote {save_json('tp_cpu', payload, Path(args.out))}", file=sys.stderr)
    table = markdown_table(
        ["batch", "TP=1 tok/s", "TP=2 tok/s", "TP=2 / TP=1", "outputs identical"],
        [[r["batch"], r["tp1_tokens_per_second"], r["tp2_tokens_per_second"],
          r["tp2_over_tp1"], "yes" if r["identical"] else "no"] for r in rows])
    table += (f"\n\nOne gloo all-reduce of a decode row [1, {SHAPE['hidden_size']}] between two "
              f"processes: {latency * 1e6:.0f} us (a step makes {2 * SHAPE['num_hidden_layers']} "
              "of them, plus one broadcast and one logits gather).")
    update_doc_section("tp-cpu", table, info)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
