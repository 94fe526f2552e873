"""What rank 0 tells the workers, and how a forward's inputs travel.

Control messages are small tuples on each worker's pipe (``("setup", ...)``, ``("forward",
header)``, ``("stop",)``; a worker answers ``("ready",)`` or ``("error", text)``). A forward's
tensors (tokens, the attention metadata, the logit rows) go in one int64 tensor through one
`torch.distributed` broadcast, so a step costs one pipe message and one collective before the
sharded forward itself. The layout is written once here, for both sides.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..models.attention_meta import AttnMeta


@dataclass(frozen=True)
class ForwardHeader:
    """The shapes and host scalars of one target forward."""

    tokens: int
    batch: int
    table_width: int
    max_q_len: int
    causal: bool
    logit_rows: int  # -1: logits of every row
    max_kv_len: int = 0  # AttnMeta's: the split plan's bound, the same on every rank
    prefill: bool = False  # AttnMeta's: every rank's attention takes the same kernel

    @property
    def sizes(self) -> list[int]:
        """Lengths of the packed pieces: tokens, positions, slots, block tables, kv_lens, cu_q,
        logit rows."""
        n, b = self.tokens, self.batch
        return [n, n, n, b * self.table_width, b, b + 1, max(self.logit_rows, 0)]


def pack_forward(tokens: torch.Tensor, meta: AttnMeta,
                 logit_rows: torch.Tensor | None) -> tuple[ForwardHeader, torch.Tensor]:
    if meta.recurrent is not None:  # hybrid targets are refused for TP > 1 (layout.py)
        raise ValueError("a recurrent-state forward cannot be tensor-parallel")
    b, width = meta.block_tables.shape
    header = ForwardHeader(tokens.shape[0], b, width, meta.max_q_len, meta.causal,
                           -1 if logit_rows is None else logit_rows.shape[0], meta.max_kv_len, meta.prefill)
    pieces = [tokens, meta.positions, meta.slots, meta.block_tables, meta.kv_lens, meta.cu_q]
    if logit_rows is not None:
        pieces.append(logit_rows)
    return header, torch.cat([p.reshape(-1).to(torch.int64) for p in pieces])


def unpack_forward(header: ForwardHeader, flat: torch.Tensor):
    """The worker's side: ``(tokens, meta, logit_rows)`` as rank 0 passed them."""
    tokens, positions, slots, tables, kv_lens, cu_q, rows = flat.split(header.sizes)
    i32 = torch.int32
    meta = AttnMeta(positions.to(i32), slots.to(i32),
                    tables.to(i32).view(header.batch, header.table_width), kv_lens.to(i32),
                    cu_q.to(i32), header.max_q_len, causal=header.causal, max_kv_len=header.max_kv_len,
                    prefill=header.prefill)
    return tokens.clone(), meta, (rows.clone() if header.logit_rows >= 0 else None)


def send_forward(flat: torch.Tensor) -> None:
    dist.broadcast(flat, src=0)


def receive_forward(header: ForwardHeader, device) -> torch.Tensor:
    return receive_into(torch.empty(sum(header.sizes), dtype=torch.int64, device=device))


def receive_into(flat: torch.Tensor) -> torch.Tensor:
    """Fills ``flat`` with rank 0's packed inputs (a worker's static buffer inside a graph)."""
    dist.broadcast(flat, src=0)
    return flat
