"""What one forward pass needs to know about where its tokens live in a paged KV cache."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .recurrent_state import RecurrentMeta


@dataclass
class AttnMeta:
    """Describes a batch of sequences for `paged_attention` and `write_kv`.

    Tokens of sequence b are rows ``cu_q[b]:cu_q[b+1]`` of the flattened batch; their K/V go to
    ``slots``; after the write sequence b has ``kv_lens[b]`` keys. All tensors are int32 on the
    model's device; ``max_q_len`` is a host int so kernels launch without a sync, as is
    ``max_kv_len``, a bound on every ``kv_lens[b]`` when the caller knows one (0: the block
    table's width stands in; `ops.paged_attention` plans its split-KV grid from it and refuses a
    table narrower than it)."""

    positions: torch.Tensor  # [N]
    slots: torch.Tensor  # [N]
    block_tables: torch.Tensor  # [b, max_pages]
    kv_lens: torch.Tensor  # [b]
    cu_q: torch.Tensor  # [b + 1]
    max_q_len: int
    causal: bool = True
    recurrent: RecurrentMeta | None = None  # hybrid targets: where each sequence's state lives
    max_kv_len: int = 0
    # A prompt's prefill: these rows are computed here and nowhere else (whole prompts, no
    # preemption), so attention may take the Hopper prefill kernel (ops.paged_attention, prefill).
    prefill: bool = False

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]
