"""DSpine training losses and the accuracy metrics shown while training.

Every term is a cross-entropy over the full vocabulary through the target's output embedding
E_out (its lm_head), at block positions j = 1..B-1, weighted by w_j = exp(-(j-1)/gamma): a miss
at j discards every later draft of the round, so early positions matter most.

- final:      U_j = E_out norm(h_j)
- transition: U_j + (P[y_{j-1}] * G_j) Q^T with P = E_out W_a^T, Q = E_out W_b^T, G_j = W_h
              norm(h_j), teacher-forced on the true previous token (y_0 = the anchor). Since
              (P[y] * G_j) Q^T = E_out (W_b^T (P[y] * G_j)), it costs one vocabulary projection.
- layers:     sum over layers l of w_l CE(E_out f^l_j, y_j), w_l = layer_weight / L (uniform:
              every depth should hold usable next-token information for the next injection).

With ``soft_weight`` alpha > 0 the final and transition terms (the two distributions inference
drafts from) take a soft label: (1 - alpha) onehot(y_j) + alpha p_j, p_j = softmax(E_out t_j) the
target's own next-token distribution at that position (t_j its final-normed state at a+j-1).
Greedy data makes argmax p_j = y_j, so the label's mode is unchanged; what alpha adds is the rest
of the target's distribution, which is what sampled verification accepts by (P(accept) = sum
min(p, q)). The layer-wise terms keep the hard label (they only feed the next injection).

Vocabulary-sized logits are never materialised for the whole batch: rows go through the
projection and the CE in chunks, and each chunk's gradient with respect to its input rows is
formed while its logits exist (a row's CE depends on that row alone), so peak memory is one
chunk of logits whatever the batch or vocabulary size and backward needs no second pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models.dspine import DSpineDraft
from .forward import Blocks, DraftOutputs


def default_gamma(block_size: int) -> float:
    """DFlash's decay: gamma = 7 for B = 16, scaled with the block size otherwise."""
    return 7.0 * block_size / 16


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_j = exp(-(j-1)/gamma) for j = 1..B-1."""
    j = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(j - 1) / gamma)


def _softmax_rows(logits: torch.Tensor, targets: torch.Tensor, want_grad: bool,
                  teacher: torch.Tensor | None = None, soft_weight: float = 0.0):
    """Per row of ``logits [m, V]``: CE against the label, the argmax, and (``want_grad``)
    d CE / d logits = softmax - label in the logits' dtype. The label is onehot(``targets``),
    or with ``teacher`` logits (1 - soft_weight) onehot + soft_weight softmax(teacher). One
    function so that, on CUDA, torch.compile can fuse it into a few passes over the logits."""
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    ce = lse - lf.gather(1, targets[:, None]).squeeze(1)
    top = logits.argmax(-1)
    p = None
    if teacher is not None:
        p = torch.softmax(teacher.float(), dim=-1)
        ce = (1.0 - soft_weight) * ce + soft_weight * (lse - (p * lf).sum(-1))
    if not want_grad:
        return ce, top, None
    label = F.one_hot(targets, logits.shape[1]).to(lf.dtype)
    if p is not None:
        label = (1.0 - soft_weight) * label + soft_weight * p
    return ce, top, ((lf - lse[:, None]).exp() - label).to(logits.dtype)


_compiled_softmax_rows = None


def _softmax_rows_fn(device: torch.device):
    """The compiled `_softmax_rows` on CUDA (eager where compilation is unavailable or fails
    once: that costs speed, never correctness)."""
    global _compiled_softmax_rows
    if device.type != "cuda":
        return _softmax_rows
    if _compiled_softmax_rows is None:
        try:
            _compiled_softmax_rows = torch.compile(_softmax_rows, dynamic=True)
        except Exception:  # pragma: no cover - depends on the toolchain
            _compiled_softmax_rows = _softmax_rows
    return _compiled_softmax_rows


class _RowCrossEntropy(torch.autograd.Function):
    """CE(E_out v, y) of a chunk of rows with its gradient formed in forward: each row's CE
    depends on that row alone, so d CE_i / d v_i = (softmax_i - onehot_i) E_out is computed
    while the logits exist and backward only scales it by the incoming d loss / d CE_i. Two
    vocabulary GEMMs per chunk (logits, their gradient) instead of three, and no logits kept.
    With ``teacher`` rows (the target's final-normed states) a third, forward-only GEMM forms
    the soft label's logits."""

    @staticmethod
    def forward(ctx, vectors, lm_head, targets, teacher=None, soft_weight=0.0):
        logits = F.linear(vectors.to(lm_head.dtype), lm_head)
        teacher_logits = None if teacher is None else F.linear(teacher.to(lm_head.dtype), lm_head)
        want_grad = ctx.needs_input_grad[0]
        args = (logits, targets, want_grad, teacher_logits, soft_weight)
        try:
            ce, top, dlogits = _softmax_rows_fn(logits.device)(*args)
        except Exception:  # a failed compilation falls back to eager for good
            global _compiled_softmax_rows
            _compiled_softmax_rows = _softmax_rows
            ce, top, dlogits = _softmax_rows(*args)
        del logits, teacher_logits
        dvec = (dlogits @ lm_head).to(vectors.dtype) if want_grad else None
        ctx.save_for_backward(dvec)
        ctx.mark_non_differentiable(top)
        return ce, top

    @staticmethod
    def backward(ctx, grad_ce, _):
        (dvec,) = ctx.saved_tensors
        return dvec * grad_ce[:, None].to(dvec.dtype), None, None, None, None


def vocab_cross_entropy(vectors: torch.Tensor, lm_head: torch.Tensor, targets: torch.Tensor,
                        chunk_rows: int = 8192, want_argmax: bool = True,
                        teacher: torch.Tensor | None = None, soft_weight: float = 0.0):
    """CE(E_out v, label) per row of ``vectors [M, H]`` and the argmax token (or None), computed
    in row chunks so one chunk of vocabulary logits exists at a time (the frozen ``lm_head``
    gets no gradient). The label is onehot(y), or mixed with softmax(E_out teacher) (see the
    module docstring) when ``teacher [M, H]`` is given."""
    losses, argmax = [], []
    for i in range(0, vectors.shape[0], chunk_rows):
        rows = slice(i, i + chunk_rows)
        ce, top = _RowCrossEntropy.apply(vectors[rows], lm_head, targets[rows],
                                         None if teacher is None else teacher[rows], soft_weight)
        losses.append(ce)
        argmax.append(top)
    if not losses:
        return vectors.new_zeros(0, dtype=torch.float32), (targets[:0] if want_argmax else None)
    return torch.cat(losses), (torch.cat(argmax) if want_argmax else None)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor,
                  total: torch.Tensor | None = None) -> torch.Tensor:
    """sum(w v) / sum(w) (or / ``total``); 0 (with a gradient path) when nothing counts."""
    total = weights.sum() if total is None else total
    return (values * weights).sum() / total.clamp_min(1e-8)


