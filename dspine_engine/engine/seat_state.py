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

# The rows of the state, one column per seat; the first four are the round inputs' first four
# fields in their order (round_inputs.py): a round's rows are gathered in one call.
ROW_SEAT, KV_LEN, PENDING, ANCHOR, END = range(5)
DEAD = -1


class SeatState:
    def __init__(self, seats: int, padding_seat: int, device: torch.device):
        self.device = device
        # Per seat: the seat its rows run as (itself, or the padding seat once dead), the anchor
        # position (the target K/V length; -1 dead), the pending draft-context rows, the anchor
        # token, and the anchor position at which the sequence holds max_tokens (done there).
        self._dead = torch.tensor([padding_seat, DEAD, 0, 0, 0], dtype=torch.int32,
                                  device=device)[:, None]
        self.state = self._dead.repeat(1, seats)

    @property
    def kv_len(self) -> torch.Tensor:
        return self.state[KV_LEN]

    @property
    def pending(self) -> torch.Tensor:
        return self.state[PENDING]

    @property
    def anchor(self) -> torch.Tensor:
        return self.state[ANCHOR]

    def prefilled(self, seats: np.ndarray, lens: np.ndarray, end: np.ndarray,
                  first_tokens: torch.Tensor) -> None:
        """Sequences whose prompts were just written: the anchor is the first sampled token at
        the prompt's length, nothing is pending; ``end`` is where each is done by length
        (prompt + max_tokens - 1)."""
        zeros = np.zeros_like(lens)
        columns = torch.as_tensor(np.stack([seats, lens, zeros, zeros, end]),
                                  dtype=torch.int32).to(self.device)
        columns[ANCHOR] = first_tokens
        self.state.index_copy_(1, columns[ROW_SEAT].long(), columns)

    def stage(self, rows: torch.Tensor, n: int) -> None:
        """Fills columns 0..n-1 of the round's seat, base, pending and anchor inputs (``rows``,
        [4, capacity], its seats already uploaded) from their seats' state: a dead seat's
        column becomes a padding row's (the padding seat, base -1)."""
        rows[:, :n] = self.state[:ANCHOR + 1].index_select(1, rows[ROW_SEAT, :n])

    def advance(self, rows: torch.Tensor, b: int, accepted: torch.Tensor, tokens: torch.Tensor,
                context_written: bool = True) -> None:
        """After a round's block verify (its ``accepted`` counts and ``tokens`` [b, w]): each
        live seat's anchor moves past the accepted drafts to the bonus token, and the round's
        committed positions are pending draft context (after those still pending, unless the
        round wrote them: a drafted round, a plain round's catch-up, a round without a draft).
        A seat that reached its end, and every padding row, is (again) dead."""
        seats = rows[ROW_SEAT, :b]
        now = self.state.index_select(1, seats)
        step = accepted.to(torch.int32) + 1
        new_len = now[KV_LEN] + step
        alive = (now[KV_LEN] >= 0) & (new_len < now[END])
        bonus = tokens.gather(1, accepted.long()[:, None])[:, 0].to(torch.int32)
        pending = step if context_written else now[PENDING] + step
        moved = torch.stack([seats, new_len, pending, bonus, now[END]])
        self.state.index_copy_(1, seats.long(), torch.where(alive, moved, self._dead))
