"""Which tensor-parallel layouts the engine can run, checked before any process starts.

A refused layout is a ValueError naming the number that does not fit and what would, raised
while nothing has been started or loaded (so a bad --tensor-parallel-size costs nothing).
"""
from __future__ import annotations

import os

import torch

from ..models.config import TargetConfig
from .group import rank_device


def available_ranks(device: torch.device) -> tuple[int, str]:
    """How many ranks the machine can host and of what: GPUs from rank 0's on CUDA (rank r
    takes the r-th after it), usable CPU cores else."""
    if device.type == "cuda":
        return torch.cuda.device_count() - rank_device(device, 0).index, "CUDA devices from rank 0's"
    try:
        return len(os.sched_getaffinity(0)), "CPU cores"
    except AttributeError:  # not Linux
        return os.cpu_count() or 1, "CPU cores"


def check_layout(size: int, cfg: TargetConfig, quantized: bool, device: torch.device) -> None:
    """Raises ValueError unless ``size`` ranks can shard this target on this machine."""
    from ..models.hybrid_config import HybridConfig

    if size == 1:
        return
    if device.type == "cuda" and os.environ.get("DSPINE_TP_CUDA", "0") != "1":
        # The code is written for NCCL (backend and device per rank), but it has not run on
        # several GPUs yet: refused rather than shipped untested (docs/DECISIONS.md). The first
        # multi-GPU runs (its GPU tests, benchmarks/tp_bench.py) ask for it with DSPINE_TP_CUDA=1.
        raise ValueError("tensor_parallel_size > 1 runs on the CPU (gloo) in this version; "
                         "multi-GPU tensor parallelism (NCCL) has not been run yet; use "
                         "device='cpu' or tensor_parallel_size=1 (DSPINE_TP_CUDA=1 runs it "
                         "anyway, for its first tests)")
    if quantized:
        raise ValueError("tensor_parallel_size > 1 cannot shard a quantised GGUF target (its "
                         "blocks run as packed tiles); pass dtype='float32' to shard the "
                         "dequantised weights, or use tensor_parallel_size=1")
    if isinstance(cfg, HybridConfig):
        raise ValueError("tensor_parallel_size > 1 does not support hybrid (Gated DeltaNet) "
                         "targets yet; use tensor_parallel_size=1")
    for name, value in (("num_attention_heads", cfg.num_heads),
                        ("num_key_value_heads", cfg.num_kv_heads),
                        ("intermediate_size", cfg.intermediate_size)):
        if value % size:
            divisors = [d for d in range(1, value + 1) if value % d == 0 and d <= 16]
            raise ValueError(f"tensor_parallel_size {size} does not divide the target's {name} "
                             f"({value}); each rank holds an equal share, so use one of "
                             f"{divisors}")
    have, what = available_ranks(device)
    if size > have:
        raise ValueError(f"tensor_parallel_size {size} exceeds the {have} {what} available "
                         "(one rank each)")
