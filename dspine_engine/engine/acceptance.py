"""The acceptance statistics of dynamic verification (spec_policy.py): what each request is
expected to gain from verifying ``k`` drafts.

Per seat, decayed counts of the draft positions verified (tried) and accepted (hit); per
position the conditional acceptance ``a_j = P(d_j accepted | d_1..d_{j-1} accepted)`` is the
seat's counts shrunk toward the engine-wide counts (themselves shrunk toward a neutral prior),
and ``E(w) = 1 + sum_k prod_{j<=k} a_j`` is the tokens a round verifying ``w`` commits.

The policy reads these every round between two forwards, on the host, where a numpy call costs
about a microsecond whatever its size: so the state is laid out for few calls, not for reading.
The tried and hit counts are one array; the running batch's rows are held apart, in batch order,
while the batch is the same sequences (a round forgets and counts them in place, with no gather
or scatter and no ownership check; they go back to the per-seat table when the batch changes);
an observation is added from a table indexed by the accepted count (no per-round masks); the
shrinkage target is recomputed only after the global counts moved. None of this changes a
number: every count and estimate is computed by the same operations in the same order as a
recount would (tests/test_spec_policy.py replays random rounds to check).
"""
from __future__ import annotations

import operator

import numpy as np

from .cache_manager import CacheManager

TRIED, HIT = 0, 1  # the two rows of a counts array


def observation_table(width: int, drafts: int) -> np.ndarray:
    """``[accepted, 2, drafts]``: what a round verifying ``width - 1`` drafts adds to a seat's
    counts when ``accepted`` of them were accepted: drafts 1..min(accepted + 1, width - 1)
    tried, the first ``accepted`` hit."""
    pos, n = np.arange(drafts), np.arange(width)[:, None]
    table = np.zeros((width, 2, drafts))
    table[:, TRIED] = (pos <= n) & (pos < width - 1)
    table[:, HIT] = pos < n
    return table


class AcceptanceStats:
    def __init__(self, block: int, widths: list[int], max_seats: int, prior: float,
                 prior_weight: float, global_weight: float, forget: float,
                 global_forget: float):
        self.drafts = drafts = block - 1
        self._counts = np.zeros((max_seats + 1, 2, drafts))  # per seat: tried, hit
        self._owner = np.full(max_seats + 1, None, object)  # the seat's sequence
        # The running batch's rows live in _rows (its counts, in batch order) and are written
        # back to _counts when the batch changes: a round forgets and counts them in place.
        self._batch: list = []
        self._seats = np.zeros(0, np.int64)
        self._seats_key = b""  # _seats as bytes: an observed group is the batch when equal
        self._rows = np.zeros((0, 2, drafts))
        self._row_of = np.full(max_seats + 1, -1)  # a seat's row in _rows, -1 if none
        self._global = np.zeros((2, drafts))
        # The global counts' prior: global_weight positions tried, prior of them hit.
        self._global_prior = np.array([[global_weight], [global_weight * prior]])
        # What a seat's counts are shrunk with: prior_weight positions tried, that many times
        # the global acceptance hit (stale once the global counts moved).
        self._shrink = np.full((2, drafts), float(prior_weight))
        self._shrink_stale = True
        self.prior_weight, self.forget_rate, self.global_forget = prior_weight, forget, \
            global_forget
        self._observed = {w: observation_table(w, drafts) for w in widths if w > 1}
        self._cols = np.array([w for w in widths if w > 1]) - 2  # E(w) - 1 = cumsum(reach)[w - 2]

    # ----------------------------------------------------------------- a round
    def begin_round(self, seqs) -> np.ndarray:
        """The counts of the batch ``seqs``, ``[b, 2, drafts]``, after the round's forgetting.
        A batch of the same sequences as the last one keeps its rows (nothing is looked up);
        else seats a new request took start from zero (the global estimate)."""
        if len(seqs) != len(self._batch) or not all(map(operator.is_, seqs, self._batch)):
            self._take_batch(seqs)
        self._rows *= self.forget_rate
        return self._rows

    def observe(self, seats: np.ndarray, width: int, accepted: np.ndarray) -> None:
        """Counts a round that verified ``width - 1`` drafts of each of ``seats``."""
        if width == 1:
            return
        seen = self._observed[width][accepted]
        if seats.tobytes() == self._seats_key:  # the whole batch, in its order
            self._rows += seen
        else:
            rows = self._row_of[seats]
            if (rows >= 0).all():
                self._rows[rows] += seen
            else:  # seats outside the batch (not the engine's way): through the table
                self._put_back()
                self._counts[seats] += seen
                self._rows = self._counts[self._seats]
        self._global *= self.global_forget
        self._global += seen[0] if len(seen) == 1 else seen.sum(0)  # (one row: no reduction)
        self._shrink_stale = True

    def counts(self, seats: np.ndarray) -> np.ndarray:
        """The counts of ``seats`` as they are."""
        self._put_back()
        return self._counts[seats]

    def _take_batch(self, seqs) -> None:
        self._put_back()
        self._row_of[self._seats] = -1
        self._seats = CacheManager.seats_of(seqs)
        self._adopt(seqs, self._seats)
        self._batch = list(seqs)
        self._seats_key = self._seats.tobytes()
        self._rows = self._counts[self._seats]
        self._row_of[self._seats] = np.arange(len(seqs))

    def _put_back(self) -> None:
        self._counts[self._seats] = self._rows

    # ----------------------------------------------------------------- estimates
    def global_acceptance(self) -> np.ndarray:
        """Engine-wide conditional acceptance by position (the prior of every request)."""
        both = self._global + self._global_prior
        return both[HIT] / both[TRIED]

    def expected(self, counts: np.ndarray, widths=None) -> np.ndarray:
        """``E[j, i]``: tokens committed by the sequence of ``counts[i]`` verifying
        ``widths[j]`` tokens (each > 1; default the drafted widths the stats were built for),
        ``[len(widths), b]``. Array methods, not numpy's functions: their wrappers cost more
        than the work at these sizes."""
        cols = self._cols if widths is None else np.asarray(widths) - 2
        shrunk = counts + self._shrink_now()
        reach = (shrunk[:, HIT] / shrunk[:, TRIED]).cumprod(1)  # P(d_1..d_k accepted)
        gains = reach.cumsum(1).T.take(cols, 0)
        gains += 1
        return gains

    def _shrink_now(self) -> np.ndarray:
        if self._shrink_stale:
            np.multiply(self.global_acceptance(), self.prior_weight, out=self._shrink[HIT])
            self._shrink_stale = False
        return self._shrink

    def _adopt(self, seqs, seats: np.ndarray) -> None:
        """A seat taken by a new request starts from the global estimate."""
        ids = np.empty(len(seqs), object)
        ids[:] = seqs
        fresh = np.fromiter((a is not b for a, b in zip(self._owner[seats], ids)), bool,
                            len(seqs))
        if fresh.any():
            rows = seats[fresh]
            self._counts[rows] = 0
            self._owner[rows] = ids[fresh]
