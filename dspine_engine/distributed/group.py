"""The process group of a tensor-parallel engine: gloo on CPUs, NCCL on GPUs.

Every rank joins through a `FileStore` in a private temporary directory (one host: no port to
choose or collide on). The timeout bounds every collective, so a rank that stops answering
makes the others fail instead of wait forever; a rank that dies closes its connections, which
gloo reports at once. Rank 0 is the user's process and its group is the process's default one,
so only one tensor-parallel engine can live in a process at a time (checked before anything
starts).
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

# Bounds the wait for a peer inside one collective (the ranks run the same work between
# collectives, so this is skew, never a whole forward); also the rendezvous deadline.
COLLECTIVE_TIMEOUT_S = float(os.environ.get("DSPINE_TP_TIMEOUT", "60"))


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r computes on the r-th GPU from rank 0's (cuda:i + r) on a GPU host, on the CPU
    otherwise."""
    if device.type != "cuda":
        return torch.device("cpu")
    first = device.index if device.index is not None else torch.cuda.current_device()
    return torch.device("cuda", first + rank)


def check_free() -> None:
    """Refuses to start when this process already belongs to a process group."""
    if dist.is_available() and dist.is_initialized():
        raise ValueError("tensor_parallel_size > 1 needs this process's default "
                         "torch.distributed group, and one is already initialised (another "
                         "tensor-parallel engine, or the caller's own); close it first")


def join(store_path: str, rank: int, world: int, device: torch.device,
         timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Joins the group as ``rank``; ``device`` is the rank's own (rank_device). NCCL binds the
    group to it (``device_id``: its communicator is created at once, on that GPU, instead of
    on whichever device is current at the first collective)."""
    store = dist.FileStore(store_path, world)
    bound = {"device_id": device} if backend_for(device) == "nccl" else {}
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **bound)


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
