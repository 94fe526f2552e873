"""One decoding round for every running sequence: draft -> verify -> accept -> commit.

Without a draft the same round is plain autoregressive decoding (a block of one token). With a
draft, the verification policy (spec_policy.py) splits the batch into at most two groups, each
verifying its own number of tokens per sequence (1 = a plain decode step, which keeps its
position's draft context pending: runner.catch_up_context); each group is one round of its own.
The only host sync of a group's round is reading the accepted lengths and tokens back (in
`runner.accept`): the host needs them to decide each sequence's next positions and stops.
"""
from __future__ import annotations

import time

import numpy as np

from .runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence


def speculative_round(runner: ModelRunner, scheduler: Scheduler, seqs: list[Sequence],
                      stats, policy=None) -> dict[str, list[int]]:
    groups = policy.plan(seqs) if policy is not None else [(runner.block, seqs)]
    new_tokens = {}
    for tokens, group in groups:
        new_tokens.update(_verify_group(runner, scheduler, group, tokens, stats, policy))
    return new_tokens


def _verify_group(runner: ModelRunner, scheduler: Scheduler, seqs: list[Sequence], tokens: int,
                  stats, policy) -> dict[str, list[int]]:
    seats = scheduler.prepare_round(seqs)
    # The round's wall time, staging to the accepted lengths on the host, is what the cost
    # profile predicts: the policy calibrates it (host timestamps, no extra device sync).
    t0 = time.perf_counter()
    runner.prepare_round(seqs, seats, tokens)
    drafted, context_written = tokens > 1, True
    if drafted:
        runner.propose()
    elif runner.draft is not None:
        context_written = runner.catch_up_context()
    runner.verify()
    accept, out = runner.accept()
    seconds = time.perf_counter() - t0
    scheduler.verified(seats, accept, context_written)
    if policy is not None:
        policy.observe(seats, tokens, accept, seconds)
    _record_batch(stats, accept, tokens)
    accepted, rows = accept.tolist(), out.tolist()
    new_tokens = {}
    for seq, n, row in zip(seqs, accepted, rows):
        seq.stats.count_round(tokens - 1, n)
        new_tokens[seq.request_id] = seq.commit(row[:n + 1])
    return new_tokens


def _record_batch(stats, accept: np.ndarray, tokens: int) -> None:
    """Engine totals for the whole batch at once."""
    stats.rounds += len(accept)
    stats.accepted_drafts += int(accept.sum())
    positions = len(stats.accepted_by_position)
    if positions:
        stats.verify_lengths[tokens - 1] = stats.verify_lengths.get(tokens - 1, 0) + len(accept)
    if tokens > 1:
        stats.drafted_rounds += len(accept)
        # Rounds accepting d_j = rounds whose accepted count exceeds j.
        counts = np.bincount(accept, minlength=positions + 1)
        at_least = np.cumsum(counts[::-1])[::-1][1:]
        for j, c in enumerate(at_least[:positions].tolist()):
            stats.accepted_by_position[j] += c
        for j in range(tokens - 1):  # rounds whose verified block held d_j
            stats.verified_by_position[j] += len(accept)
