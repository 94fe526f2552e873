"""The verification policy: how many draft tokens each sequence verifies in a round.

`FixedPolicy` verifies the same number every round (``num_speculative_tokens``, by default the
whole block). `AutoPolicy` (dynamic verification) plans each round from two things:
- the cost of a round, ``cost(tokens, batch)`` (verify_cost.py: measured once, cached;
  with ``calibrate``, corrected online from the rounds' observed times, cost_calibrator.py,
  which also makes a drafted round now and then plain or a neighbouring width to measure it);
- the acceptance expected for each request: per-position conditional acceptance
  ``a_j = P(d_j accepted | d_1..d_{j-1} accepted)``, counted online per request and shrunk
  toward the engine-wide counts (the drafter's global statistics, themselves starting from a
  neutral prior; with ``chain_prior``, whole-block drafting's, only the first position and the
  others from the previous position's estimate, so drafts no round has verified are expected
  like the deepest verified), with exponential forgetting, so a request that stopped being
  verified drifts back to the global estimate and is tried again; per verify width, the
  engine-wide acceptance of that width's rounds as a factor on it (a w-token round may draft
  from a w-token block, whose proposals depend on w: acceptance.py).

A round verifies ``w`` tokens per sequence (the anchor + ``w - 1`` drafts; ``w = 1`` is a
plain decode step), ``w`` from a few buckets so CUDA graphs apply. The plan is at most two
groups: the ``m`` sequences with the highest expected gain verify ``w`` tokens, the rest decode
one; (w, m) maximise expected committed tokens per predicted second,
``(sum_top_m E_i(w) + (b - m)) / (cost(w, m) + cost(1, b - m))``, against plain decoding of the
whole batch, and only when that beats plain decoding by the factor ``min_gain`` (a predicted
gain within the estimates' error is as often a loss). Given a cost profile and the statistics
the plan is deterministic. It is made
afresh every round from the statistics as they are (forgetting and the global counts move every
estimate every round), in a few numpy calls: the rate denominators of each batch size are
computed once, and every width and split is scored in one pass. When plain
decoding wins for a while, an exploration round verifies, for everyone, the width closest to
paying (the best predicted rate with the whole batch drafting), so estimates never freeze:
after ``explore_interval`` plain rounds (doubling while it keeps not paying), and only once the
plain rounds since the last drafted one have cost enough that the exploration's predicted loss
(its cost beyond plain decoding of the tokens it is expected to commit) is at most
``explore_budget`` of them. The width closest to paying is the cheapest probe and the one whose
outcome decides whether drafting starts: where wide rounds cost many decode steps (a CPU) the
widest bucket lost several steps a probe, so probes came once in hundreds of rounds and a
request that would have paid at 4 tokens was never drafted.

Any plan is lossless: verifying fewer drafts only cuts the accepted prefix shorter (the token
at the cut is the target's own choice at that position).
"""
from __future__ import annotations

import numpy as np

from .acceptance import AcceptanceStats
from .cost_calibrator import CostCalibrator
from .verify_cost import CostProfile

# Tokens verified per sequence (anchor included) that a round may use.
BUCKETS = (1, 2, 4, 8, 16)
POLICIES = ("auto", "fixed")


def verify_widths(block: int, max_drafts: int, policy: str) -> list[int]:
    """The verify widths an engine needs (graphs are captured at each): for ``fixed`` the one
    width ``max_drafts + 1``; for ``auto`` the buckets up to it, plus it."""
    top = max_drafts + 1
    if block == 1:
        return [1]
    if policy == "fixed":
        return [top]
    return sorted({w for w in BUCKETS if w <= top} | {1, top})


class FixedPolicy:
    """Every sequence verifies ``width`` tokens every round."""

    name = "fixed"

    def __init__(self, width: int):
        self.width = width

    def plan(self, seqs) -> list[tuple[int, list]]:
        return [(self.width, seqs)]

    def observe(self, seats, width: int, accepted: np.ndarray,
                seconds: float | None = None) -> None:
        pass


