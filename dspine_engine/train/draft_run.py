"""One draft being trained: its weights, optimizer, learning-rate schedule, loss settings,
output directory, log and best held-out score.

A training run holds one of these per draft. Usually that is one (DSpine, or its DFlash
ablation); with ``dspine-train fit --ablation-out DIR`` it is two, trained side by side on the
very same batches (one target capture per batch), which makes "equal data, steps and init" true
by construction.

Output directory layout (``OUT``):
- ``config.json`` + ``model*.safetensors`` (bf16, shards <= 15 MiB): the servable draft — the
  checkpoint with the best held-out tau when the run evaluates, else the latest;
- ``train_state/``: fp32 master weights + AdamW moments (sharded the same way) and
  ``state.json`` (step, schedule, the run's settings, the best score) for ``--resume``;
- ``train_log.jsonl``: one line per logged step and per evaluation.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import torch

from ..models.dspine import DSpineDraft
from ..models.weights import WeightStore, checkpoint_files, save_checkpoint
from .distributed import DistContext
from .forward import TrainingForward
from .losses import LossConfig, default_gamma, dspine_loss

SHARD_BYTES = 15 * 2**20  # files that come back from the GPU machine must stay <= 16 MiB
STATE_DIR = "train_state"


class DraftLoss(torch.nn.Module):
    """The draft's training forward + loss as one module, so that DistributedDataParallel can
    wrap it (its parameters are the draft's)."""

    def __init__(self, draft: DSpineDraft, target, loss_cfg: LossConfig):
        super().__init__()
        self.draft, self.loss_cfg = draft, loss_cfg
        self.training_forward = TrainingForward(draft, target.embed, target.lm_head)
        self.lm_head = target.lm_head  # frozen, not a parameter

    def forward(self, taps, blocks, total=None):
        out = self.training_forward(taps, blocks)
        return dspine_loss(self.draft, self.lm_head, out, blocks, self.loss_cfg, total), out


class DraftRun:
    def __init__(self, name: str, draft: DSpineDraft, target, cfg, out_dir: Path, lr_factor,
                 dist_ctx: DistContext | None = None):
        """``lr_factor(step)`` is the schedule shared by every draft of the run; with a
        data-parallel ``dist_ctx`` the draft trains under DistributedDataParallel and only rank
        0 writes files."""
        self.name, self.cfg, self.out = name, cfg, Path(out_dir)
        self.dist = dist_ctx or DistContext()
        self.draft = draft.to(target.device, torch.float32).train()
        c = draft.config
        self.loss_cfg = LossConfig(gamma=cfg.gamma or default_gamma(c.block_size),
                                   layer_weight=cfg.layer_weight,
                                   transition_weight=cfg.transition_weight,
                                   chunk_rows=cfg.ce_chunk, soft_weight=cfg.soft_targets)
        self.module = DraftLoss(self.draft, target, self.loss_cfg)
        self.parallel = self.module
        if self.dist.active:
            from torch.nn.parallel import DistributedDataParallel

            ids = [target.device.index] if target.device.type == "cuda" else None
            self.parallel = DistributedDataParallel(self.module, device_ids=ids)
        self.opt = torch.optim.AdamW(self._param_groups(), lr=cfg.lr, betas=(0.9, 0.95),
                                     fused=target.device.type == "cuda")
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_factor)
        self.best: float | None = None  # best held-out tau so far (None: not evaluated yet)
        self.best_step: int | None = None
        self.log_path = self.out / "train_log.jsonl"

    def _param_groups(self):
        """Weight decay on matrices only (not on norm weights or the mask embedding)."""
        params = [p for p in self.draft.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2],
                 "weight_decay": self.cfg.weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.draft.parameters())

    # ------------------------------------------------------------------ one batch
    def loss(self, taps, blocks, autocast: bool, total=None, training: bool = False):
        """(LossResult, DraftOutputs). ``training``: through the data-parallel wrapper, whose
        backward averages the gradients over ranks."""
        module = self.parallel if training else self.module
        with torch.autocast(taps.device.type, dtype=torch.bfloat16, enabled=autocast):
            return module(taps, blocks, total)

    def no_sync(self):
        """Within gradient accumulation, skip the all-reduce until the last micro-batch."""
        import contextlib

        return self.parallel.no_sync() if self.dist.active else contextlib.nullcontext()

    def optimizer_step(self) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), self.cfg.clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return norm

    # ------------------------------------------------------------------ logs
    def append_log(self, row: dict) -> None:
        if not self.dist.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def record_eval(self, step: int, score: float) -> bool:
        """Returns True when ``score`` is the best held-out tau so far (the draft to keep)."""
        if self.best is not None and not score > self.best:
            return False
        self.best, self.best_step = score, step
        return True

    # ------------------------------------------------------------------ checkpoints
    def save_draft(self) -> None:
        """Writes the servable bf16 draft (config + shards) into OUT."""
        if self.dist.is_main:
            self.draft.save(self.out, dtype=torch.bfloat16, max_shard_bytes=SHARD_BYTES)

    def save_state(self, step: int, schedule: "LRSchedule", data_info: dict) -> None:
        """Writes the resume state (fp32 master weights, AdamW moments, schedule); swapped in
        atomically, so a save cut short leaves the previous state usable."""
        if not self.dist.is_main:
            return
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
        state = {"step": step, "total_steps": schedule.total, "lr_schedule": schedule.state(),
                 "param_groups": opt_state["param_groups"],
                 "scheduler": self.sched.state_dict(), "config": dataclasses.asdict(self.cfg),
                 "data": data_info, "best": self.best, "best_step": self.best_step}
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
        self.best, self.best_step = state.get("best"), state.get("best_step")


