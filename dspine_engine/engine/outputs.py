"""What the engine hands back: per-step deltas, finished results and their statistics."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0  # target forwards after the prefill (decode steps or speculative rounds)
    accepted_drafts: int = 0  # draft tokens accepted over all rounds
    drafted_rounds: int = 0  # rounds that verified at least one draft
    time_to_first_token: float = 0.0  # seconds from admission to the first new token
    elapsed: float = 0.0  # seconds from admission to the end
    seed: int | None = None
    positions: int = 0  # the engine's draft positions (block - 1); 0 without a draft
    # Rounds by outcome, (drafts verified, drafts accepted) -> rounds. A round adds to one entry
    # (`count_round`); the per-position counts and the verify lengths are read from these, so the
    # engine's per-round work for a request does not loop over the block's positions.
    outcomes: dict[tuple[int, int], int] = field(default_factory=dict)

    def count_round(self, drafts: int, accepted: int) -> None:
        """One round of this request that verified ``drafts`` drafts and accepted ``accepted``."""
        self.rounds += 1
        self.accepted_drafts += accepted
        if drafts:
            self.drafted_rounds += 1
        key = (drafts, accepted)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    @property
    def accepted_by_position(self) -> list[int]:
        """j -> rounds accepting d_j ([] without a draft)."""
        return [sum(n for (_, a), n in self.outcomes.items() if a > j)
                for j in range(self.positions)]

    @property
    def verified_by_position(self) -> list[int]:
        """j -> rounds whose verified block held d_j ([] without a draft)."""
        return [sum(n for (d, _), n in self.outcomes.items() if d > j)
                for j in range(self.positions)]

    @property
    def verify_lengths(self) -> dict[int, int]:
        """Drafts verified -> rounds ({} without a draft)."""
        out: dict[int, int] = {}
        if self.positions:
            for (d, _), n in self.outcomes.items():
                out[d] = out.get(d, 0) + n
        return out

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens a round commits: accepted drafts + the bonus token (1.0 for plain
        decoding). Counted as verified, before a stop condition cuts the last round short."""
        return 1.0 + self.accepted_drafts / self.rounds if self.rounds else 0.0

    def path(self) -> str:
        """Which decoding path the request took: "autoregressive" (no round verified a
        draft), "speculative" (every round did) or "mixed (N% of rounds drafted)"."""
        return decoding_path(self.drafted_rounds, self.rounds)

    def acceptance_by_position(self) -> list[float]:
        """P(d_j accepted) over the rounds whose verified block held d_j, j = 1..B-1."""
        return acceptance_rates(self.accepted_by_position, self.verified_by_position)

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("outcomes", "positions")}
        d.update(accepted_by_position=self.accepted_by_position,
                 verified_by_position=self.verified_by_position,
                 verify_lengths=self.verify_lengths, tokens_per_second=self.tokens_per_second,
                 tau=self.tau)
        return d


def decoding_path(drafted_rounds: int, rounds: int) -> str:
    if drafted_rounds == 0:
        return "autoregressive"
    if drafted_rounds == rounds:
        return "speculative"
    return f"mixed ({100 * drafted_rounds / rounds:.0f}% of rounds drafted)"


def acceptance_rates(accepted: list[int], verified: list[int]) -> list[float]:
    """Per position: accepted / rounds whose verified block held it (0 where none did)."""
    return [a / v if v else 0.0 for a, v in zip(accepted, verified)]


@dataclass
class RequestOutput:
    """One step's news about one request (what `step()` and `stream()` yield)."""

    request_id: str
    new_text: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    error: str | None = None
    stats: RequestStats | None = None  # set when finished


@dataclass
class GenerationResult:
    """A finished request, as `generate()` returns it."""

    request_id: str
    prompt: str | list
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: RequestStats
    error: str | None = None
