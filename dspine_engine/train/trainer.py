"""The training loop: batches of the target's own answers -> online target capture -> draft
training forward -> DSpine loss; AdamW with warm-up + cosine, bf16 autocast on GPU, gradient
accumulation and clipping, periodic checkpoints, a time budget, and resume.

Output directory layout (``OUT``):
- ``config.json`` + ``model*.safetensors`` (bf16, shards <= 15 MiB): the draft, loadable with
  ``Engine(target, draft=OUT)``;
- ``train_state/``: fp32 master weights + AdamW moments (sharded the same way) and
  ``state.json`` (step, schedule, the run's settings) for ``--resume``;
- ``train_log.jsonl``: one line per logged step and per evaluation.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models.draft_config import DraftConfig
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from ..models.weights import WeightStore, checkpoint_files, save_checkpoint
from .capture import TargetCapture
from .forward import TrainingForward, make_blocks, sample_anchors
from .losses import (LossConfig, block_metrics, default_gamma, dspine_loss, merge_metrics,
                     summarize_metrics)

SHARD_BYTES = 15 * 2**20  # files that come back from the GPU machine must stay <= 16 MiB
STATE_DIR = "train_state"
# Settings that may change when a run is resumed; all others are taken from the saved run.
RUNTIME_FIELDS = ("max_minutes", "save_every", "log_every", "ce_chunk", "eval_batches")


@dataclass
class TrainConfig:
    steps: int | None = None  # optimizer steps; None: `epochs` passes over the data
    epochs: float = 1.0
    batch_size: int = 32  # sequences per micro-batch (64 suits SmolLM2 on an H200)
    grad_accum: int = 1
    lr: float = 6e-4
    min_lr_ratio: float = 0.05  # the cosine ends at lr * min_lr_ratio
    warmup: float = 0.04  # fraction of the steps (or a step count when >= 1)
    weight_decay: float = 0.01
    clip: float = 1.0
    blocks_per_seq: int = 32
    max_len: int = 2048
    gamma: float | None = None  # None: 7 * B / 16
    layer_weight: float = 1.0
    transition_weight: float = 1.0
    ce_chunk: int = 8192
    bf16: bool = True  # autocast on CUDA (CPU always runs fp32)
    seed: int = 0
    save_every: int = 500
    log_every: int = 10
    eval_batches: int = 4  # held-out batches scored at each checkpoint
    max_minutes: float | None = None


class SequenceData:
    """Token sequences (prompt + response, cut at ``max_len``) and where each response starts,
    served as padded batches in a seeded order per epoch."""

    def __init__(self, records: list[dict], max_len: int):
        self.seqs, self.starts = [], []
        for r in records:
            ids = (list(r["prompt_ids"]) + list(r["response_ids"]))[:max_len]
            if len(ids) - len(r["prompt_ids"]) >= 2:  # room for an anchor and one target
                self.seqs.append(ids)
                self.starts.append(len(r["prompt_ids"]))

    def __len__(self) -> int:
        return len(self.seqs)

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``tokens [b, S]`` (0-padded), ``lengths [b]``, ``starts [b]`` (CPU)."""
        seqs = [self.seqs[i] for i in indices]
        tokens = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
        for row, s in zip(tokens, seqs):
            row[:len(s)] = torch.tensor(s)
        return (tokens, torch.tensor([len(s) for s in seqs]),
                torch.tensor([self.starts[i] for i in indices]))

    def micro_batch(self, micro: int, batch_size: int, seed: int):
        """The ``micro``-th micro-batch of the run (epochs reshuffle; the last partial batch of
        an epoch is dropped), so a resumed run continues with the very next batch."""
        per_epoch = max(1, len(self) // batch_size)
        epoch, k = divmod(micro, per_epoch)
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(
            seed * 7919 + epoch))
        return self.batch(order[k * batch_size:(k + 1) * batch_size].tolist())


def split_records(records: list[dict], eval_fraction: float = 0.02, max_eval: int = 256):
    """Held-out records for evaluation: the last ones of the file (at least one when there are
    two or more records)."""
    n_eval = min(max_eval, max(1 if len(records) > 1 else 0, int(len(records) * eval_fraction)))
    return records[:len(records) - n_eval], records[len(records) - n_eval:]


