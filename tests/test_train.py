"""Draft training: the training forward equals the inference forward, loss weighting and
masking, the dspine-train CLI end to end (data -> fit -> resume -> Engine), and learning."""
from __future__ import annotations

import json
import math

import pytest
import torch

from dspine_engine.engine.kv_cache import KVCache
from dspine_engine.models.attention_meta import AttnMeta
from dspine_engine.models.dspine import DSpineDraft
from dspine_engine.models.target import TargetModel
from dspine_engine.train.capture import TargetCapture
from dspine_engine.train.draft_init import new_draft_config
from dspine_engine.train.forward import (TrainingForward, block_attention_mask, make_blocks,
                                         sample_anchors)
from dspine_engine.train.losses import (LossConfig, block_metrics, dspine_loss, position_weights,
                                        summarize_metrics, vocab_cross_entropy, weighted_mean)

BLOCK = 8


@pytest.fixture(scope="module")
def tiny_target(tiny_llama):
    return TargetModel.load(tiny_llama, progress=False)


def _draft(target, window=None, injection=True, transition=True, seed=0):
    cfg = new_draft_config(target.config, layers=2, block_size=BLOCK, sliding_window=window,
                           rank=16, top_k=4, target_layers=[0, 2], injection=injection,
                           transition=transition)
    draft = DSpineDraft(cfg).init_weights(seed=seed, std=0.1)
    with torch.no_grad():  # open the injection gates and move norms off 1 so every path counts
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return draft


def _batch(target, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    s = max(lengths)
    tokens = torch.randint(3, target.config.vocab_size, (len(lengths), s), generator=gen)
    for i, n in enumerate(lengths):
        tokens[i, n:] = 0
    taps = TargetCapture(target, [0, 2], sum(lengths))(tokens, lengths)
    return tokens, torch.tensor(lengths), taps


def _inference_hidden(draft, target, tokens, taps, seqs, anchors, pending=3):
    """block_hidden through a real paged cache, one inference 'sequence' per block: the context
    before the anchor is ingested (all but `pending` rows, which go in with the block)."""
    c, ps = draft.config, 16
    n = len(anchors)
    pages_each = (max(anchors) + BLOCK) // ps + 1
    kv = KVCache(c.num_layers, n * pages_each, ps, c.num_kv_heads, c.head_dim, torch.float32,
                 "cpu")
    tables = torch.arange(n * pages_each).view(n, pages_each)
    slot = lambda i, pos: int(tables[i, pos // ps]) * ps + pos % ps  # noqa: E731
    ctx_rows, ctx_pos, ctx_slots = [], [], []
    for i, (s, a) in enumerate(zip(seqs, anchors)):
        done = max(0, a - pending)
        draft.ingest_context(taps[s, :done], torch.arange(done, dtype=torch.int32),
                             torch.tensor([slot(i, p) for p in range(done)], dtype=torch.int32),
                             kv.k, kv.v)
        rows = list(range(done, a))
        ctx_rows.append(torch.cat([taps[s, rows], taps.new_zeros(BLOCK - len(rows),
                                                                  taps.shape[-1])]))
        ctx_pos += rows + [0] * (BLOCK - len(rows))
        ctx_slots += [slot(i, p) for p in rows] + [-1] * (BLOCK - len(rows))
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    meta = AttnMeta(i32([p for a in anchors for p in range(a, a + BLOCK)]),
                    i32([slot(i, p) for i, a in enumerate(anchors) for p in range(a, a + BLOCK)]),
                    tables.to(torch.int32), i32([a + BLOCK for a in anchors]),
                    i32(list(range(0, n * BLOCK + 1, BLOCK))), BLOCK, causal=False)
    anchor_ids = torch.tensor([int(tokens[s, a]) for s, a in zip(seqs, anchors)])
    return draft.block_hidden(anchor_ids, torch.cat(ctx_rows), i32(ctx_pos), i32(ctx_slots), meta,
                              kv.k, kv.v), anchor_ids


@pytest.mark.parametrize("window", [None, 12])
@pytest.mark.parametrize("injection", [True, False])
def test_training_forward_matches_inference(tiny_target, window, injection):
    draft = _draft(tiny_target, window, injection, transition=injection)
    draft.bind(tiny_target.embed, tiny_target.lm_head, tiny_target.config)
    lengths = [40, 29]
    tokens, lens, taps = _batch(tiny_target, lengths)
    # Blocks at the start, in the middle, overlapping and running past the end of a sequence.
    anchors = torch.tensor([[0, 17, 20, 35], [5, 11, 26, 27]])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    blocks = make_blocks(tokens, lens, anchors, keep, BLOCK)
    with torch.no_grad():
        out = TrainingForward(draft, tiny_target.embed, tiny_target.lm_head)(taps, blocks)
    seqs = [s for s in range(2) for _ in range(4)]
    ref, anchor_ids = _inference_hidden(draft, tiny_target, tokens, taps, seqs,
                                        anchors.flatten().tolist())
    got = out.hidden.reshape(-1, BLOCK - 1, out.hidden.shape[-1])
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    logits, g = draft.heads(ref)
    torch.testing.assert_close(got @ tiny_target.lm_head.T, logits, atol=1e-4, rtol=1e-5)
    if draft.transition is not None:
        # The training transition logits equal U_j + (P[prev] * G_j) Q^T from the bound tables.
        prev = blocks.previous.reshape(-1, BLOCK - 1)
        bd = draft.bound
        expect = logits + torch.einsum("njr,vr->njv", bd["pred_table"][prev] * g,
                                       bd["succ_table"])
        tr = draft.transition
        pair = (torch.nn.functional.embedding(prev, tiny_target.lm_head) @ tr.pred.weight.T
                * (got @ tr.hidden_proj.weight.T)) @ tr.succ.weight
        torch.testing.assert_close((got + pair) @ tiny_target.lm_head.T, expect, atol=1e-4,
                                   rtol=1e-5)
