"""The recurrent-state cache of a hybrid target: one state slot per running sequence.

Beside the paged K/V of the attention layers, every Gated DeltaNet layer keeps a fixed-size state
per sequence (conv window + delta-rule state, and for speculative decoding the ReplaySSM ring of
the block's recurrence inputs; models/recurrent_state.py). Unlike K/V it does not grow with the
sequence, so a sequence holds exactly one slot from admission to its end and the pool is sized
in sequences. The cache manager drives it with the same calls as a paged cache: `admit` takes a
slot for a seat (zeroed: a prefill starts from the zero state), `commit` rolls the state forward
by the anchor and the accepted drafts only (ReplaySSM: the verify left the round's checkpoint in
place and filled the rings; the accepted prefix is replayed onto it), `release` gives it back.

Kernels address the state by slot; the runner maps a round's seats to slots on the device through
`slot_of_seat` (seats without a slot, the padding seat included, map to -1: skipped), so the map
is a persistent buffer that CUDA graphs read like the block tables.
"""
from __future__ import annotations

import numpy as np
import torch

from ..models.recurrent_state import RecurrentMeta, RecurrentState


class RecurrentCache:
    name = "recurrent state"

    def __init__(self, target, num_slots: int, max_seats: int, block: int):
        """``block`` tokens are verified per round (1: plain decoding, no rollback ring)."""
        if num_slots < 1:
            raise ValueError("the recurrent-state cache needs at least one slot")
        self.state: RecurrentState = target.new_state(num_slots, block)
        self.speculative = block > 1
        self.device = target.device
        self._free = list(range(num_slots - 1, -1, -1))
        self._host = np.full(max_seats + 1, -1, np.int32)  # seat -> slot (-1: none)
        cuda = self.device.type == "cuda"
        self.slot_of_seat = torch.from_numpy(self._host)
        if cuda:  # a device mirror, brought up to date by `flush`
            self.slot_of_seat = self.slot_of_seat.to(self.device, copy=True)
        self._stale = False

    @staticmethod
    def bytes_per_slot(target, block: int) -> int:
        """Memory one sequence's state takes (what sizing the pool budgets per sequence)."""
        return RecurrentState.bytes_per_slot(target.config, block, target.dtype)

    @property
    def num_slots(self) -> int:
        return self.state.num_slots

    @property
    def available(self) -> int:
        return len(self._free)

    # ------------------------------------------------------------------ the manager's calls
    def admit(self, seat: int) -> bool:
        """Gives ``seat`` a zeroed slot; False when every slot is taken (the request waits)."""
        if not self._free:
            return False
        slot = self._free.pop()
        self.state.reset([slot])
        self._host[seat] = slot
        self._stale = True
        return True

    def release(self, seat: int) -> None:
        slot = int(self._host[seat])
        if slot >= 0:
            self._free.append(slot)
            self._host[seat] = -1
            self._stale = True

    def commit(self, seats: np.ndarray, accepted: np.ndarray) -> None:
        """After a verify block: each seat's state advances by its anchor and ``accepted``
        drafts (a rejected draft leaves nothing behind). Plain decoding updated it in place."""
        if not self.speculative:
            return
        both = np.stack([self._host[seats], (accepted + 1).astype(np.int32)])
        dev = torch.from_numpy(both).to(self.device)
        self.state.commit(dev[0], dev[1])

    def flush(self) -> None:
        """Brings the device copy of the seat -> slot map up to date (after admissions)."""
        if self._stale and self.slot_of_seat.data_ptr() != self._host.ctypes.data:
            self.slot_of_seat.copy_(torch.from_numpy(self._host.copy()))
        self._stale = False

    # ------------------------------------------------------------------ addressing
    def slots(self, seats: np.ndarray) -> np.ndarray:
        """The slots of ``seats`` (host; -1 for a seat without one)."""
        return self._host[seats]

    def slot(self, seat: int) -> int:
        return int(self._host[seat])

    def meta(self, slots: torch.Tensor, checkpoint: bool) -> RecurrentMeta:
        """Where the sequences of a forward keep their state; ``slots`` int32 on the device.
        ``checkpoint``: a verify block (the state stays, the rings fill) when speculating."""
        return RecurrentMeta(self.state, slots, checkpoint and self.speculative)