class Trainer:
    def __init__(self, target: TargetModel, draft: DSpineDraft, data: SequenceData,
                 eval_data: SequenceData | None, cfg: TrainConfig, out_dir: Path,
                 data_info: dict | None = None):
        if len(data) < 1:
            raise ValueError("no usable training sequences (each needs >= 2 response tokens)")
        self.target, self.cfg, self.out = target, cfg, Path(out_dir)
        self.device = target.device
        self.draft = draft.to(self.device, torch.float32).train()
        self.data, self.eval_data, self.data_info = data, eval_data, data_info or {}
        self.batch_size = min(cfg.batch_size, len(data))
        self.total_steps = cfg.steps or max(1, math.ceil(
            cfg.epochs * (len(data) // self.batch_size) / cfg.grad_accum))
        c = draft.config
        self.loss_cfg = LossConfig(gamma=cfg.gamma or default_gamma(c.block_size),
                                   layer_weight=cfg.layer_weight,
                                   transition_weight=cfg.transition_weight,
                                   chunk_rows=cfg.ce_chunk)
        self.forward = TrainingForward(draft, target.embed, target.lm_head)
        self.capture = TargetCapture(target, c.target_layer_ids, self.batch_size * cfg.max_len)
        self.autocast = cfg.bf16 and self.device.type == "cuda"
        self.opt = torch.optim.AdamW(self._param_groups(), lr=cfg.lr, betas=(0.9, 0.95),
                                     fused=self.device.type == "cuda")
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: self._lr_factor(s))
        self.step = 0
        self.log_path = self.out / "train_log.jsonl"

    # ------------------------------------------------------------------ setup
    def _param_groups(self):
        """Weight decay on matrices only (not on norm weights or the mask embedding)."""
        params = [p for p in self.draft.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2],
                 "weight_decay": self.cfg.weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    def _lr_factor(self, step: int) -> float:
        warm = self.cfg.warmup if self.cfg.warmup >= 1 else self.cfg.warmup * self.total_steps
        warm = max(1, round(warm))
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, self.total_steps - warm))
        floor = self.cfg.min_lr_ratio
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    # ------------------------------------------------------------------ one batch
    def _loss(self, batch, generator):
        tokens, lengths, starts = batch
        anchors, keep = sample_anchors(lengths, starts, self.cfg.blocks_per_seq,
                                       tokens.shape[1], generator)
        dev = self.device
        tokens = tokens.to(dev, non_blocking=True)
        blocks = make_blocks(tokens, lengths.to(dev), anchors.to(dev), keep.to(dev),
                             self.draft.config.block_size)
        taps = self.capture(tokens, lengths.tolist())
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.forward(taps, blocks)
            return dspine_loss(self.draft, self.target.lm_head, out, blocks, self.loss_cfg)

    def train_step(self) -> tuple[dict, dict]:
        """One optimizer step over ``grad_accum`` micro-batches; returns device-side loss terms
        and metric counts (no host sync)."""
        cfg = self.cfg
        terms, counts = {}, None
        for k in range(cfg.grad_accum):
            micro = self.step * cfg.grad_accum + k
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + micro)
            res = self._loss(self.data.micro_batch(micro, self.batch_size, cfg.seed), gen)
            (res.loss / cfg.grad_accum).backward()
            for name, v in {"loss": res.loss.detach(), **res.terms}.items():
                terms[name] = terms.get(name, 0) + v / cfg.grad_accum
            counts = merge_metrics(counts, block_metrics(res.correct, res.valid))
        terms["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        return terms, counts

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        """Loss terms, per-position accuracy and tau on held-out sequences with fixed anchors."""
        if not self.eval_data or not len(self.eval_data) or self.cfg.eval_batches < 1:
            return None
        self.draft.eval()
        gen = torch.Generator().manual_seed(12345)
        terms, counts, n = {}, None, 0
        bs = min(self.batch_size, len(self.eval_data))
        for start in range(0, min(len(self.eval_data), bs * self.cfg.eval_batches), bs):
            idx = list(range(start, min(start + bs, len(self.eval_data))))
            res = self._loss(self.eval_data.batch(idx), gen)
            for name, v in {"loss": res.loss, **res.terms}.items():
                terms[name] = terms.get(name, 0) + float(v)
            counts = merge_metrics(counts, block_metrics(res.correct, res.valid))
            n += 1
        self.draft.train()
        return {**{k: v / n for k, v in terms.items()}, **summarize_metrics(counts)}

    # ------------------------------------------------------------------ the loop
    def run(self, t_start: float | None = None) -> bool:
        """Trains to ``total_steps`` or until the time budget; returns True when finished."""
        cfg = self.cfg
        t_start = t_start or time.monotonic()
        deadline = t_start + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
        step_time, save_time = 0.0, 30.0  # estimates, refined as we go
        first_step = self.step
        bar = tqdm(total=self.total_steps, initial=self.step, desc="fit", unit="step")
        window_terms, window_counts, window_steps = {}, None, 0
        window_start = time.monotonic()
        try:
            while self.step < self.total_steps:
                if time.monotonic() + step_time + save_time > deadline:
                    save_time = self._save_timed()
                    tqdm.write(f"time budget reached at step {self.step}/{self.total_steps}; "
                               f"checkpoint in {self.out}; continue with --resume")
                    return False
                t0 = time.monotonic()
                terms, counts = self.train_step()
                for k, v in terms.items():
                    window_terms[k] = window_terms.get(k, 0) + v
                window_counts = merge_metrics(window_counts, counts)
                window_steps += 1
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    self._log_train(bar, window_terms, window_counts, window_steps,
                                    time.monotonic() - window_start)
                    window_terms, window_counts, window_steps = {}, None, 0
                    window_start = time.monotonic()
                bar.update()
                step_time = 0.9 * step_time + 0.1 * (time.monotonic() - t0) if step_time else (
                    time.monotonic() - t0)
                if self.step % cfg.save_every == 0 and self.step < self.total_steps:
                    save_time = self._save_timed()
        except KeyboardInterrupt:
            tqdm.write("interrupted: saving a checkpoint")
            self.save()
            raise
        finally:
            bar.close()
        if self.step > first_step:
            self._save_timed()
        return True

    def _log_train(self, bar, terms, counts, steps, seconds) -> None:
        row = {"step": self.step, "lr": self.sched.get_last_lr()[0],
               **{k: float(v) / steps for k, v in terms.items()}, **summarize_metrics(counts),
               "step_seconds": seconds / steps}
        if self.device.type == "cuda":
            row["peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self._append_log(row)
        short = {"loss": row["loss"], "final": row["final"], "tr": row.get("transition"),
                 "lw": row.get("layers"), "acc": row["acc"], "tau": row["tau"], "lr": row["lr"]}
        bar.set_postfix({k: f"{v:.3g}" for k, v in short.items() if v is not None})

    def _append_log(self, row: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def _save_timed(self) -> float:
        t0 = time.monotonic()
        self.save()
        ev = self.evaluate()
        if ev is not None:
            self._append_log({"step": self.step, "eval": ev})
            acc = " ".join(f"{a:.2f}" for a in ev["acc_by_pos"])
            tqdm.write(f"step {self.step}: eval loss {ev['loss']:.3f} tau {ev['tau']:.2f} "
                       f"acc by position [{acc}]")
        return time.monotonic() - t0

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        """Writes the bf16 draft (usable at once) and the resume state, each in shards."""
        self.draft.save(self.out, dtype=torch.bfloat16, max_shard_bytes=SHARD_BYTES)
        tensors = {f"param.{n}": p.detach().float().cpu().contiguous()
                   for n, p in self.draft.named_parameters()}
        opt_state = self.opt.state_dict()
        for idx, st in opt_state["state"].items():
            for key, v in st.items():
                tensors[f"optim.{idx}.{key}"] = v.detach().cpu().contiguous()
        tmp, final, old = (self.out / f"{STATE_DIR}.tmp", self.out / STATE_DIR,
                           self.out / f"{STATE_DIR}.old")
        shutil.rmtree(tmp, ignore_errors=True)
        save_checkpoint(tensors, tmp, SHARD_BYTES)
        state = {"step": self.step, "total_steps": self.total_steps,
                 "param_groups": opt_state["param_groups"],
                 "scheduler": self.sched.state_dict(), "config": dataclasses.asdict(self.cfg),
                 "data": self.data_info}
        (tmp / "state.json").write_text(json.dumps(state, indent=1) + "\n")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    def load_state(self, state_dir: Path, state: dict) -> None:
        store = WeightStore(checkpoint_files(state_dir), progress=False)
        with torch.no_grad():
            for name, p in self.draft.named_parameters():
                p.copy_(store.get(f"param.{name}", tuple(p.shape)))
        opt_state = {"state": {}, "param_groups": state["param_groups"]}
        for name in store.names():
            if name.startswith("optim."):
                _, idx, key = name.split(".", 2)
                opt_state["state"].setdefault(int(idx), {})[key] = store.get(name)
        self.opt.load_state_dict(opt_state)
        self.sched.load_state_dict(state["scheduler"])
        self.step = state["step"]


def find_state(out_dir: Path) -> Path | None:
    """The resume state in ``out_dir`` (the previous one if a save was cut short)."""
    for name in (STATE_DIR, f"{STATE_DIR}.old"):
        d = Path(out_dir) / name
        if (d / "state.json").is_file():
            return d
    return None


def resume_config(saved: dict, requested: TrainConfig) -> tuple[TrainConfig, list[str]]:
    """The saved run's settings, except the runtime ones, which the new command may change.
    Returns the config and the requested settings that were ignored."""
    cfg = TrainConfig(**saved)
    ignored = []
    for f in dataclasses.fields(TrainConfig):
        new = getattr(requested, f.name)
        if f.name in RUNTIME_FIELDS:
            setattr(cfg, f.name, new)
        elif new != getattr(cfg, f.name) and new != f.default:
            ignored.append(f"{f.name}={new!r} (run uses {getattr(cfg, f.name)!r})")
    return cfg, ignored


def load_draft_for_resume(out_dir: Path) -> DSpineDraft:
    return DSpineDraft(DraftConfig.from_dir(out_dir))
