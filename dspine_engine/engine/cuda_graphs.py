"""CUDA graphs for the two forwards of a round: the target verify and the draft proposal.

Each is captured once per batch size in GRAPH_BATCHES (up to the engine's max_num_seqs); a batch
is padded to the next captured size. Padding rows write nothing (slot -1) and read page 0 (their
results are dropped). Larger batches, and CPU runs, take the eager path of the same code.
Inputs live in static buffers that each round fills with one host-to-device copy per tensor;
the graphs themselves contain no host sync. All graphs share one memory pool, so an output is
valid only until the next replay of any graph: the draft outputs, read after the verify replay,
are copied out; the verify outputs are consumed before the next draft replay.
"""
from __future__ import annotations

import bisect

import torch
from tqdm.auto import tqdm

from ..models.attention_meta import AttnMeta

GRAPH_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


class _Static:
    """The static input buffers of one forward kind (sized for the largest graph)."""

    def __init__(self, runner, max_batch: int, max_pages: int):
        blk, dev, i32 = runner.block, runner.device, torch.int32
        n = max_batch * blk
        self.tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=i32, device=dev)
        self.slots = torch.full((n,), -1, dtype=i32, device=dev)
        self.tables = torch.zeros(max_batch, max_pages, dtype=i32, device=dev)
        self.kv_lens = torch.full((max_batch,), blk, dtype=i32, device=dev)
        self.cu_q = torch.arange(0, n + 1, blk, dtype=i32, device=dev)
        self.max_pages = max_pages

    def fill(self, inp, b: int, padded: int, blk: int) -> None:
        """Copies one round's block inputs in; rows b..padded-1 become harmless padding."""
        n, pn = b * blk, padded * blk
        host = torch.empty(pn * 2 + padded * (self.max_pages + 1), dtype=torch.int32)
        pos, slots = host[:pn], host[pn:2 * pn]
        tables = host[2 * pn:2 * pn + padded * self.max_pages].view(padded, self.max_pages)
        lens = host[2 * pn + padded * self.max_pages:]
        pos.zero_()
        slots.fill_(-1)
        tables.zero_()
        lens.fill_(blk)
        pos[:n] = torch.as_tensor(inp.positions, dtype=torch.int32)
        slots[:n] = torch.as_tensor(inp.slots, dtype=torch.int32)
        for i, t in enumerate(inp.tables):
            tables[i, :len(t)] = torch.as_tensor(t, dtype=torch.int32)
        lens[:b] = torch.as_tensor(inp.kv_lens, dtype=torch.int32)
        dev = host.pin_memory().to(self.positions.device, non_blocking=True)
        self.positions[:pn].copy_(dev[:pn])
        self.slots[:pn].copy_(dev[pn:2 * pn])
        self.tables[:padded].copy_(dev[2 * pn:2 * pn + padded * self.max_pages]
                                   .view(padded, self.max_pages))
        self.kv_lens[:padded].copy_(dev[2 * pn + padded * self.max_pages:])

    def meta(self, padded: int, blk: int, causal: bool) -> AttnMeta:
        n = padded * blk
        return AttnMeta(self.positions[:n], self.slots[:n], self.tables[:padded],
                        self.kv_lens[:padded], self.cu_q[:padded + 1], blk, causal=causal)


