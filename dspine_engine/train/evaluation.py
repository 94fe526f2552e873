"""Held-out scoring of drafts during training, as close to the engine as a teacher-forced
batch allows.

Every block gets the true context (as in a round whose previous drafts were all accepted), and
its drafts are chosen the way the engine chooses them: the transition walk of `choose_drafts`
(the engine's walk) at temperature 0 over the top-K candidates of each position (for a DFlash
draft, which has no pair term, that is the argmax chain). ``tau_walk`` = 1 + the mean number of
leading drafts equal to the target's tokens: the acceptance length greedy verification would
give on that data. ``tau`` is the same for the per-position argmax (which ignores the chain).
Checkpoints are chosen by ``tau_walk`` on a held-out, benchmark-like set (``--eval-data``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.dspine import choose_drafts
from .forward import Blocks, DraftOutputs
from .losses import block_metrics, merge_metrics

WALK_CHUNK_BLOCKS = 256  # blocks per walk call: bounds the [blocks, B-1, V] logits it needs


def walk_tables(draft, lm_head: torch.Tensor):
    """The transition cache of the draft's current weights (as `DSpineDraft.bind` builds it),
    or None for a draft without the transition head."""
    tr = draft.transition
    if tr is None:
        return None
    return (lm_head @ tr.pred.weight.to(lm_head.dtype).T,
            lm_head @ tr.succ.weight.to(lm_head.dtype).T)


@torch.no_grad()
def walk_correct(draft, lm_head: torch.Tensor, out: DraftOutputs, blocks: Blocks,
                 tables) -> torch.Tensor:
    """``[b, n, B-1]``: the walked draft at j equals the true token (False where not valid)."""
    b, n, j, h = out.hidden.shape
    keep = blocks.keep.reshape(-1)
    hidden = out.hidden.reshape(b * n, j, h)[keep].to(lm_head.dtype)
    anchors = blocks.tokens[..., 0].reshape(-1)[keep]
    targets = blocks.targets.reshape(b * n, j)[keep]
    picked = []
    for i in range(0, hidden.shape[0], WALK_CHUNK_BLOCKS):
        hn, a = hidden[i:i + WALK_CHUNK_BLOCKS], anchors[i:i + WALK_CHUNK_BLOCKS]
        logits = F.linear(hn, lm_head)
        pair = None if tables is None else (
            F.linear(hn, draft.transition.hidden_proj.weight.to(hn.dtype)), *tables)
        zeros = torch.zeros(hn.shape[0], device=hn.device)
        tokens, _, _ = choose_drafts(logits, pair, a, draft.config.transition_top_k, zeros,
                                     torch.zeros(hn.shape[0], j, device=hn.device))
        picked.append(tokens)
    correct = torch.zeros(b * n, j, dtype=torch.bool, device=hidden.device)
    if picked:
        correct[keep] = torch.cat(picked) == targets
    return correct.view(b, n, j) & blocks.valid


class EvalAccumulator:
    """Sums loss terms and metric counts of one draft over the held-out batches."""

    def __init__(self):
        self.terms, self.counts, self.walk, self.batches = {}, None, None, 0

    def add(self, res, walk_ok: torch.Tensor) -> None:
        for name, v in {"loss": res.loss, **res.terms}.items():
            self.terms[name] = self.terms.get(name, 0.0) + float(v)
        self.counts = merge_metrics(self.counts, block_metrics(res.correct, res.valid))
        self.walk = merge_metrics(self.walk, block_metrics(walk_ok, res.valid))
        self.batches += 1

    def summary(self) -> dict:
        from .losses import summarize_metrics

        walk = summarize_metrics(self.walk)
        return {**{k: v / self.batches for k, v in self.terms.items()},
                **summarize_metrics(self.counts), "tau_walk": walk["tau"],
                "acc_walk_by_pos": walk["acc_by_pos"]}
