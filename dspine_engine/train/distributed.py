"""Data parallelism for `dspine-train` over `torch.distributed` (NCCL on GPUs, gloo on CPUs).

Started by `torchrun` (which sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT);
without those variables everything runs as one process and nothing here talks to anyone.

- `dspine-train data`: rank r answers prompts r, r + W, r + 2W, ... into ``OUT.rank<r>`` and
  rank 0 merges the shards into ``OUT`` (`data.merge_samples`, deterministic).
- `dspine-train fit`: every rank holds the frozen target and the drafts, wrapped in
  `DistributedDataParallel`; a micro-batch of the global batch is cut into W equal slices, one
  per rank, and the loss of each slice is divided by the *global* count of weighted positions,
  so the averaged gradients equal a single process's on the whole batch (up to reduction
  order). Rank 0 evaluates, logs and writes checkpoints; decisions that end or resize the run
  are broadcast from it so that no rank waits for a collective the others skipped.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(minutes=int(os.environ.get("DSPINE_DIST_TIMEOUT_MIN", "10")))


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, requested) -> torch.device:
        """GPU LOCAL_RANK on CUDA (modulo the GPUs: data generation may run several ranks per
        GPU; training needs one GPU per rank, which `init_from_env` checks for NCCL); the
        requested device otherwise."""
        dev = torch.device(requested)
        if self.active and dev.type == "cuda":
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return dev

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (in place; returned for chaining)."""
        if self.active:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def from_main(self, value):
        """Rank 0's ``value`` on every rank (any picklable object)."""
        if not self.active:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def shard(self, items: list) -> list:
        """This rank's share of ``items``: every W-th, starting at the rank."""
        return items[self.rank::self.world]

    def batch_slice(self, size: int) -> slice:
        """This rank's rows of a global batch of ``size`` (which W must divide)."""
        per = size // self.world
        return slice(self.rank * per, (self.rank + 1) * per)


def init_from_env(device_type: str, backend: str | None = None,
                  timeout: datetime.timedelta = TIMEOUT) -> DistContext:
    """Joins the process group torchrun describes (or returns a one-process context). NCCL for
    CUDA ranks, gloo otherwise (or ``backend``: `dspine-train data` only needs a gloo barrier,
    with a timeout as long as generation may take)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    ctx = DistContext(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    backend = backend or ("nccl" if device_type == "cuda" else "gloo")
    if backend == "nccl":
        if torch.cuda.device_count() <= ctx.local_rank:  # NCCL: one GPU per rank
            raise ValueError(f"rank {ctx.rank} needs GPU {ctx.local_rank} but this machine has "
                             f"{torch.cuda.device_count()}; start fewer processes per node")
    if device_type == "cuda":
        torch.cuda.set_device(ctx.device("cuda"))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout)
    return ctx


def shutdown(ctx: DistContext) -> None:
    if ctx.active and dist.is_initialized():
        dist.destroy_process_group()
