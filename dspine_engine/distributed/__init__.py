"""Tensor parallelism of the target over `torch.distributed` (gloo on CPUs; NCCL on GPUs next).

- layout.py: which sizes fit a target and a machine (checked before anything starts);
- sharding.py + parallel_dense.py: the Megatron cut of a built target, in place;
- group.py: the process group (rendezvous, timeout);
- protocol.py: what rank 0 sends the workers per forward;
- workers.py: rank 0's side (worker processes, liveness, failure, shutdown);
- worker.py: a worker process (ranks 1..N-1).
"""
from .layout import check_layout
from .workers import DrivenTarget, TensorParallelError, WorkerGroup

__all__ = ["check_layout", "DrivenTarget", "TensorParallelError", "WorkerGroup"]
