"""Drives a hybrid target model directly (no engine): a few sequences, each with its own run of
KV pages and its own recurrent-state slot, through prefill, decode and verify blocks."""
from __future__ import annotations

import torch

from dspine_engine.engine.kv_cache import KVCache
from dspine_engine.models.attention_meta import AttnMeta
from dspine_engine.models.recurrent_state import RecurrentMeta


class ModelRun:
    def __init__(self, model, num_seqs: int, max_len: int, ring_len: int = 0,
                 page_size: int = 16):
        cfg = model.config
        self.model, self.page_size = model, page_size
        self.pages_per_seq = -(-max_len // page_size)
        self.kv = KVCache(cfg.num_kv_layers, num_seqs * self.pages_per_seq, page_size,
                          cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device)
        self.state = model.new_state(num_seqs, ring_len)
        self.lens = [0] * num_seqs  # tokens whose K/V and state are committed

    def _i32(self, values):
        return torch.tensor(values, dtype=torch.int32, device=self.model.device)

    def _table(self, b):
        return list(range(b * self.pages_per_seq, (b + 1) * self.pages_per_seq))

    def forward(self, seqs: list[int], tokens: list[list[int]], checkpoint: bool = False,
                tap_layers=()):
        """Runs tokens[i] for sequence seqs[i] at its next positions; returns (logits of every
        row, taps, cu_q). Without checkpoint the tokens are committed at once."""
        positions, slots, cu = [], [], [0]
        for b, toks in zip(seqs, tokens):
            p = range(self.lens[b], self.lens[b] + len(toks))
            positions += p
            slots += [self._table(b)[i // self.page_size] * self.page_size + i % self.page_size
                      for i in p]
            cu.append(cu[-1] + len(toks))
        i32 = self._i32
        meta = AttnMeta(i32(positions), i32(slots), i32([self._table(b) for b in seqs]),
                        i32([self.lens[b] + len(t) for b, t in zip(seqs, tokens)]), i32(cu),
                        max(len(t) for t in tokens), True,
                        RecurrentMeta(self.state, i32(seqs), checkpoint))
        flat = torch.tensor([t for toks in tokens for t in toks], device=self.model.device)
        logits, taps = self.model.forward(flat, meta, self.kv.k, self.kv.v,
                                          tap_layers=tap_layers)
        if not checkpoint:
            for b, toks in zip(seqs, tokens):
                self.lens[b] += len(toks)
        return logits, taps, cu

    def commit(self, seqs: list[int], accepted: list[int]) -> None:
        """After a checkpoint forward: keeps the first accepted[i] tokens of each block."""
        self.state.commit(self._i32(seqs), self._i32(accepted))
        for b, m in zip(seqs, accepted):
            self.lens[b] += m


def greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens per prompt: one batched prefill, then batched one-token decode steps."""
    run = ModelRun(model, len(prompts), max(map(len, prompts)) + n)
    seqs = list(range(len(prompts)))
    logits, _, cu = run.forward(seqs, prompts)
    out = [[int(logits[cu[i + 1] - 1].argmax())] for i in seqs]
    for _ in range(n - 1):
        logits, _, _ = run.forward(seqs, [[o[-1]] for o in out])
        for i in seqs:
            out[i].append(int(logits[i].argmax()))
    return out
