"""Turns scheduled sequences into model inputs and runs the forwards.

The runner owns the models and their KV caches. It builds the int32 metadata on the host (it
follows from host-side lengths, known without touching the device) and ships it in one copy per
tensor. On CUDA, the verify and draft forwards replay captured CUDA graphs when the batch fits
one (cuda_graphs.py); otherwise they run eagerly through the same code.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import ops
from ..models.attention_meta import AttnMeta
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel
from .kv_cache import KVCache, SequencePages
from .sequence import Sequence


@dataclass
class BlockInputs:
    """Host-side description of one round's blocks (B tokens per sequence at its anchor)."""

    positions: list[int]
    slots: list[int]
    tables: list[list[int]]
    kv_lens: list[int]


@dataclass
class DraftInputs:
    """Host-side inputs of a draft forward besides the block: the pending context rows."""

    anchors: list[int]
    ctx_positions: list[int]
    ctx_slots: list[int]
    pending: list[torch.Tensor | None]  # per sequence, [n_i, taps] on the device


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
        self.tap_dim = len(self.taps) * target.config.hidden_size
        self.window = (draft.config.sliding_window or 0) if draft is not None else 0
        self.graphs = None  # a CudaGraphRunner, attached by the engine on CUDA

    # ----------------------------------------------------------------- host -> device
    def ints(self, values, dtype=torch.int32) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    @staticmethod
    def padded_tables(pages: list[list[int]], width: int | None = None) -> list[list[int]]:
        width = width or max(1, max(len(p) for p in pages))
        return [p + [0] * (width - len(p)) for p in pages]

    @staticmethod
    def _slots(pages: SequencePages, start: int, stop: int) -> list[int]:
        return [pages.slot(i) for i in range(start, stop)]

    def meta(self, inp: BlockInputs, causal: bool) -> AttnMeta:
        blk = self.block
        cu = list(range(0, blk * len(inp.kv_lens) + 1, blk))
        return AttnMeta(self.ints(inp.positions), self.ints(inp.slots),
                        self.ints(self.padded_tables(inp.tables)), self.ints(inp.kv_lens),
                        self.ints(cu), blk, causal=causal)

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
        meta = AttnMeta(self.ints(positions), self.ints(slots),
                        self.ints(self.padded_tables([s.target_pages.table for s in seqs])),
                        self.ints(lens), self.ints(cu), max(lens), causal=True)
        last_rows = self.ints([c - 1 for c in cu[1:]], torch.long)
        return self.target.forward(self.ints(tokens, torch.long), meta, self.target_kv.k,
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
        self.draft.ingest_context(taps[self.ints(rows, torch.long)], self.ints(positions),
                                  self.ints(slots), self.draft_kv.k, self.draft_kv.v)

    # ----------------------------------------------------------------- round inputs
    def block_inputs(self, seqs: list[Sequence], pages_of, causal: bool) -> BlockInputs:
        """Blocks of `self.block` tokens per sequence at the anchor; allocates their pages."""
        blk = self.block
        inp = BlockInputs([], [], [], [])
        for s in seqs:
            p = s.num_cached
            pages = pages_of(s)
            first = max(0, p - self.window + 1) if (self.window and not causal) else 0
            pages.ensure(p + blk, first_needed=first)
            inp.positions += range(p, p + blk)
            inp.slots += self._slots(pages, p, p + blk)
            inp.tables.append(pages.table)
            inp.kv_lens.append(p + blk)
        return inp

    def draft_inputs(self, seqs: list[Sequence]) -> DraftInputs:
        """The pending context of each sequence (its last round's committed positions)."""
        blk = self.block
        inp = DraftInputs([s.anchor for s in seqs], [], [], [])
        for s in seqs:
            n = 0 if s.pending_taps is None else s.pending_taps.shape[0]
            start = s.num_cached - n
            inp.ctx_positions += list(range(start, s.num_cached)) + [0] * (blk - n)
            inp.ctx_slots += self._slots(s.draft_pages, start, s.num_cached) + [-1] * (blk - n)
            inp.pending.append(s.pending_taps)
            s.pending_taps = None
        return inp

    def gather_context(self, pending: list, out: torch.Tensor | None = None) -> torch.Tensor:
        """Stacks the pending rows into ``[b*B, taps]`` (zero rows are padding)."""
        blk = self.block
        if out is None:
            out = torch.zeros(len(pending) * blk, self.tap_dim, dtype=self.target.dtype,
                              device=self.device)
        else:
            out.zero_()
        for i, rows in enumerate(pending):
            if rows is not None and rows.shape[0]:
                out[i * blk:i * blk + rows.shape[0]] = rows
        return out

    # ----------------------------------------------------------------- speculative round
    def propose(self, seqs: list[Sequence], temperature, uniforms):
        """Draft forward: ingests each sequence's pending context and drafts B-1 tokens."""
        dinp = self.draft_inputs(seqs)
        binp = self.block_inputs(seqs, lambda s: s.draft_pages, causal=False)
        if self.graphs is not None and self.graphs.fits(len(seqs)):
            return self.graphs.propose(dinp, binp, temperature, uniforms)
        return self.draft.propose(self.ints(dinp.anchors, torch.long),
                                  self.gather_context(dinp.pending),
                                  self.ints(dinp.ctx_positions), self.ints(dinp.ctx_slots),
                                  self.meta(binp, causal=False), self.draft_kv.k,
                                  self.draft_kv.v, temperature, uniforms)

    def verify(self, seqs: list[Sequence], drafts: torch.Tensor | None):
        """Target forward over [anchor, d_1..d_{B-1}] (or the anchor alone without a draft).
        Returns logits [b, T, V] and taps [b, T, taps*H] (None without a draft)."""
        b, blk = len(seqs), self.block
        inp = self.block_inputs(seqs, lambda s: s.target_pages, causal=True)
        anchors = [s.anchor for s in seqs]
        if self.graphs is not None and self.graphs.fits(b):
            logits, taps = self.graphs.verify(anchors, drafts, inp)
        else:
            a = self.ints(anchors, torch.long)[:, None]
            tokens = a if drafts is None else torch.cat([a, drafts], 1)
            logits, taps = self.target.forward(tokens.reshape(-1), self.meta(inp, causal=True),
                                               self.target_kv.k, self.target_kv.v,
                                               tap_layers=self.taps)
        return logits.view(b, blk, -1), (taps.view(b, blk, -1) if taps is not None else None)

    # ----------------------------------------------------------------- sampling
    def sampling_inputs(self, seqs: list[Sequence], width: int):
        """Per-sequence temperature, top-k, top-p and `width` uniforms from each request's rng
        (the uniforms stay on the host; callers move the slices they need)."""
        temps = self.ints([s.params.temperature for s in seqs], torch.float32)
        top_k = self.ints([s.params.top_k for s in seqs], torch.int32)
        top_p = self.ints([s.params.top_p for s in seqs], torch.float32)
        u = torch.zeros(len(seqs), width)
        for i, s in enumerate(seqs):
            if not s.params.greedy:
                u[i] = s.rng.uniforms(width)
        return temps, top_k, top_p, u

    def verify_tokens(self, logits, drafts, cand_ids, cand_probs, temps, top_k, top_p, uniforms,
                      seqs):
        b = logits.shape[0]
        if drafts is None:
            drafts = torch.empty(b, 0, dtype=torch.long, device=self.device)
            cand_ids = torch.empty(b, 0, 1, dtype=torch.long, device=self.device)
            cand_probs = torch.empty(b, 0, 1, dtype=torch.float32, device=self.device)
        seq_lens = self.ints([s.num_cached for s in seqs])
        return ops.block_verify(logits, drafts, cand_ids, cand_probs, temps, top_k, top_p,
                                self.ints(uniforms, torch.float32), seq_lens)
