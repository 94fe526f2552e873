"""CUDA graphs of a round's forwards, one per batch size.

A `GraphSet` captures functions ``body(n, width)`` that read only persistent buffers (the
runner's round inputs, block-table mirrors, KV caches) and replays them; it knows nothing of the
runner. A batch is padded to the next captured size; padding rows write nothing (the runner stages
them so). The graphs contain no host sync. All graphs share one memory pool, so a graph's
outputs are valid only until the next replay of any graph: outputs that must live longer (the
draft tokens, read by the verify) are copied into static buffers inside the graph itself.

Partners (tensor parallelism): other processes whose own graphs must replay with this one's,
because a captured forward holds collectives. A partner is told after each capture
(``graph_captured()`` returns what that graph holds of theirs) and before each replay
(``graph_replaying(that)``); `DrivenTarget` is the one partner there is.
"""
from __future__ import annotations

import bisect

import torch
from tqdm.auto import tqdm

# Batch sizes captured (up to the engine's max_num_seqs, plus the next size above it). Dense at
# the small end, where padding costs most per row; up to 512 for batched autoregressive decoding
# (the training-data generator).
GRAPH_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)


def graph_sizes(max_num_seqs: int) -> list[int]:
    sizes = [b for b in GRAPH_BATCHES if b <= max(1, max_num_seqs)]
    if max_num_seqs > sizes[-1] and max_num_seqs <= GRAPH_BATCHES[-1]:
        sizes.append(GRAPH_BATCHES[bisect.bisect_left(GRAPH_BATCHES, max_num_seqs)])
    return sizes


class GraphSet:
    def __init__(self, sizes: list[int], partner=None):
        self.sizes = sorted(sizes)
        self.pool = torch.cuda.graph_pool_handle()
        self.partner = partner
        # (name, size) -> (graph, its outputs, what it holds of the partner's)
        self._graphs: dict[tuple[str, int], tuple[torch.cuda.CUDAGraph, object, object]] = {}

    def fits(self, b: int) -> bool:
        return b <= self.sizes[-1]

    def has(self, name: str) -> bool:
        """Whether ``name`` was captured (at every size)."""
        return any(key[0] == name for key in self._graphs)

    def padded(self, b: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, b)]

    def capture_all(self, bodies, width: int, progress: bool) -> None:
        """Captures every ``(name, body)`` at every size, largest first (smaller graphs reuse
        its memory)."""
        bar = tqdm(total=len(self.sizes) * len(bodies), desc="capturing CUDA graphs",
                   unit="graph", disable=not progress, leave=False)
        for n in reversed(self.sizes):
            for name, body in bodies:
                graph, out = self._capture(lambda: body(n, width))
                held = self.partner.graph_captured() if self.partner is not None else None
                self._graphs[(name, n)] = graph, out, held
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

    def graph(self, name: str, n: int) -> torch.cuda.CUDAGraph:
        return self._graphs[(name, n)][0]

    def replay(self, name: str, n: int):
        """Replays the graph of ``name`` at size ``n`` (its partners' too); returns its captured
        outputs."""
        graph, out, held = self._graphs[(name, n)]
        if self.partner is not None:
            self.partner.graph_replaying(held)
        graph.replay()
        return out
