"""Training throughput of DSpine drafts and their DFlash twins: seconds per optimizer step,
sequence tokens/s, blocks/s and achieved TFLOP/s (the trainer's own FLOP count), for each
draft alone and both side by side on one target capture, on the same data in one run.

    python benchmarks/train_speed.py --data data.jsonl [--batch-size 64] [--steps 20]

Writes train_speed_<device>.json. Configurations: the default 5-layer draft (target-shaped
layers; the one docs/TRAINING.md section 5 timed before the CE change) and the shipped shape
(5 layers, MLP 768). Batches come from the data file in the trainer's own order.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, run_info  # noqa: E402

CONFIGS = {"default-5L": {}, "shipped-5L-mlp768": {"intermediate": 768}}


def time_steps(trainer, warmup: int, steps: int) -> dict:
    for _ in range(warmup):
        trainer.train_step()
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    sync()
    t0, tokens, blocks, flops = time.perf_counter(), 0, 0, 0.0
    for _ in range(steps):
        trainer.train_step()
        tokens += trainer.last_tokens
        blocks += int(trainer.runs[0].last_counts["blocks"])
        flops += trainer.last_flops
    sync()
    secs = time.perf_counter() - t0
    out = {"s_per_step": secs / steps, "tokens_per_s": tokens / secs, "blocks_per_s": blocks / secs,
           "tflops": flops / secs / 1e12,
           "params_m": [round(r.num_parameters / 1e6, 2) for r in trainer.runs]}
    if trainer.device.type == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated(trainer.device) / 2**30
    return out


def main(argv=None) -> int:
    from dspine_engine.cli.train import _ablation_twin
    from dspine_engine.engine.engine import resolve_device
    from dspine_engine.models.default_model import resolve_model_path
    from dspine_engine.models.dspine import DSpineDraft
    from dspine_engine.models.target import TargetModel
    from dspine_engine.train.data import read_samples
    from dspine_engine.train.draft_init import new_draft_config
    from dspine_engine.train.trainer import SequenceData, TrainConfig, Trainer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="JSONL from `dspine-train data`")
    ap.add_argument("--target", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = TargetModel.load(resolve_model_path(args.target), device, dtype, progress=False)
    data = SequenceData(read_samples(Path(args.data)), 2048)
    cfg = TrainConfig(steps=10**6, batch_size=args.batch_size, save_every=10**9, eval_batches=0)
    rows = []
    for name, shape in CONFIGS.items():
        dspine = DSpineDraft(new_draft_config(target.config, **shape)).init_weights()
        for mode in ("dspine", "dflash", "side-by-side"):
            draft = dspine if mode != "dflash" else _ablation_twin(dspine)
            twin = (_ablation_twin(dspine), Path("/nonexistent")) if mode == "side-by-side" else None
            trainer = Trainer(target, draft, data, None, cfg, Path("/nonexistent"), ablation=twin)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            row = {"config": name, "mode": mode, "batch": args.batch_size,
                   **time_steps(trainer, args.warmup, args.steps)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
            del trainer
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "h200" if device.type == "cuda" else "cpu"
    (out / f"train_speed_{tag}.json").write_text(json.dumps(
        {"info": run_info(str(device)), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