class AutoPolicy:
    name = "auto"

    def __init__(self, block: int, widths: list[int], cost: CostProfile, max_seats: int,
                 max_batch: int, prior: float = 0.5, prior_weight: float = 4.0,
                 global_weight: float = 2.0, forget: float = 0.97, global_forget: float = 0.999,
                 explore_interval: int = 8, max_explore_interval: int = 1024,
                 explore_budget: float = 0.02, calibrate: bool = False,
                 width_weight: float = 8.0, min_gain: float = 1.0, chain_prior: bool = False):
        if 1 not in widths or any(w > block for w in widths):
            raise ValueError(f"verify widths {widths} must include 1 and not exceed the block "
                             f"of {block}")
        cost.check(widths)
        self.widths = sorted(widths)
        self.stats = AcceptanceStats(block, self.widths, max_seats, prior, prior_weight,
                                     global_weight, forget, global_forget, width_weight,
                                     chain_prior)
        # One row per width of predicted seconds of a round of m sequences (m = 0..max);
        # _cost[w] is width w's row, _drafted_cost the drafted widths' rows (one array, so a
        # plan scores every width at once).
        costs = np.array([[cost.cost(w, m) for m in range(max_batch + 1)] for w in self.widths])
        # With ``calibrate`` the costs follow the rounds' observed times (cost_calibrator.py).
        self.calibrator = CostCalibrator(costs, self.widths) if calibrate else None
        self._cost_version = 0
        self._use_costs(costs)
        self._base_interval = explore_interval
        self._interval = explore_interval
        self._max_interval = max_explore_interval
        self._explore_budget = explore_budget
        self._min_gain = min_gain
        self._since_drafted = 0
        self._plain_seconds = 0.0  # predicted time of the plain rounds since the last drafted
        # ... in the profile's seconds: calibration may rescale every cost at once (a given
        # profile may be in any unit), and a sum of seconds from before and after would not
        # compare with a probe's predicted loss.
        self._profile_plain = costs[0]

    def _use_costs(self, costs: np.ndarray) -> None:
        self._cost = dict(zip(self.widths, costs))
        self._drafted_cost = costs[1:]
        self._rate_terms: dict[int, tuple] = {}  # per batch size, see _rates_of

    def _follow_calibration(self) -> None:
        """Takes the calibrator's table when it changed since the last plan."""
        if self.calibrator is not None and self.calibrator.version != self._cost_version:
            self._cost_version = self.calibrator.version
            self._use_costs(self.calibrator.table())

    # ----------------------------------------------------------------- estimates
    def global_acceptance(self) -> np.ndarray:
        """Engine-wide conditional acceptance by position (the prior of every request)."""
        return self.stats.global_acceptance()

    def expected_tokens(self, seats: np.ndarray) -> np.ndarray:
        """``E[i, k]``: expected tokens committed by sequence i verifying k drafts (k = 0..B-1)."""
        every = np.arange(2, self.stats.drafts + 2)
        gains = self.stats.expected(self.stats.counts(seats), every).T
        return np.concatenate([np.ones((len(seats), 1)), gains], 1)

    # ----------------------------------------------------------------- planning
    def plan(self, seqs) -> list[tuple[int, list]]:
        width, chosen, probe = self._choose(self.stats.begin_round(seqs))
        if width == 1:
            if self._explore_now(len(seqs), probe[1]):
                self._interval = min(2 * self._interval, self._max_interval)
                self._since_drafted, self._plain_seconds = 0, 0.0
                return [(probe[0], seqs)]
            return [(1, seqs)]
        self._since_drafted, self._interval, self._plain_seconds = 0, self._base_interval, 0.0
        if self.calibrator is not None:  # now and then plain or a neighbour, to be measured
            width = self.calibrator.steer(width, len(seqs))
            if width == 1:
                return [(1, seqs)]
        if chosen is None:
            return [(width, seqs)]
        mask = np.zeros(len(seqs), bool)
        mask[chosen] = True
        drafted = [s for s, keep in zip(seqs, mask) if keep]
        plain = [s for s, keep in zip(seqs, mask) if not keep]
        return [(width, drafted), (1, plain)]

    def _explore_now(self, b: int, loss: float) -> bool:
        """Counts a plain round; True when the next one should explore instead (a probe
        predicted to lose ``loss`` seconds against plain decoding)."""
        self._since_drafted += 1
        self._plain_seconds += self._profile_plain[b]
        in_profile_seconds = loss * self._profile_plain[b] / self._cost[1][b]
        return (self._since_drafted >= self._interval
                and in_profile_seconds <= self._explore_budget * self._plain_seconds)

    def choose(self, seats: np.ndarray) -> tuple[int, np.ndarray]:
        """The round's width and the indices (into ``seats``) that verify at it; (1, all) when
        plain decoding is predicted fastest. Reads the statistics as they are (no forgetting)."""
        width, chosen, _ = self._choose(self.stats.counts(seats))
        return width, np.arange(len(seats)) if chosen is None else chosen

    def _choose(self, counts: np.ndarray) -> tuple[int, np.ndarray | None, tuple | None]:
        """`choose` from the batch's counts; None for the rows when all of them verify. When
        plain decoding wins, also the probe an exploration would verify: (width, predicted
        seconds lost against plain decoding) of the best width with the whole batch drafting."""
        self._follow_calibration()
        b = len(counts)
        cost, rest, plain_rate = self._rates_of(b)
        # Row j: width widths[j + 1]; column m - 1: its m most promising sequences drafting,
        # the rest decoding (one pass over all widths: the plan runs every round, on the host).
        gain = self.stats.expected(counts)
        if b > 1:
            tokens = np.sort(gain, 1)[:, ::-1].cumsum(1) + rest
        else:  # one sequence: nothing to rank, no plain rows
            tokens = gain
        rate = tokens / cost
        best = int(rate.argmax())  # the first maximum: the narrowest width, then the fewest
        if not rate.item(best) > plain_rate * self._min_gain:
            j = int(rate[:, -1].argmax())  # the last column: all b sequences drafting
            loss = cost.item(j, b - 1) - tokens.item(j, b - 1) / plain_rate
            return 1, None, (self.widths[j + 1], loss)
        j, m = divmod(best, b)
        width = self.widths[j + 1]
        if m + 1 == b:
            return width, None, None
        return width, np.sort(np.argsort(-gain[j], kind="stable")[:m + 1]), None

    def _rates_of(self, b: int) -> tuple[np.ndarray, np.ndarray, float]:
        """For a batch of ``b`` (computed once per size): the predicted seconds of each
        two-group round, ``[widths, m]`` for m = 1..b drafting; the plain tokens of each
        (b - m); and the rate of plain decoding."""
        if b not in self._rate_terms:
            m = np.arange(1, b + 1)
            plain = self._cost[1]
            self._rate_terms[b] = (self._drafted_cost[:, m] + plain[b - m], b - m,
                                   b / plain[b])
        return self._rate_terms[b]

    def observe(self, seats: np.ndarray, width: int, accepted: np.ndarray,
                seconds: float | None = None) -> None:
        """Counts a verified round: drafts 1..min(accepted + 1, width - 1) were tried, the first
        ``accepted`` of them accepted; and its wall time ``seconds``, when given, for the
        calibration of the costs."""
        self.stats.observe(seats, width, accepted)
        if seconds is not None and self.calibrator is not None:
            self.calibrator.record(width, len(seats), seconds)