def find_state(out_dir: Path) -> Path | None:
    """The resume state in ``out_dir`` (the previous one if a save was cut short)."""
    for name in (STATE_DIR, f"{STATE_DIR}.old"):
        d = Path(out_dir) / name
        if (d / "state.json").is_file():
            return d
    return None


def warm_steps(warmup: float, total: int) -> int:
    """``warmup`` as a step count: a fraction of ``total``, or a step count when >= 1."""
    return max(1, round(warmup if warmup >= 1 else warmup * total))


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """The learning-rate factor per step: a linear warm-up to 1 at step ``warm - 1``, then a
    cosine from 1 down to ``floor`` at step ``total``.

    A run sized to its time budget changes ``total`` mid-run (`replan`). The factor is read off
    the schedule's *position* (in the warm-up: the factor itself; in the cosine: 1 + its
    progress), which runs linearly from where it was at the last re-plan (``anchor``,
    ``position``) to the end of the phase, so the factor never jumps and still ends at
    ``floor``. Anchor 0 at position 1 / warm is the plain schedule."""
    total: int
    warm: int
    floor: float
    anchor: int
    position: float  # at ``anchor``

    @classmethod
    def start(cls, total: int, warmup: float, floor: float,
              warm_basis: int | None = None) -> "LRSchedule":
        """``warm_basis``: the step count a warm-up fraction is taken of, when ``total`` is
        only a placeholder (a run sized to its budget later, which re-plans the warm-up)."""
        warm = warm_steps(warmup, warm_basis or total)
        return cls(total, warm, floor, 0, 1 / warm)

    def position_at(self, step: int) -> float:
        a, x = self.anchor, self.position
        if a < self.warm:  # anchored in the warm-up, which ends at 1 at step warm - 1
            if step < self.warm:
                return x + (1 - x) * (step - a) / max(1, self.warm - 1 - a)
            a, x = self.warm, 1.0  # then the cosine as planned: from the warm-up's end
        return min(2.0, x + (2 - x) * (step - a) / max(1, self.total - a))

    def factor(self, step: int) -> float:
        x = self.position_at(step)
        if x < 1:
            return x
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * (x - 1)))

    def replan(self, step: int, total: int, warmup: float) -> "LRSchedule":
        """The schedule from ``step`` on, ending at ``total`` (at least ``step + 1``): the
        factor at ``step`` stays; a warm-up under way now ends where the new total's would,
        but never sooner than planned (a shorter one would climb the rest in a step or two);
        a cosine under way spreads its remaining progress over the new remaining steps."""
        total = max(total, step + 1)
        warm = self.warm
        if step < warm - 1:
            warm = min(max(warm_steps(warmup, total), warm), max(total - 1, step + 2))
        return LRSchedule(total, warm, self.floor, step, self.position_at(step))

    def state(self) -> dict:
        """What `state.json` keeps besides ``total_steps`` (``floor`` is the run's setting)."""
        return {"warm": self.warm, "anchor": self.anchor, "position": self.position}

    @classmethod
    def from_state(cls, total: int, saved: dict | None, warmup: float, floor: float):
        """The saved schedule; a state file without one (written before re-planning existed)
        ran the plain schedule, anchor 0."""
        if saved is None:
            return cls.start(total, warmup, floor)
        return cls(total, saved["warm"], floor, saved["anchor"], saved["position"])