def weight_total(blocks: Blocks, gamma: float) -> torch.Tensor:
    """sum(w_j) over the batch's supervised positions: the denominator of every loss term
    (data-parallel ranks add theirs up so that each rank's slice is weighted as in the whole)."""
    valid = blocks.valid
    return position_weights(valid.shape[-1] + 1, gamma, valid.device).expand_as(valid)[
        valid].sum()


@dataclass
class LossConfig:
    gamma: float = 7.0
    layer_weight: float = 1.0  # total weight of the layer-wise supervision (split evenly)
    transition_weight: float = 1.0
    chunk_rows: int = 8192
    soft_weight: float = 0.0  # alpha of the soft label (0: the hard label y_j alone)


@dataclass
class LossResult:
    loss: torch.Tensor  # what backward runs on
    terms: dict[str, torch.Tensor]  # final / transition / layers, detached (no host sync)
    correct: torch.Tensor  # [b, n, B-1] argmax U_j == y_j on valid positions
    valid: torch.Tensor  # [b, n, B-1]


def dspine_loss(draft: DSpineDraft, lm_head: torch.Tensor, out: DraftOutputs, blocks: Blocks,
                cfg: LossConfig, total: torch.Tensor | None = None) -> LossResult:
    """The training loss of one batch; terms a draft does not have (a DFlash drafter: no
    injection, no transition) are simply absent. ``total`` replaces the batch's own sum of
    position weights as every term's denominator (see `weight_total`)."""
    valid = blocks.valid
    w = position_weights(valid.shape[-1] + 1, cfg.gamma, valid.device).expand_as(valid)[valid]
    targets = blocks.targets[valid]
    hidden = out.hidden[valid]
    soft = {}
    if cfg.soft_weight > 0:
        if blocks.teacher is None:
            raise ValueError("soft labels need the target's final states (Blocks.teacher)")
        soft = {"teacher": blocks.teacher[valid], "soft_weight": cfg.soft_weight}

    ce, top = vocab_cross_entropy(hidden, lm_head, targets, cfg.chunk_rows, **soft)
    final = weighted_mean(ce, w, total)
    loss, terms = final, {"final": final.detach()}

    if draft.transition is not None:
        tr = draft.transition
        pred = F.linear(F.embedding(blocks.previous[valid], lm_head), tr.pred.weight)  # P[y_{j-1}]
        pair = (pred * tr.hidden_proj(hidden)) @ tr.succ.weight  # W_b^T (P[y_{j-1}] * G_j)
        tce, _ = vocab_cross_entropy(hidden + pair.to(hidden.dtype), lm_head, targets,
                                     cfg.chunk_rows, want_argmax=False, **soft)
        transition = weighted_mean(tce, w, total)
        loss = loss + cfg.transition_weight * transition
        terms["transition"] = transition.detach()

    if out.features and cfg.layer_weight > 0:
        per_layer = [weighted_mean(vocab_cross_entropy(f[valid], lm_head, targets,
                                                       cfg.chunk_rows, want_argmax=False)[0], w,
                                     total) for f in out.features]
        layers = torch.stack(per_layer).mean()
        loss = loss + cfg.layer_weight * layers
        terms["layers"] = layers.detach()

    correct = torch.zeros_like(valid)
    correct[valid] = top == targets
    return LossResult(loss, terms, correct, valid)