def build_policy(config, runner, identity: dict, progress: bool):
    """The engine's policy: None without a draft; for ``auto`` the cost profile comes from
    ``config.spec_cost_profile``, else from the cache (measured now if missing or if
    ``config.reprofile``), calibrated online when ``config.spec_calibration`` (opt-in)."""
    from ..models.default_model import cache_dir
    from .verify_cost import CostProfile, load_or_measure

    if runner.draft is None:
        return None
    widths = config.verify_widths
    if runner.cache.recurrent is not None and widths != [runner.block]:
        raise ValueError("a hybrid (recurrent-state) target verifies whole blocks for now: use "
                         "spec_policy='fixed' (--spec-policy fixed) without "
                         "num_speculative_tokens; shorter blocks through the state's replay "
                         "are not tested yet")
    if config.spec_policy == "fixed":
        return FixedPolicy(widths[-1])
    if config.spec_cost_profile is not None:
        cost = CostProfile.read(config.spec_cost_profile)
        cost.padded_sizes = runner.graphs.sizes if runner.graphs is not None else None
    else:
        cost = load_or_measure(runner, widths, config.max_num_seqs, identity, cache_dir(),
                               config.reprofile, progress)
    # Whole-block drafting: drafts beyond a round's width continue the verified chain, so the
    # acceptance prior is chained (acceptance.py); a w-token block per round keeps it flat.
    return AutoPolicy(runner.block, widths, cost, runner.cache.max_seats, config.max_num_seqs,
                      calibrate=config.spec_calibration, min_gain=config.spec_min_gain,
                      chain_prior=not runner.verified_draft_blocks)
