"""The recurrent state of a hybrid target's Gated DeltaNet layers, for a number of sequence slots.

Per linear layer and slot: the convolution window (the last K-1 conv inputs) and the delta-rule
state S [Hv, dk, dv] (fp32). For speculative decoding (ReplaySSM, `ring_len` = the verify block
B > 1) each slot also has a ring of the block's per-token recurrence inputs (k^, u, g) and the
conv window is followed by room for the block's conv inputs. A verify block leaves the window and
S untouched (they are the round's checkpoint) and fills the rings; `commit` then moves the window
and replays the accepted prefix onto S. Layers are stacked in one tensor per kind, so a commit is
two launches whatever the depth.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import ops


class RecurrentState:
    def __init__(self, cfg, num_slots: int, ring_len: int, dtype: torch.dtype, device):
        """``cfg`` is a HybridConfig; ``ring_len`` 0 or 1 means no speculation (no rings)."""
        self.num_slots = num_slots
        self.kernel = cfg.conv_kernel
        self.ring_len = ring_len if ring_len > 1 else 0
        layers, f32 = cfg.num_linear_layers, dict(dtype=torch.float32, device=device)
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.conv = torch.zeros(layers, num_slots, cfg.conv_kernel - 1 + self.ring_len,
                                cfg.conv_dim, dtype=dtype, device=device)
        self.ssm = torch.zeros(layers, num_slots, hv, dk, dv, **f32)
        r = self.ring_len
        self.ring_k = torch.zeros(layers, num_slots, r, hk, dk, **f32)
        self.ring_u = torch.zeros(layers, num_slots, r, hv, dv, **f32)
        self.ring_g = torch.zeros(layers, num_slots, r, hv, **f32)

    @staticmethod
    def bytes_per_slot(cfg, ring_len: int, dtype: torch.dtype) -> int:
        """Memory one sequence's state takes (what admission budgets per slot)."""
        r = ring_len if ring_len > 1 else 0
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv = (cfg.conv_kernel - 1 + r) * cfg.conv_dim * torch.finfo(dtype).bits // 8
        fp32 = 4 * (hv * dk * dv + r * (hk * dk + hv * dv + hv))
        return cfg.num_linear_layers * (conv + fp32)

    def reset(self, slots: list[int]) -> None:
        """Zeroes the state of slots handed to new sequences (a prefill starts from zeros)."""
        if slots:
            idx = torch.as_tensor(slots, dtype=torch.long, device=self.conv.device)
            self.conv[:, idx] = 0
            self.ssm[:, idx] = 0

    def commit(self, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """After a verify block: every layer's state advances by the first ``num_accepted[b]``
        tokens of the block (int32 on the device; the anchor counts, so 1..B)."""
        ops.conv_state_commit(self.conv, slots, num_accepted, self.kernel)
        ops.gated_delta_replay(self.ssm, self.ring_k, self.ring_u, self.ring_g, slots,
                               num_accepted)

    def layer(self, j: int) -> tuple[torch.Tensor, ...]:
        """(conv window, S, ring_k, ring_u, ring_g) of linear layer j (views)."""
        return self.conv[j], self.ssm[j], self.ring_k[j], self.ring_u[j], self.ring_g[j]


@dataclass
class RecurrentMeta:
    """Where the sequences of a forward keep their recurrent state.

    ``slots [b]`` int32 (a negative slot is padding: skipped). ``checkpoint`` marks a verify
    block: the state is kept and the rings are filled, for `RecurrentState.commit`."""

    state: RecurrentState
    slots: torch.Tensor
    checkpoint: bool = False
