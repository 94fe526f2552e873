"""Does a drafter accept in the engine what training promised? One data file, two numbers.

The trainer's held-out tau (teacher-forced, random anchors, argmax of the final head) and the
engine's tau (real rounds: anchors wherever the previous round stopped, the transition walk)
on the *same* prompts. Close numbers mean training and inference agree, so a lower tau on other
prompt sets is distribution shift; a large gap would point at a train/inference mismatch.

    python benchmarks/train_vs_engine_tau.py --data data.jsonl [--draft default] [--device cpu]

The data file is one written by `dspine-train data` (prompt_ids + the target's greedy
response_ids); the engine regenerates the responses greedily and reports how many match.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_info  # noqa: E402

from dspine_engine import Engine, SamplingParams  # noqa: E402
from dspine_engine.models.default_model import resolve_model_path  # noqa: E402
from dspine_engine.models.drafters import resolve_draft_path  # noqa: E402
from dspine_engine.models.dspine import DSpineDraft  # noqa: E402
from dspine_engine.models.target import TargetModel  # noqa: E402
from dspine_engine.train.data import read_samples  # noqa: E402
from dspine_engine.train.trainer import SequenceData, TrainConfig, Trainer  # noqa: E402


def trainer_tau(target_dir, draft_dir, records, device) -> dict:
    target = TargetModel.load(target_dir, device, torch.float32, progress=False)
    draft = DSpineDraft.load(draft_dir, device, torch.float32, progress=False)
    cfg = TrainConfig(batch_size=8, eval_batches=10**6, bf16=False)
    data = SequenceData(records, cfg.max_len)
    with tempfile.TemporaryDirectory() as scratch:  # evaluate() writes nothing there
        return Trainer(target, draft, data, data, cfg, Path(scratch)).evaluate()


def engine_tau(target_dir, draft_dir, records, device, max_new_tokens: int) -> dict:
    eng = Engine(target_dir, draft=draft_dir, device=device, progress=False, max_num_seqs=32)
    results = eng.generate([r["prompt_ids"] for r in records],
                           SamplingParams(max_tokens=max_new_tokens))
    same = sum(res.token_ids == rec["response_ids"][:len(res.token_ids)]
               for res, rec in zip(results, records))
    return {"tau": eng.stats.tau, "acceptance_by_position": eng.stats.acceptance_by_position(),
            "responses_identical_to_data": f"{same}/{len(records)}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="JSONL written by `dspine-train data`")
    ap.add_argument("--target", default=None, help="target (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--draft", default="default", help="draft directory or 'default'")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results", help="directory for the JSON")
    args = ap.parse_args(argv)
    records = read_samples(Path(args.data))
    target_dir, draft_dir = resolve_model_path(args.target), resolve_draft_path(args.draft)
    device = torch.device(args.device)
    out = Path(args.out)
    train = trainer_tau(target_dir, draft_dir, records, device)
    engine = engine_tau(target_dir, draft_dir, records, device, args.max_new_tokens)
    result = {"info": run_info(args.device), "records": len(records),
              "trainer": {"tau": train["tau"], "acc_by_pos": train["acc_by_pos"]},
              "engine": engine}
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_vs_engine_tau.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"trainer tau {train['tau']:.3f}  engine tau {engine['tau']:.3f}  "
          f"(responses identical: {engine['responses_identical_to_data']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
