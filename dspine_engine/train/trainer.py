"""The training loop: batches of the target's own answers -> online target capture -> draft
training forward -> DSpine loss; AdamW with warm-up + cosine, bf16 autocast on GPU, gradient
accumulation and clipping, periodic held-out evaluation and checkpoints (the best held-out
draft is the one kept), a time budget (optionally sizing the run to it), and resume.

One capture of the frozen target serves every draft of the run: the DSpine draft and, with an
ablation, its DFlash twin, trained on the very same batches (`draft_run.DraftRun` holds each
draft's optimizer, schedule and files).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models.draft_config import DraftConfig
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from .capture import TargetCapture
from .distributed import DistContext
from .draft_run import DraftRun, LRSchedule, find_state  # noqa: F401  (find_state: CLI)
from .evaluation import EvalAccumulator, walk_correct, walk_tables
from .flops import ce_terms, draft_step_flops, target_capture_flops
from .forward import make_blocks, sample_anchors, teacher_states
from .losses import block_metrics, merge_metrics, summarize_metrics, weight_total

# With steps=0: the run is sized to its budget after these many steps (each with a checkpoint, to
# time one), and sized again after the second (on CUDA the first steps include compilation for new
# batch shapes: an H200 run sized at step 20 alone expected 410 ms/step, ran at ~300, and finished
# with a third of its budget unused).
CALIBRATION_STEPS = (20, 120)
# ... and then every RESIZE_EVERY steps from the steps since the last sizing, since the speed can
# change mid-run (an H200 shared with other processes for the first 4 minutes: 354 ms/step at
# step 120, ~200-250 later; sized once, the run used 5.3 of its 8 minutes). 100 steps give a
# median that ignores outliers (logs, checkpoints) and re-plan every 20-40 s at 0.2-0.4 s/step,
# at the cost of one broadcast.
RESIZE_EVERY = 100
# steps=0, before the first sizing: the run length a warm-up fraction is taken of (the H200
# runs of 5-8 minutes were sized to 1000-2000 steps); the sizing re-plans it from there.
UNSIZED_RUN_STEPS = 1000
# Settings that may change when a run is resumed; all others are taken from the saved run.
RUNTIME_FIELDS = ("max_minutes", "save_every", "log_every", "ce_chunk", "eval_batches")


@dataclass
class TrainConfig:
    steps: int | None = None  # optimizer steps; None: `epochs` passes; 0: fill max_minutes
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
    soft_targets: float = 0.0  # alpha of the soft label (losses.py); 0: hard labels only
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
                 data_info: dict | None = None,
                 ablation: tuple[DSpineDraft, Path] | None = None,
                 dist_ctx: DistContext | None = None):
        """``ablation``: a second draft (the DFlash twin) and its output directory, trained on
        the same batches and steps. ``dist_ctx``: data parallelism over ranks (`distributed`);
        ``cfg.batch_size`` is then per rank."""
        if len(data) < 1:
            raise ValueError("no usable training sequences (each needs >= 2 response tokens)")
        if cfg.steps == 0 and not cfg.max_minutes:
            raise ValueError("steps=0 sizes the run to its time budget: give max_minutes too")
        self.target, self.cfg = target, cfg
        self.device = target.device
        self.data, self.eval_data, self.data_info = data, eval_data, data_info or {}
        self.dist = dist_ctx or DistContext()
        world = self.dist.world
        # The global batch, a multiple of the ranks; each rank captures and trains its slice.
        self.global_batch = min(cfg.batch_size * world, len(data)) // world * world
        if self.global_batch < 1:
            raise ValueError(f"{len(data)} training sequences cannot be shared by {world} ranks")
        self.batch_size = self.global_batch // world
        self.auto_steps = cfg.steps == 0
        total = (10**6 if self.auto_steps else cfg.steps) or max(1, math.ceil(
            cfg.epochs * (len(data) // self.global_batch) / cfg.grad_accum))
        # Unsized, a warm-up fraction of the 10**6 placeholder would be 40,000 steps: the first
        # sizing (step 20) would find the warm-up barely begun and end it within a step or two,
        # a jump from ~0 to the full rate. Until then it is a fraction of a typical sized run.
        self.schedule = LRSchedule.start(total, cfg.warmup, cfg.min_lr_ratio,
                                         UNSIZED_RUN_STEPS if self.auto_steps else None)
        self.clock = time.monotonic  # the budget's time source (a test drives its own)
        self.runs = [DraftRun(_kind(draft), draft, target, cfg, out_dir, self._lr_factor,
                              self.dist)]
        if ablation is not None:
            self.runs.append(DraftRun(_kind(ablation[0]), ablation[0], target, cfg, ablation[1],
                                      self._lr_factor, self.dist))
        self.draft, self.out = self.runs[0].draft, self.runs[0].out
        self.capture = TargetCapture(target, self._tap_layers(), self.batch_size * cfg.max_len)
        self.autocast = cfg.bf16 and self.device.type == "cuda"
        self.step = 0
        self.last_flops, self.last_tokens = 0.0, 0  # of the last step (throughput logs)

    def _tap_layers(self) -> list[int]:
        taps = [r.draft.config.target_layer_ids for r in self.runs]
        if any(t != taps[0] for t in taps):
            raise ValueError("drafts trained together must tap the same target layers")
        return taps[0]

    @property
    def total_steps(self) -> int:
        return self.schedule.total

    def _lr_factor(self, step: int) -> float:
        return self.schedule.factor(step)

    # ------------------------------------------------------------------ one batch
    def _capture(self, batch, generator, shard: bool = True):
        """Blocks and the target's taps of one micro-batch (shared by every draft). Anchors are
        drawn for the whole (global) batch, then ``shard`` keeps this rank's rows, so the ranks
        together see exactly what one process would."""
        tokens, lengths, starts = batch
        anchors, keep = sample_anchors(lengths, starts, self.cfg.blocks_per_seq,
                                       tokens.shape[1], generator)
        if shard and self.dist.active:
            rows = self.dist.batch_slice(tokens.shape[0])
            tokens, lengths, anchors, keep = tokens[rows], lengths[rows], anchors[rows], keep[rows]
        dev = self.device
        tokens = tokens.to(dev, non_blocking=True)
        block_size = self.runs[0].draft.config.block_size
        blocks = make_blocks(tokens, lengths.to(dev), anchors.to(dev), keep.to(dev), block_size)
        if self.cfg.soft_targets <= 0:
            return self.capture(tokens, lengths.tolist()), blocks
        taps, final = self.capture(tokens, lengths.tolist(), final=True)
        blocks.teacher = teacher_states(final, blocks)
        return taps, blocks

    def _flops(self, lengths: list[int], blocks, valid_rows: int) -> float:
        kept = int(blocks.keep.sum())
        return target_capture_flops(self.target.config, lengths) + sum(
            draft_step_flops(r.draft.config, lengths, kept, valid_rows,
                             ce_terms(r.draft.config, self.cfg.layer_weight,
                                      self.cfg.soft_targets > 0)) for r in self.runs)

    def train_step(self) -> tuple[dict, dict]:
        """One optimizer step of every draft over ``grad_accum`` micro-batches; returns the
        first draft's device-side loss terms and metric counts (no host sync; the others' are
        in ``run.last_terms`` / ``run.last_counts``)."""
        cfg = self.cfg
        acc = [({}, None) for _ in self.runs]
        flops, tokens = 0.0, 0
        for k in range(cfg.grad_accum):
            micro = self.step * cfg.grad_accum + k
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + micro)
            batch = self.data.micro_batch(micro, self.global_batch, cfg.seed)
            taps, blocks = self._capture(batch, gen)
            total = self._weight_total(blocks)
            last = k == cfg.grad_accum - 1
            for i, run in enumerate(self.runs):
                with (contextlib.nullcontext() if last else run.no_sync()):
                    res, _ = run.loss(taps, blocks, self.autocast, total, training=True)
                    (res.loss / cfg.grad_accum).backward()
                terms, counts = acc[i]
                for name, v in {"loss": res.loss.detach(), **res.terms}.items():
                    terms[name] = terms.get(name, 0) + v / cfg.grad_accum
                acc[i] = (terms, merge_metrics(counts, block_metrics(res.correct, res.valid)))
            local = batch[1][self.dist.batch_slice(len(batch[1]))]
            flops += self._flops(local.tolist(), blocks, int(blocks.valid.sum()))
            tokens += int(local.sum())
        for run, (terms, counts) in zip(self.runs, acc):
            terms["grad_norm"] = run.optimizer_step()
            run.last_terms, run.last_counts = terms, counts
        self.step += 1
        self.last_flops, self.last_tokens = flops, tokens
        return acc[0]

    def _weight_total(self, blocks):
        """The loss denominator of this rank's slice: the whole batch's sum of position weights
        over the ranks (DDP averages the ranks' gradients, hence the division), or None in one
        process (each term then uses its own batch's sum)."""
        if not self.dist.active:
            return None
        total = weight_total(blocks, self.runs[0].loss_cfg.gamma)
        return self.dist.all_sum(total.detach().clone()) / self.dist.world

    @torch.no_grad()
    def evaluate_all(self) -> dict[str, dict] | None:
        """Per draft: loss terms, per-position accuracy, tau (argmax) and tau_walk (the
        engine's chain choice) on held-out sequences with fixed anchors."""
        if not self.eval_data or not len(self.eval_data) or self.cfg.eval_batches < 1:
            return None
        for run in self.runs:
            run.draft.eval()
        gen = torch.Generator().manual_seed(12345)
        accs = [EvalAccumulator() for _ in self.runs]
        tables = [walk_tables(r.draft, self.target.lm_head) for r in self.runs]
        bs = min(self.batch_size, len(self.eval_data))
        for start in range(0, min(len(self.eval_data), bs * self.cfg.eval_batches), bs):
            idx = list(range(start, min(start + bs, len(self.eval_data))))
            taps, blocks = self._capture(self.eval_data.batch(idx), gen, shard=False)
            for run, acc, tab in zip(self.runs, accs, tables):
                res, out = run.loss(taps, blocks, self.autocast)
                acc.add(res, walk_correct(run.draft, self.target.lm_head, out, blocks, tab))
        for run in self.runs:
            run.draft.train()
        return {run.name: acc.summary() for run, acc in zip(self.runs, accs)}

    def evaluate(self) -> dict | None:
        """The first draft's held-out scores (see `evaluate_all`)."""
        scores = self.evaluate_all()
        return None if scores is None else scores[self.runs[0].name]

    # ------------------------------------------------------------------ the loop
    def run(self, t_start: float | None = None) -> bool:
        """Trains to ``total_steps`` or until the time budget; returns True when finished."""
        cfg = self.cfg
        t_start = self.clock() if t_start is None else t_start
        deadline = t_start + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
        step_time, save_time = 0.0, 30.0  # estimates, refined as we go
        first_step = self.step
        bar = tqdm(total=self.total_steps, initial=self.step, desc="fit", unit="step",
                   disable=not self.dist.is_main)
        window = _Window()
        timed = []  # step times since the run was last sized
        try:
            while self.step < self.total_steps:
                # Rank 0 decides, so that every rank stops at the same step.
                if self.dist.from_main(self.clock() + step_time + save_time > deadline):
                    save_time = self._checkpoint()
                    self._say(f"time budget reached at step {self.step}/{self.total_steps}; "
                              f"checkpoint in {self.out}; continue with --resume")
                    return False
                t0 = self.clock()
                self.train_step()
                window.add(self)
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    self._log_train(bar, window)
                    window = _Window()
                bar.update()
                dt = self.clock() - t0
                step_time = 0.9 * step_time + 0.1 * dt if step_time else dt
                timed.append(dt)
                if self.step < self.total_steps:
                    save_time = self._between_steps(self.step - first_step, timed, save_time,
                                                    deadline, bar)
        except KeyboardInterrupt:
            self._say("interrupted: saving a checkpoint")
            for run in self.runs:
                if run.best is None:  # never evaluated: the latest weights are the draft
                    run.save_draft()
            self._save_state()
            raise
        finally:
            bar.close()
        if self.step > first_step:
            self._checkpoint()
        return True

    def _between_steps(self, done: int, timed: list[float], save_time: float, deadline: float,
                       bar) -> float:
        """After ``done`` steps of this process: a checkpoint every ``save_every`` steps and
        at the calibration steps (to time one); with steps=0, sizing the run at the sizing
        steps from ``timed`` (emptied for the next window). Returns the latest checkpoint's
        seconds."""
        calibrating = self.auto_steps and done in CALIBRATION_STEPS
        if calibrating or self.step % self.cfg.save_every == 0:
            save_time = self._checkpoint()
        if self.auto_steps and _sizing_step(done):
            # The window's first quarter is left out: the first steps include compilation.
            self._size_to_budget(timed[len(timed) // 4:], save_time, deadline, bar)
            timed.clear()
        return save_time

    def _size_to_budget(self, step_times: list[float], ckpt_time: float, deadline: float,
                        bar) -> None:
        """steps=0: the run's length follows from the measured step and checkpoint times, so
        the cosine schedule ends inside --max-minutes instead of being cut short (or leaving
        time unused); the schedule is re-planned from this step, so the learning rate stays
        continuous."""
        step = sorted(step_times)[len(step_times) // 2]
        left = (deadline - self.clock()) * 0.97 - ckpt_time  # the final checkpoint
        more = max(1, int(left / (step + ckpt_time / self.cfg.save_every)))
        total = self.dist.from_main(self.step + more)  # every rank plans the same schedule
        if total == self.total_steps:
            return
        # Anchored at the next step, whose learning rate the scheduler has already set.
        self.schedule = self.schedule.replan(self.step, total, self.cfg.warmup)
        bar.total = self.total_steps
        self._say(f"sized to the budget: {self.total_steps} steps ({step * 1e3:.0f} ms/step, "
                  f"{ckpt_time:.1f} s per checkpoint)")

    def _say(self, text: str) -> None:
        if self.dist.is_main:
            tqdm.write(text)

    def _log_train(self, bar, window: "_Window") -> None:
        window.gather(self.dist)
        seconds = window.seconds()
        throughput = {"tokens_per_s": window.tokens / seconds, "blocks_per_s": window.blocks /
                      seconds, "tflops": window.flops / seconds / 1e12}
        postfix = {}
        for i, run in enumerate(self.runs):
            terms, counts = window.terms[i], window.counts[i]
            row = {"step": self.step, "lr": run.sched.get_last_lr()[0],
                   **{k: float(v) / window.steps for k, v in terms.items()},
                   **summarize_metrics(counts), "step_seconds": seconds / window.steps,
                   **throughput}
            if self.device.type == "cuda":
                row["peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            run.append_log(row)
            if i == 0:
                postfix = {"loss": row["loss"], "final": row["final"],
                           "tr": row.get("transition"), "lw": row.get("layers"),
                           "acc": row["acc"], "tau": row["tau"], "lr": row["lr"],
                           "tflops": row["tflops"]}
            else:
                postfix[f"tau_{run.name}"] = row["tau"]
        bar.set_postfix({k: f"{v:.3g}" for k, v in postfix.items() if v is not None})

    def _checkpoint(self) -> float:
        """Evaluates, keeps each draft's best held-out checkpoint as its servable draft, and
        writes the resume state. Returns the seconds it took."""
        t0 = time.monotonic()
        scores = self.evaluate_all() if self.dist.is_main else None  # rank 0 alone writes
        for run in self.runs:
            ev = None if scores is None else scores[run.name]
            if ev is None or run.record_eval(self.step, ev["tau_walk"]):
                run.save_draft()
            if ev is not None:
                run.append_log({"step": self.step, "eval": ev})
                acc = " ".join(f"{a:.2f}" for a in ev["acc_walk_by_pos"])
                self._say(f"[{run.name}] step {self.step}: eval loss {ev['loss']:.3f} tau "
                           f"{ev['tau']:.2f} tau_walk {ev['tau_walk']:.2f} (best "
                           f"{run.best:.2f} at {run.best_step}) walk acc by position [{acc}]")
        self._save_state()
        self.dist.barrier()  # the other ranks wait for rank 0's evaluation and files
        return time.monotonic() - t0

    def _save_state(self) -> None:
        for run in self.runs:
            run.save_state(self.step, self.schedule, self.data_info)

    def save(self) -> None:
        """Writes every draft (bf16) and its resume state, without evaluating."""
        for run in self.runs:
            run.save_draft()
        self._save_state()

    def load_state(self, state_dirs: list[Path], states: list[dict]) -> None:
        for run, d, st in zip(self.runs, state_dirs, states):
            run.load_state(d, st)
        self.step, saved = states[0]["step"], states[0]
        self.schedule = LRSchedule.from_state(saved["total_steps"], saved.get("lr_schedule"),
                                              self.cfg.warmup, self.cfg.min_lr_ratio)
        self.auto_steps = self.auto_steps and self.total_steps >= 10**6


class _Window:
    """What happened since the last log line: loss terms and counts per draft, tokens, blocks,
    FLOPs, steps, time."""

    def __init__(self):
        self.start = time.monotonic()
        self.terms, self.counts = [], []
        self.steps, self.tokens, self.blocks, self.flops = 0, 0, 0, 0.0

    def add(self, trainer: Trainer) -> None:
        if not self.terms:
            self.terms, self.counts = [{} for _ in trainer.runs], [None for _ in trainer.runs]
        for i, run in enumerate(trainer.runs):
            for k, v in run.last_terms.items():
                self.terms[i][k] = self.terms[i].get(k, 0) + v
            self.counts[i] = merge_metrics(self.counts[i], run.last_counts)
        counts = trainer.runs[0].last_counts
        self.steps += 1
        self.blocks += int(counts["blocks"])
        self.tokens += trainer.last_tokens
        self.flops += trainer.last_flops

    def gather(self, ctx: DistContext) -> None:
        """Sums over ranks (the ranks' loss terms are their slices' shares of the batch's loss,
        hence terms / W; counts, tokens, blocks and FLOPs simply add up)."""
        if not ctx.active:
            return
        for terms in self.terms:
            for k in terms:
                terms[k] = ctx.all_sum(torch.as_tensor(terms[k]).clone().float()) / ctx.world
        for counts in self.counts:
            for k in counts:
                counts[k] = ctx.all_sum(counts[k].clone())
        dev = self.counts[0]["blocks"].device
        totals = ctx.all_sum(torch.tensor([self.tokens, self.blocks, self.flops],
                                          dtype=torch.float64, device=dev))
        self.tokens, self.blocks, self.flops = int(totals[0]), int(totals[1]), float(totals[2])

    def seconds(self) -> float:
        return max(1e-9, time.monotonic() - self.start)


def _sizing_step(done: int) -> bool:
    """steps=0: whether the run is sized after ``done`` steps of this process."""
    last = CALIBRATION_STEPS[-1]
    return done in CALIBRATION_STEPS or done > last and (done - last) % RESIZE_EVERY == 0


def _kind(draft: DSpineDraft) -> str:
    return "dspine" if draft.config.injection or draft.config.transition else "dflash"


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
