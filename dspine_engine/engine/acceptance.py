"""The acceptance statistics of dynamic verification (spec_policy.py): what each request is
expected to gain from verifying ``k`` drafts.

Per seat, decayed counts of the draft positions verified (tried) and accepted (hit); per
position the conditional acceptance ``a_j = P(d_j accepted | d_1..d_{j-1} accepted)`` is the
seat's counts shrunk toward the engine-wide counts (themselves shrunk toward a neutral prior;
with ``chain_prior``, only at the first position and toward the previous position's estimate
after it: global_acceptance),
and ``E(w) = 1 + sum_k prod_{j<=k} a_j`` is the tokens a round verifying ``w`` commits.

By width: where a w-token round drafts from a w-token block (``draft_block="verified"``, the
CPU) the proposals, so their acceptance by position, depend on w (measured on the CPU, greedy:
d1..d3 accepted 0.739 / 0.500 / 0.383 of rounds at w = 4, 0.711 / 0.438 / 0.325 at w = 8), and
counts pooled over widths priced an 8-token round with the 4-token rounds' d1..d3. So the
engine-wide counts are also kept per drafted width (each forgotten when its width is observed),
and a width's estimate is the seat's pooled ``a_j`` times the width's factor: its hits at
position j over the hits the pooled rate predicts for its tries there, both plus
``width_weight`` pseudo-hits (E(w) capped at w: a seat's a_j times a factor above 1 may pass
1). The request keeps its own level; the dependence on the width is the drafter's, learnt
from every request. The factor is 1 for a width not observed yet, for one that holds all observations, and where
nothing was hit; with whole-block drafting the factors stay near 1. The factors are refreshed
every ``FACTOR_EVERY`` drafted observations (when an estimate is next read), not every round:
they follow hundreds of rounds, and refreshing them is most of their host cost.

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
FACTOR_EVERY = 8  # drafted observations between two refreshes of the width factors


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
                 global_forget: float, width_weight: float = 8.0, chain_prior: bool = False):
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
        # The global counts' prior: global_weight positions tried, prior of them hit (with
        # chain_prior: at the first position; the estimate of the position before at the others).
        self._global_weight, self._prior = float(global_weight), float(prior)
        self.chain_prior = chain_prior
        # What a seat's counts are shrunk with: prior_weight positions tried, that many times
        # the global acceptance hit (stale once the global counts moved).
        self._shrink = np.full((2, drafts), float(prior_weight))
        self._shrink_stale = True
        self.prior_weight, self.forget_rate, self.global_forget = prior_weight, forget, \
            global_forget
        drafted = [w for w in widths if w > 1]
        self._observed = {w: observation_table(w, drafts) for w in drafted}
        self._cols = np.array(drafted) - 2  # E(w) - 1 = cumsum(reach)[w - 2]
        # The engine-wide counts per drafted width; the gain matrix: row j the cumulative
        # factors of width drafted[j] over the positions it verifies (0 beyond), so that
        # E(w) - 1 = reach . row (the reach of the seat's pooled a_j).
        self.width_weight = float(width_weight)
        self._width_index = {w: i for i, w in enumerate(drafted)}
        self._by_width = np.zeros((2, len(drafted), drafts))  # tried, hit
        self._factor = np.ones((len(drafted), drafts))
        self._scratch = np.zeros((3, len(drafted), drafts))
        # The factors are refreshed every FACTOR_EVERY drafted observations (they follow
        # hundreds of rounds; refreshing them every round cost ~6 us of the policy's ~16).
        self._until_factors = FACTOR_EVERY
        self._verifies = np.arange(drafts) < self._cols[:, None] + 1  # [width, position]
        self._gain_matrix = self._verifies.astype(float)  # the factors' cumulative products
        self._caps = np.array(drafted, float)[:, None]  # E(w) <= w
        # A width's row in expected(widths=...): its own, else the next wider drafted width's
        # (the block it would be drafted from is not known), else none (pooled).
        self._factor_row = {w: next((i for i, v in enumerate(drafted) if v >= w), None)
                            for w in range(2, block + 1)}

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
        total = seen[0] if len(seen) == 1 else seen.sum(0)  # (one row: no reduction)
        self._global *= self.global_forget
        self._global += total
        mine = self._by_width[:, self._width_index[width]]
        mine *= self.global_forget
        mine += total
        self._shrink_stale = True
        self._until_factors -= 1

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
        """Engine-wide conditional acceptance by position (the prior of every request): each
        position's counts shrunk toward the neutral prior; with ``chain_prior`` only the first
        one's, each later position's toward the estimate of the one before it. Chained, a
        position no round has verified yet (beyond every width the policy used) is expected to
        be accepted as the deepest verified one is: with whole-block drafting (the GPU) a wider
        round verifies the same chain further, and with the flat prior a policy that began at 8
        tokens priced the 16-token round's extra drafts at coin flips and never verified them
        (H200, c = 1, where every width costs about one round: auto 0.90x fixed). Flat where a
        w-token round drafts a w-token block (the CPU): a wider round is another block, and
        several decode steps, and the optimism made every fresh engine pay for wide rounds
        before it learnt (docs/DECISIONS.md). (The chain is a loop of ``drafts`` floats: cheaper
        than numpy's calls at this size.)"""
        weight = self._global_weight
        if not self.chain_prior:
            return (self._global[HIT] + weight * self._prior) / (self._global[TRIED] + weight)
        estimate, out = self._prior, []
        for tried, hit in zip(*self._global.tolist()):
            estimate = (hit + weight * estimate) / (tried + weight)
            out.append(estimate)
        return np.array(out)

    def width_acceptance(self) -> np.ndarray:
        """Engine-wide conditional acceptance by position of each drafted width (the pooled
        estimate times the width's factor), ``[drafted widths, drafts]``."""
        self._shrink_now()
        return self.global_acceptance() * self._factor

    def expected(self, counts: np.ndarray, widths=None) -> np.ndarray:
        """``E[j, i]``: tokens committed by the sequence of ``counts[i]`` verifying
        ``widths[j]`` tokens (each > 1; default the drafted widths the stats were built for),
        ``[len(widths), b]``: 1 + the sum over the verified positions of the seat's reach
        (the product of its a_j) times the width's cumulative factor, at most ``widths[j]``.
        Array methods, not numpy's functions: their wrappers cost more than the work at these
        sizes."""
        shrunk = counts + self._shrink_now()
        reach = (shrunk[:, HIT] / shrunk[:, TRIED]).cumprod(1)  # P(d_1..d_k accepted)
        if widths is None:
            matrix, caps = self._gain_matrix, self._caps
        else:
            factors = np.array([np.ones(self.drafts) if self._factor_row[w] is None else
                                self._factor[self._factor_row[w]] for w in widths])
            matrix = factors.cumprod(1) * (np.arange(self.drafts) < np.asarray(widths)[:, None]
                                           - 1)
            caps = np.asarray(widths, float)[:, None]
        gains = matrix @ reach.T
        gains += 1
        np.minimum(gains, caps, out=gains)
        return gains

    def _shrink_now(self) -> np.ndarray:
        if self._shrink_stale:
            np.multiply(self.global_acceptance(), self.prior_weight, out=self._shrink[HIT])
            self._shrink_stale = False
        if self._until_factors <= 0:
            self._until_factors = FACTOR_EVERY
            # A width's factor: its hits over the hits the pooled counts' rate predicts for its
            # tries, each plus width_weight (1 for a width never observed, for one that holds
            # every observation, and wherever nothing was hit yet).
            # (In place into scratch rows: the allocations cost more than the arithmetic.)
            hits, tried, both = self._by_width[HIT], self._by_width[TRIED], self._global
            rate, num, den = self._scratch[0, 0], self._scratch[1], self._scratch[2]
            np.divide(both[HIT], np.maximum(both[TRIED], 1e-9, out=rate), out=rate)
            np.multiply(tried, rate, out=den)
            den += self.width_weight
            np.add(hits, self.width_weight, out=num)
            np.divide(num, den, out=self._factor)
            np.multiply(self._factor.cumprod(1, out=num), self._verifies, out=self._gain_matrix)
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
