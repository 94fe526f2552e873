"""Each seat's round state on the device, so a round can start before the host has read the
previous one back (overlapped rounds, driver.py).

A round needs three numbers per sequence: its anchor's position (the target K/V length), the
anchor token and the draft-context rows still pending. The host's copies (cache_manager.py,
runner.py) change only when it reads a round's accepted lengths back; with overlapped rounds
that is one round late. So here the device keeps them per seat, advances them from the block
verify's own outputs (`advance`, queued right after it) and gathers them into the round's
inputs (`stage`, queued right after the upload): the next round's graphs then read what the
previous round decided without the host in between.

A seat whose sequence reached its length limit (max_tokens; the host learns it a round later)
is marked dead (length -1): a dead seat's rows run as padding rows, reading page 0 and
writing nothing, so a round launched before the host saw the end never writes past the
sequence's reservation. The padding seat is always dead. Stops (a stop token or string) are
the host's to see; the one extra round of such a sequence writes inside its reservation and
its output is dropped.
"""
from __future__ import annotations

import numpy as np
import torch

DEAD = -1


class SeatState:
    def __init__(self, seats: int, padding_seat: int, device: torch.device):
        self.device, self.padding_seat = device, padding_seat
        self.kv_len = torch.full((seats,), DEAD, dtype=torch.int32, device=device)
        self.pending = torch.zeros(seats, dtype=torch.int32, device=device)
        self.anchor = torch.zeros(seats, dtype=torch.int32, device=device)
        # The anchor position at which the sequence holds max_tokens: it is done there.
        self.end = torch.zeros(seats, dtype=torch.int32, device=device)

    def prefilled(self, seats: np.ndarray, lens: np.ndarray, end: np.ndarray,
                  first_tokens: torch.Tensor) -> None:
        """Sequences whose prompts were just written: the anchor is the first sampled token at
        the prompt's length, nothing is pending; ``end`` is where each is done by length
        (prompt + max_tokens - 1)."""
        index = torch.as_tensor(seats, dtype=torch.long).to(self.device)
        host = torch.as_tensor(np.stack([lens, end]), dtype=torch.int32).to(self.device)
        self.kv_len.index_copy_(0, index, host[0])
        self.end.index_copy_(0, index, host[1])
        self.pending.index_fill_(0, index, 0)
        self.anchor.index_copy_(0, index, first_tokens.to(torch.int32))

    def stage(self, inputs: dict, n: int) -> None:
        """Fills rows 0..n-1 of the round's device inputs (``seats`` already uploaded) with
        their seats' state; a dead seat's row becomes a padding row (the padding seat)."""
        seats = inputs["seats"][:n]
        index = seats.long()
        base = self.kv_len.index_select(0, index)
        inputs["base"][:n] = base
        inputs["pending"][:n] = self.pending.index_select(0, index)
        inputs["anchors"][:n] = self.anchor.index_select(0, index)
        seats.copy_(torch.where(base < 0, self.padding_seat, seats))

    def advance(self, inputs: dict, b: int, accepted: torch.Tensor, tokens: torch.Tensor) -> None:
        """After a round's block verify (its ``accepted`` counts and ``tokens`` [b, w]): each
        live seat's anchor moves past the accepted drafts to the bonus token, and the round's
        committed positions are the pending draft context (overlapped rounds are drafted
        rounds, whose draft forward wrote what was pending, or rounds without a draft). Rows
        of dead seats rewrite the padding seat's dead state."""
        index = inputs["seats"][:b].long()
        base = inputs["base"][:b]
        live = base >= 0
        step = accepted.to(torch.int32) + 1
        new_len = base + step
        new_len = torch.where(live & (new_len < self.end.index_select(0, index)), new_len, DEAD)
        bonus = tokens.gather(1, accepted.long()[:, None])[:, 0].to(torch.int32)
        zero = torch.zeros((), dtype=torch.int32, device=self.device)
        self.kv_len.index_copy_(0, index, new_len)
        self.anchor.index_copy_(0, index, torch.where(live, bonus, zero))
        self.pending.index_copy_(0, index, torch.where(live, step, zero))
