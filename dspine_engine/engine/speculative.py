"""One decoding round for every running sequence: draft -> verify -> accept -> commit.

Without a draft the same round is plain autoregressive decoding (a block of one token).
The only host sync of the round is reading the accepted lengths and tokens back (in
`runner.accept`): the host needs them to decide each sequence's next positions and stops.
"""
from __future__ import annotations

import numpy as np

from .runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence


def speculative_round(runner: ModelRunner, scheduler: Scheduler, seqs: list[Sequence],
                      stats) -> dict[str, list[int]]:
    seats = scheduler.prepare_round(seqs)
    runner.prepare_round(seqs, seats)
    drafted = runner.draft is not None
    if drafted:
        runner.propose()
    runner.verify()
    accept, out = runner.accept()
    scheduler.verified(seats, accept)
    _record_batch(stats, accept, drafted)
    accepted, rows = accept.tolist(), out.tolist()
    new_tokens = {}
    for seq, n, row in zip(seqs, accepted, rows):
        _record(seq.stats, n, drafted, len(stats.accepted_by_position))
        new_tokens[seq.request_id] = seq.commit(row[:n + 1])
    return new_tokens


def _record(s, accepted: int, drafted: bool, positions: int) -> None:
    s.rounds += 1
    s.accepted_drafts += accepted
    if drafted:
        s.drafted_rounds += 1
        if not s.accepted_by_position:
            s.accepted_by_position = [0] * positions
        for j in range(accepted):
            s.accepted_by_position[j] += 1


def _record_batch(stats, accept: np.ndarray, drafted: bool) -> None:
    """Engine totals for the whole batch at once."""
    stats.rounds += len(accept)
    stats.accepted_drafts += int(accept.sum())
    if drafted:
        stats.drafted_rounds += len(accept)
        # Rounds accepting d_j = rounds whose accepted count exceeds j.
        counts = np.bincount(accept, minlength=len(stats.accepted_by_position) + 1)
        at_least = np.cumsum(counts[::-1])[::-1][1:]
        for j, c in enumerate(at_least[:len(stats.accepted_by_position)].tolist()):
            stats.accepted_by_position[j] += c
