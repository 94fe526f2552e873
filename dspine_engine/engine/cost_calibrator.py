"""Online calibration of the auto policy's verify-cost model (spec_policy.py, verify_cost.py).

The cost profile is measured once, at start-up, on padding rows; on a busy CPU one probe of a
point can be far off (a width-8 round read 2.1-3.1 plain steps across profiles of one build),
and a wrong profile makes the policy choose badly for the whole run. The calibrator corrects
it from the rounds the engine runs: each round's wall time (staging to the accepted lengths on
the host, the timestamps `speculative._verify_group` takes around what the profile times) is
compared with the profile's prediction for its width and batch, and per key (width, batch
bucket) the last ``window`` values of ``log(observed / predicted)`` are kept. Once a key has
``min_observations`` of them, its cost is the profile's times ``exp(median)``: the median,
because a round now and then carries work the profile leaves out (a plain round's batched
draft-context catch-up, once per block of them) or a busy spell of the machine, and the mean
of logs would follow those.

The policy compares costs as ratios (tokens per second of one plan against another), so a
width's own correction is used only once the plain step's at that bucket is known too: a
slowdown common to every width (a busier machine, longer contexts than the probe's) must not
pass for a cheaper or dearer width. Until then a bucket keeps the profile; once its plain step
is known, a width without enough observations of its own moves with it (the profile's ratio to
the plain step is kept). To get those observations the calibrator steers rounds the policy
drafts (`steer`): every ``plain_every``-th one runs plain while the plain step of its batch is
unknown, and later every ``explore_every``-th one verifies a neighbouring width (alternately
the narrower and the wider drafted one) instead of the chosen one, and every
``refresh_every``-th one (midway between two explorations) runs plain again, so the plain step
keeps being measured for as long as the policy drafts. The plain step's window also forgets by
age: an observation older than ``plain_age`` rounds of its bucket is dropped (the newest
``min_observations`` always stay), so a plain step measured in a busy spell is replaced by the
refresh rounds within ~``plain_age`` rounds, however many of the spell's rounds it held (every
price is in plain steps: a stale slow one made every drafted width look cheap, and the policy
then never ran the plain rounds that would have re-measured it). Every steered round is an
ordinary round at another width, so output stays lossless.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

TOLERANCE = 0.01  # in log units: a correction's change smaller than this is not applied


def bucket(batch: int) -> int:
    """The bucket of a batch size: 0 for 1 (and 0), k for 2^(k-1) < batch <= 2^k."""
    return max(batch - 1, 0).bit_length()


class CostCalibrator:
    def __init__(self, base: np.ndarray, widths: list[int], window: int = 31,
                 min_observations: int = 5, plain_every: int = 4, explore_every: int = 16,
                 refresh_every: int = 32, plain_age: int = 256):
        """``base[j, m]``: the profile's predicted seconds of a round of ``m`` sequences at
        ``widths[j]`` tokens each (m = 0..max batch; widths sorted, widths[0] = 1)."""
        if widths[0] != 1:
            raise ValueError(f"the widths {widths} must start with the plain step (1)")
        self.widths = list(widths)
        self._row = {w: j for j, w in enumerate(self.widths)}
        self._base = base
        buckets = bucket(base.shape[1] - 1) + 1
        self._bucket_of = np.array([bucket(m) for m in range(base.shape[1])])
        self._logs = [[deque(maxlen=window) for _ in range(buckets)] for _ in self.widths]
        self._count = np.zeros((len(self.widths), buckets), np.int64)  # all observations
        self._rounds = [0] * buckets  # observations of any width per bucket (the plain's clock)
        self._stamps = [deque(maxlen=window) for _ in range(buckets)]  # the plain logs' _rounds at record
        self._age = plain_age
        self._known = np.zeros((len(self.widths), buckets), bool)  # min_observations reached
        self._factor = np.ones((len(self.widths), buckets))  # exp(median) of known keys
        self._min = min_observations
        self._plain_every, self._explore_every = plain_every, explore_every
        self._refresh_every = refresh_every
        self._steered = 0  # drafted rounds seen by `steer`
        self._explored = 0  # neighbours explored (their parity picks the side)
        self.version = 0  # bumped whenever `table()` changes

    # ----------------------------------------------------------------- observations
    def record(self, width: int, batch: int, seconds: float) -> None:
        """One round of ``batch`` sequences at ``width`` tokens took ``seconds``."""
        j = self._row.get(width)
        if j is None or batch < 1 or batch >= self._base.shape[1] or not seconds > 0:
            return
        k = bucket(batch)
        logs = self._logs[j][k]
        logs.append(math.log(seconds / self._base[j, batch]))
        self._count[j, k] += 1
        self._rounds[k] += 1
        if j == 0:  # the plain step: its window is also bounded by age (see the module doc)
            stamps = self._stamps[k]
            stamps.append(self._rounds[k])  # (both deques drop their oldest at the window)
            while len(logs) > self._min and stamps[0] <= self._rounds[k] - self._age:
                logs.popleft()
                stamps.popleft()
        if len(logs) >= self._min:
            # Moves of the median under 1% are left out of the table: with noisy rounds it
            # wanders that much nearly every round, and each change costs the policy a
            # rebuild of its rate terms (~10 us of host time, as much as a plan).
            median = statistics.median(logs)
            if not self._known[j, k] or abs(median - math.log(self._factor[j, k])) > TOLERANCE:
                self._factor[j, k], self._known[j, k] = math.exp(median), True
                self.version += 1

    def factors(self) -> np.ndarray:
        """``[widths, buckets]``: what each key's profile cost is multiplied by (1 until the
        bucket's plain step is known; then a key's own correction if it has one, else the
        plain step's)."""
        own = np.where(self._known, self._factor, self._factor[0])
        return np.where(self._known[0], own, 1.0)

    def table(self) -> np.ndarray:
        """The calibrated ``base``: predicted seconds ``[widths, m]``."""
        return self._base * self.factors()[:, self._bucket_of]

    # ----------------------------------------------------------------- steering
    def steer(self, width: int, batch: int) -> int:
        """The width a round the policy chose to draft at ``width`` (batch ``batch``) runs at:
        plain every ``plain_every``-th such round while the plain step of its bucket is
        unknown; once it is known, plain again every ``refresh_every``-th (at the 3/4 mark of
        each ``refresh_every`` rounds, off the explorations' multiples of 16 by default), a
        neighbouring drafted width every ``explore_every``-th, else ``width``."""
        self._steered += 1
        k = bucket(batch)
        if not self._known[0, k]:
            return 1 if self._steered % self._plain_every == 0 else width
        if self._steered % self._refresh_every == self._refresh_every * 3 // 4:
            return 1
        if self._steered % self._explore_every:
            return width
        j = self._row[width]
        sides = [n for n in (j - 1, j + 1) if 1 <= n < len(self.widths)]
        if not sides:
            return width
        self._explored += 1
        return self.widths[sides[self._explored % len(sides)]]

    # ----------------------------------------------------------------- reporting
    def summary(self) -> dict | None:
        """The calibrated costs at the most observed batch bucket, in plain steps of that
        bucket (the batch is the bucket's largest size), beside the profile's, and the
        observations per width there; None before any round was recorded."""
        counts = self._count.sum(0)
        if not counts.any():
            return None
        k = int(counts.argmax())
        batch = min(2 ** k, self._base.shape[1] - 1)
        calibrated, profile = self.table()[:, batch], self._base[:, batch]
        return {"batch": batch, "plain_step_seconds": float(calibrated[0]),
                "costs": {w: round(float(c / calibrated[0]), 3)
                          for w, c in zip(self.widths, calibrated)},
                "profile": {w: round(float(c / profile[0]), 3)
                            for w, c in zip(self.widths, profile)},
                "observations": {w: int(n) for w, n in zip(self.widths, self._count[:, k])}}