class CudaGraphRunner:
    def __init__(self, runner, max_num_seqs: int, progress: bool = True):
        self.runner = runner
        self.sizes = [b for b in GRAPH_BATCHES if b <= max(1, max_num_seqs)]
        if max_num_seqs > self.sizes[-1] and max_num_seqs <= GRAPH_BATCHES[-1]:
            self.sizes.append(GRAPH_BATCHES[bisect.bisect_left(GRAPH_BATCHES, max_num_seqs)])
        blk = runner.block
        max_len = runner.target.config.max_position_embeddings + blk
        self.max_pages = -(-max_len // runner.target_kv.page_size)
        top = self.sizes[-1]
        self.verify_in = _Static(runner, top, self.max_pages)
        self.pool = torch.cuda.graph_pool_handle()
        self._verify_graphs: dict[int, tuple] = {}
        self._draft_graphs: dict[int, tuple] = {}
        if runner.draft is not None:
            self.draft_in = _Static(runner, top, self.max_pages)
            self.anchors = torch.zeros(top, dtype=torch.long, device=runner.device)
            self.ctx = torch.zeros(top * blk, runner.tap_dim, dtype=runner.target.dtype,
                                   device=runner.device)
            self.ctx_positions = torch.zeros(top * blk, dtype=torch.int32, device=runner.device)
            self.ctx_slots = torch.full((top * blk,), -1, dtype=torch.int32, device=runner.device)
            self.temps = torch.zeros(top, dtype=torch.float32, device=runner.device)
            self.walk_u = torch.zeros(top, blk - 1, dtype=torch.float32, device=runner.device)
        self._capture_all(progress)

    def fits(self, b: int) -> bool:
        return b <= self.sizes[-1]

    def _padded(self, b: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, b)]

    # ------------------------------------------------------------------ capture
    def _capture_all(self, progress: bool) -> None:
        kinds = 2 if self.runner.draft is not None else 1
        bar = tqdm(total=len(self.sizes) * kinds, desc="capturing CUDA graphs", unit="graph",
                   disable=not progress, leave=False)
        for b in reversed(self.sizes):  # largest first: smaller graphs reuse its memory
            self._verify_graphs[b] = self._capture(lambda b=b: self._verify_fn(b))
            bar.update()
            if self.runner.draft is not None:
                self._draft_graphs[b] = self._capture(lambda b=b: self._draft_fn(b))
                bar.update()
        bar.close()

    def _capture(self, fn):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, lazy init)
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    def _verify_fn(self, b: int):
        r, blk = self.runner, self.runner.block
        meta = self.verify_in.meta(b, blk, causal=True)
        return r.target.forward(self.verify_in.tokens[:b * blk], meta, r.target_kv.k,
                                r.target_kv.v, tap_layers=r.taps)

    def _draft_fn(self, b: int):
        r, blk = self.runner, self.runner.block
        n = b * blk
        meta = self.draft_in.meta(b, blk, causal=False)
        return r.draft.propose(self.anchors[:b], self.ctx[:n], self.ctx_positions[:n],
                               self.ctx_slots[:n], meta, r.draft_kv.k, r.draft_kv.v,
                               self.temps[:b], self.walk_u[:b])

    # ------------------------------------------------------------------ replay
    def verify(self, anchors: list[int], drafts, inp):
        b, blk = len(anchors), self.runner.block
        padded = self._padded(b)
        self.verify_in.fill(inp, b, padded, blk)
        tokens = self.verify_in.tokens[:padded * blk].view(padded, blk)
        tokens[:b, 0].copy_(torch.as_tensor(anchors).pin_memory(), non_blocking=True)
        if drafts is not None:
            tokens[:b, 1:].copy_(drafts)
        graph, (logits, taps) = self._verify_graphs[padded]
        graph.replay()
        n = b * blk
        return logits[:n], (taps[:n] if taps is not None else None)

    def propose(self, dinp, binp, temperature, uniforms):
        b, blk = len(dinp.anchors), self.runner.block
        padded = self._padded(b)
        self.draft_in.fill(binp, b, padded, blk)
        n, pn = b * blk, padded * blk
        self.anchors[:b].copy_(torch.as_tensor(dinp.anchors).pin_memory(), non_blocking=True)
        self.runner.gather_context(dinp.pending, self.ctx[:pn])
        host = torch.tensor(dinp.ctx_positions + dinp.ctx_slots, dtype=torch.int32)
        dev = host.pin_memory().to(self.ctx_slots.device, non_blocking=True)
        self.ctx_positions[:n].copy_(dev[:n])
        self.ctx_slots[:n].copy_(dev[n:])
        self.ctx_slots[n:pn].fill_(-1)
        self.temps[:b].copy_(temperature)
        self.walk_u[:b].copy_(uniforms)
        graph, (tokens, cand_ids, cand_probs) = self._draft_graphs[padded]
        graph.replay()
        # Copied out: the graphs share one memory pool, so a draft graph's outputs may sit where
        # a verify graph keeps its temporaries, and the round reads the drafts after the verify
        # replay. (Without the copy, drafts were overwritten and nothing was ever accepted.)
        return tokens[:b].clone(), cand_ids[:b].clone(), cand_probs[:b].clone()
