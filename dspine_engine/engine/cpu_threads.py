"""The engine's threads on the CPU: its kernels on ``cpu_threads``, torch's own ops apart.

Two thread pools share the cores during a CPU step: our kernels run on the chunk pool
(csrc/cpu/chunk_pool.h), the small torch ops between them (silu, mul, cat, index, argmax) on
torch's OpenMP team, whose workers spin after every region and take the core a chunk-pool
helper needs (and whose barrier waits a whole time slice for a worker that lost its core on a
shared machine). Our kernels carry every projection on the CPU (the quantised GGUF path's and,
since 2026-12-06, the fp32 / bf16 / fp16 ones: csrc/cpu/dense_gemm.h), so the engine runs
torch's ops on one thread inside its steps and its kernels on ``cpu_threads``: measured on 2
cores, the drafted rounds got faster on both paths and the autoregressive step on GGUF, with
fp32's within the noise (docs/DECISIONS.md, "CPU threads"). Outside a step the process's own
settings are back: the scope restores both counts.
"""
from __future__ import annotations

import contextlib
import os

import torch

from .. import ops

ENV = "DSPINE_CPU_THREADS"
MAX_THREADS = 4096  # what ops.set_cpu_threads accepts (kMaxKernelThreads, csrc/cpu/common.h)


def check_threads(value: int, name: str) -> None:
    """A count the kernels accept, else a ValueError naming where it came from."""
    if value > MAX_THREADS:
        raise ValueError(f"{name} must be at most {MAX_THREADS}, got {value}")


def env_threads() -> int | None:
    """``DSPINE_CPU_THREADS`` as a positive integer, None when unset (ValueError otherwise:
    EngineConfig.validate calls this, so a bad value fails before anything loads)."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ENV} must be a positive integer, got {value!r}")
    check_threads(int(value), ENV)
    return int(value)


class CpuThreads:
    """The thread counts of the engine's steps: ``kernels`` for our CPU kernels, and
    ``torch_ops`` for torch's intra-op threads (None: left as the process set them)."""

    def __init__(self, kernels: int, torch_ops: int | None):
        self.kernels, self.torch_ops = kernels, torch_ops

    @classmethod
    def for_engine(cls, device: torch.device, setting: int | None) -> "CpuThreads | None":
        """The engine's setting: None on CUDA (nothing changes there); on the CPU the kernels
        on ``setting`` (None: ``DSPINE_CPU_THREADS``, else torch's threads now: after a
        tensor-parallel engine gave this rank its share of the cores), torch's ops on one
        thread (every projection is ours)."""
        if device.type != "cpu":
            return None
        kernels = setting or env_threads() or torch.get_num_threads()
        return cls(kernels, 1)

    @contextlib.contextmanager
    def scope(self):
        """Runs the block under these counts and restores the caller's after it (nested
        scopes, an exception, another engine in the same process)."""
        saved_torch, saved_kernels = torch.get_num_threads(), ops.cpu_threads()
        ops.set_cpu_threads(self.kernels)
        if self.torch_ops is not None:
            torch.set_num_threads(self.torch_ops)
        try:
            yield
        finally:
            if self.torch_ops is not None:
                torch.set_num_threads(saved_torch)
            ops.set_cpu_threads(saved_kernels)


def scope(threads: CpuThreads | None):
    """``threads.scope()``, or a no-op for None (CUDA)."""
    return threads.scope() if threads is not None else contextlib.nullcontext()