def block_metrics(correct: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """Counts behind the accuracy of argmax U_j (j = 1..B-1) and tau, as device tensors so
    batches add up without a host sync; `summarize_metrics` turns them into numbers.

    ``tau`` = 1 + the mean number of leading correct positions per block: what greedy
    verification of the argmax drafts would accept in a round (+ the bonus token), given the
    block's true context."""
    blocks = valid[..., 0]
    leading = torch.cumprod(correct.long(), dim=-1).sum(-1)
    return {"correct_by_pos": correct.sum(dim=(0, 1)), "count_by_pos": valid.sum(dim=(0, 1)),
            "accepted": leading[blocks].sum(), "blocks": blocks.sum()}


def merge_metrics(a: dict | None, b: dict) -> dict:
    return dict(b) if a is None else {k: a[k] + b[k] for k in b}


def summarize_metrics(m: dict) -> dict:
    """Per-position accuracy, mean accuracy and tau from (summed) `block_metrics` counts."""
    correct, count = m["correct_by_pos"].tolist(), m["count_by_pos"].tolist()
    blocks, accepted = int(m["blocks"]), int(m["accepted"])
    total = sum(count)
    return {"acc_by_pos": [c / n if n else math.nan for c, n in zip(correct, count)],
            "acc": sum(correct) / total if total else math.nan,
            "tau": 1 + accepted / blocks if blocks else math.nan}
