"""One decoding round for every running sequence: draft -> verify -> accept -> commit.

Without a draft the same round is plain autoregressive decoding (a block of one token). With a
draft, the verification policy (spec_policy.py) splits the batch into at most two groups, each
verifying its own number of tokens per sequence (1 = a plain decode step, which keeps its
position's draft context pending: runner.catch_up_context); each group is one round of its own.

A round is launched (`launch_round`: pages, staging, the forwards and the block verify queued
on the device) and then finished (`finish_round`: the accepted lengths and tokens read back,
the host's lengths, stops and statistics). The read-back is the round's only host sync: the
host needs the results to decide each sequence's next positions and stops. The driver either
finishes a round at once (`speculative_round`) or, with overlapped rounds, launches the next
round first and finishes this one while the device runs it (driver.py); a sequence that ended
in between (a stop, an abort) is then skipped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .runner import ModelRunner, RoundResult
from .scheduler import Scheduler
from .sequence import Sequence, Status


@dataclass
class LaunchedRound:
    """A round on the device whose results the host has not read yet."""

    seqs: list[Sequence]
    seats: np.ndarray
    tokens: int  # verified per sequence
    context_written: bool
    result: RoundResult
    started: float  # host clock at staging


def speculative_round(runner: ModelRunner, scheduler: Scheduler, seqs: list[Sequence],
                      stats, policy=None) -> dict[str, list[int]]:
    """Launches and finishes the round of every group of the policy's plan."""
    groups = policy.plan(seqs) if policy is not None else [(runner.block, seqs)]
    new_tokens = {}
    for tokens, group in groups:
        launched = launch_round(runner, scheduler, group, tokens)
        new_tokens.update(finish_round(runner, launched, scheduler, stats, policy))
    return new_tokens


def launch_round(runner: ModelRunner, scheduler: Scheduler, seqs: list[Sequence],
                 tokens: int) -> LaunchedRound:
    seats = scheduler.prepare_round(seqs)
    # The round's wall time, staging to the accepted lengths on the host, is what the cost
    # profile predicts: the policy calibrates it (host timestamps, no extra device sync).
    started = time.perf_counter()
    runner.prepare_round(seqs, seats, tokens)
    context_written = True
    if tokens > 1:
        runner.propose()
    elif runner.draft is not None:
        context_written = runner.catch_up_context()
    runner.verify()
    return LaunchedRound(seqs, seats, tokens, context_written, runner.accept_later(), started)


def finish_round(runner: ModelRunner, launched: LaunchedRound, scheduler: Scheduler, stats,
                 policy=None, timed: bool = True) -> dict[str, list[int]]:
    """Reads the round's results back and commits them for the sequences still running.
    ``timed``: the round ran alone from staging to read-back, so its wall time is its cost
    (the policy's calibration observes it); an overlapped round's is not."""
    accept, out = runner.read_back(launched.result)
    seconds = time.perf_counter() - launched.started if timed else None
    seqs, seats, tokens = launched.seqs, launched.seats, launched.tokens
    running = [s.status is Status.RUNNING for s in seqs]
    if not all(running):  # ended since the launch: their results are dropped
        seqs = [s for s, r in zip(seqs, running) if r]
        seats, accept, out = seats[running], accept[running], out[running]
    scheduler.verified(seats, accept, launched.context_written)
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
    """Engine totals for the whole batch at once. An overlapped batch whose requests all ended
    before it was read back records nothing (not even as a batch, or a width verified 0 times)."""
    if not len(accept):
        return
    stats.rounds += len(accept)
    stats.batches += 1
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
