"""One decoding round for every running sequence: draft -> verify -> accept -> commit.

Without a draft the same round is plain autoregressive decoding (a block of one token).
The only host sync of the round is reading the accepted lengths and tokens back (line marked
SYNC): the host needs them to decide each sequence's next positions and stop conditions.
"""
from __future__ import annotations

from .runner import ModelRunner
from .sequence import Sequence


def speculative_round(runner: ModelRunner, seqs: list[Sequence], stats) -> dict[str, list[int]]:
    blk = runner.block
    temps, top_k, top_p, u = runner.sampling_inputs(seqs, 2 * blk - 1)
    drafts = cand_ids = cand_probs = None
    if runner.draft is not None:
        walk_u = u[:, :blk - 1].to(runner.device, non_blocking=True)
        drafts, cand_ids, cand_probs = runner.propose(seqs, temps, walk_u)
    logits, taps = runner.verify(seqs, drafts)
    accept, out, _ = runner.verify_tokens(logits, drafts, cand_ids, cand_probs, temps, top_k,
                                          top_p, u[:, blk - 1:], seqs)
    accept, out = accept.tolist(), out.tolist()  # SYNC: the host needs the accepted lengths
    new_tokens = {}
    for i, seq in enumerate(seqs):
        n = accept[i]
        _record(seq, stats, n, drafted=drafts is not None)
        p = seq.num_cached
        seq.num_cached = p + n + 1  # K/V of the anchor and the n accepted drafts stay valid
        seq.target_pages.truncate(seq.num_cached)
        if taps is not None:
            seq.pending_taps = taps[i, :n + 1]  # draft context for positions p..p+n
            if runner.window:
                seq.draft_pages.free_before(seq.num_cached - runner.window + 1)
        new_tokens[seq.request_id] = seq.commit(out[i][:n + 1])
    return new_tokens


def _record(seq: Sequence, stats, accepted: int, drafted: bool) -> None:
    for s in (seq.stats, stats):
        s.rounds += 1
        s.accepted_drafts += accepted
        if drafted:
            s.drafted_rounds += 1
            if not s.accepted_by_position:
                s.accepted_by_position = [0] * (len(stats.accepted_by_position))
            for j in range(accepted):
                s.accepted_by_position[j] += 1
