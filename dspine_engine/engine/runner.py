"""Turns scheduled sequences into model inputs and runs the forwards.

The runner owns the models and their KV caches. It builds the int32 metadata on the host (it
follows from host-side lengths, known without touching the device) and ships it in one copy per
tensor. CUDA graphs, when enabled, replace the eager verify/draft forwards (cuda_graphs.py).
"""
from __future__ import annotations

import torch

from .. import ops
from ..models.attention_meta import AttnMeta
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from .kv_cache import KVCache, SequencePages
from .sequence import Sequence


class ModelRunner:
    def __init__(self, target: TargetModel, draft: DSpineDraft | None, target_kv: KVCache,
                 draft_kv: KVCache | None):
        self.target = target
        self.draft = draft
        self.target_kv = target_kv
        self.draft_kv = draft_kv
        self.device = target.device
        self.block = draft.config.block_size if draft is not None else 1
        self.taps = tuple(draft.config.target_layer_ids) if draft is not None else ()
        self.window = (draft.config.sliding_window or 0) if draft is not None else 0
        self.graphs = None  # a CudaGraphRunner, attached by the engine on CUDA

    # ----------------------------------------------------------------- host -> device
    def _ints(self, values, dtype=torch.int32) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _tables(self, pages: list[SequencePages]) -> torch.Tensor:
        width = max(1, max(len(p.table) for p in pages))
        return self._ints([p.table + [0] * (width - len(p.table)) for p in pages])

    @staticmethod
    def _slots(pages: SequencePages, start: int, stop: int) -> list[int]:
        return [pages.slot(i) for i in range(start, stop)]

    # ----------------------------------------------------------------- prefill
    def prefill(self, seqs: list[Sequence]):
        """Whole prompts at once. Returns last-position logits [b, V] and the taps [N, T*H]."""
        lens = [len(s.prompt_ids) for s in seqs]
        tokens, positions, slots = [], [], []
        for s, n in zip(seqs, lens):
            s.target_pages.ensure(n)
            tokens += s.prompt_ids
            positions += range(n)
            slots += self._slots(s.target_pages, 0, n)
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        meta = AttnMeta(self._ints(positions), self._ints(slots),
                        self._tables([s.target_pages for s in seqs]), self._ints(lens),
                        self._ints(cu), max(lens), causal=True)
        last_rows = self._ints([c - 1 for c in cu[1:]], torch.long)
        return self.target.forward(self._ints(tokens, torch.long), meta, self.target_kv.k,
                                   self.target_kv.v, logit_rows=last_rows, tap_layers=self.taps)

    def ingest_prompt_context(self, seqs: list[Sequence], taps: torch.Tensor) -> None:
        """Writes the draft context of every prompt position a future query can see."""
        rows, positions, slots, offset = [], [], [], 0
        for s in seqs:
            n = len(s.prompt_ids)
            first = max(0, n - self.window) if self.window else 0
            s.draft_pages.ensure(n, first_needed=first)
            rows += range(offset + first, offset + n)
            positions += range(first, n)
            slots += self._slots(s.draft_pages, first, n)
            offset += n
        self.draft.ingest_context(taps[self._ints(rows, torch.long)], self._ints(positions),
                                  self._ints(slots), self.draft_kv.k, self.draft_kv.v)

    # ----------------------------------------------------------------- speculative round
    def block_meta(self, seqs: list[Sequence], pages_of, causal: bool) -> AttnMeta:
        """Metadata for a block of `self.block` tokens per sequence at its anchor position."""
        blk = self.block
        positions, slots, kv_lens = [], [], []
        for s in seqs:
            p = s.num_cached
            pages = pages_of(s)
            first = max(0, p - self.window + 1) if (self.window and not causal) else 0
            pages.ensure(p + blk, first_needed=first)
            positions += range(p, p + blk)
            slots += self._slots(pages, p, p + blk)
            kv_lens.append(p + blk)
        cu = list(range(0, blk * len(seqs) + 1, blk))
        return AttnMeta(self._ints(positions), self._ints(slots),
                        self._tables([pages_of(s) for s in seqs]), self._ints(kv_lens),
                        self._ints(cu), blk, causal=causal)

    def propose(self, seqs: list[Sequence], temperature, uniforms):
        """Draft forward: ingests each sequence's pending context and drafts B-1 tokens."""
        blk, d = self.block, self.draft
        tap_dim = len(self.taps) * d.config.hidden_size
        ctx = torch.zeros(len(seqs), blk, tap_dim, dtype=self.target.dtype, device=self.device)
        ctx_pos, ctx_slots = [], []
        for i, s in enumerate(seqs):
            pend = s.pending_taps
            n = 0 if pend is None else pend.shape[0]
            if n:
                ctx[i, :n] = pend
            start = s.num_cached - n
            ctx_pos += list(range(start, s.num_cached)) + [0] * (blk - n)
            ctx_slots += self._slots(s.draft_pages, start, s.num_cached) + [-1] * (blk - n)
            s.pending_taps = None
        meta = self.block_meta(seqs, lambda s: s.draft_pages, causal=False)
        anchors = self._ints([s.anchor for s in seqs], torch.long)
        return d.propose(anchors, ctx.view(len(seqs) * blk, tap_dim), self._ints(ctx_pos),
                         self._ints(ctx_slots), meta, self.draft_kv.k, self.draft_kv.v,
                         temperature, uniforms)

    def verify(self, seqs: list[Sequence], drafts: torch.Tensor | None):
        """Target forward over [anchor, d_1..d_{B-1}] (or the anchor alone without a draft).
        Returns logits [b, T, V] and taps [b, T, taps*H] (None without a draft)."""
        b, blk = len(seqs), self.block
        meta = self.block_meta(seqs, lambda s: s.target_pages, causal=True)
        anchors = self._ints([s.anchor for s in seqs], torch.long)
        tokens = anchors[:, None] if drafts is None else torch.cat([anchors[:, None], drafts], 1)
        logits, taps = self.target.forward(tokens.reshape(-1), meta, self.target_kv.k,
                                           self.target_kv.v, tap_layers=self.taps)
        return logits.view(b, blk, -1), (taps.view(b, blk, -1) if taps is not None else None)

    # ----------------------------------------------------------------- sampling
    def sampling_inputs(self, seqs: list[Sequence], width: int):
        """Per-sequence temperature, top-k, top-p and `width` uniforms from each request's rng."""
        temps = self._ints([s.params.temperature for s in seqs], torch.float32)
        top_k = self._ints([s.params.top_k for s in seqs], torch.int32)
        top_p = self._ints([s.params.top_p for s in seqs], torch.float32)
        u = torch.zeros(len(seqs), width)
        for i, s in enumerate(seqs):
            if not s.params.greedy:
                u[i] = s.rng.uniforms(width)
        return temps, top_k, top_p, u

    def verify_tokens(self, logits, drafts, cand_ids, cand_probs, temps, top_k, top_p, uniforms,
                      seqs):
        b, t = logits.shape[:2]
        if drafts is None:
            drafts = torch.empty(b, 0, dtype=torch.long, device=self.device)
            cand_ids = torch.empty(b, 0, 1, dtype=torch.long, device=self.device)
            cand_probs = torch.empty(b, 0, 1, dtype=torch.float32, device=self.device)
        seq_lens = self._ints([s.num_cached for s in seqs])
        return ops.block_verify(logits, drafts, cand_ids, cand_probs, temps, top_k, top_p,
                                uniforms.to(self.device, non_blocking=True), seq_lens)
