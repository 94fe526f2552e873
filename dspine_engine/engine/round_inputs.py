"""The persistent buffers a round reads: one int32 and one fp32 region, staged on the host and
copied to the device in one transfer each.

Per round the host writes only per-sequence scalars (seat, anchor position, pending context
rows, anchor token, sampling parameters) and the uniforms of sampled rows, through numpy views
of the staging buffers; everything per token (positions, slots, block tables, lengths) is
derived on the device from these and the cache manager's table mirrors (runner.py), inside the
captured graphs. On CUDA there are two sets of staging buffers, used in turn (`flip`): with
overlapped rounds the host stages round k+1 while round k's upload may still be queued, but
round k-1's (from the other set) is done, since the host has read round k-1's results, which
come after it on the stream; so an asynchronous copy never reads a buffer the host is
changing. On the CPU the staging buffers are the device buffers.
"""
from __future__ import annotations

import torch

_INT_FIELDS = ("seats", "base", "pending", "anchors", "top_k")  # the first four: seat_rows


class RoundInputs:
    def __init__(self, capacity: int, block: int, top_k: int, device: torch.device):
        self.capacity, self.block, self.device = capacity, block, device
        cap, walk = capacity, block - 1
        cuda = device.type == "cuda"
        n_int = len(_INT_FIELDS) * cap
        n_float = 2 * cap + cap * walk + cap * block
        staging = [(torch.zeros(n_int, dtype=torch.int32, pin_memory=cuda),
                    torch.zeros(n_float, dtype=torch.float32, pin_memory=cuda))
                   for _ in range(2 if cuda else 1)]
        self._dev_i32 = staging[0][0].to(device) if cuda else staging[0][0]
        self._dev_f32 = staging[0][1].to(device) if cuda else staging[0][1]
        spans = {"temps": (0, cap), "top_p": (cap, 2 * cap),
                 "walk_u": (2 * cap, 2 * cap + cap * walk),
                 "verify_u": (2 * cap + cap * walk, n_float)}
        shapes = {"temps": (cap,), "top_p": (cap,), "walk_u": (cap, walk),
                  "verify_u": (cap, block)}
        # Host views (numpy, for the per-round writes) and device views (for the forwards).
        self._sets = [(i32, f32, self._views(i32.numpy(), f32.numpy(), spans, shapes))
                      for i32, f32 in staging]
        self._host_i32, self._host_f32, self.host = self._sets[0]
        self.dev = self._views(self._dev_i32, self._dev_f32, spans, shapes)
        # The seat, base, pending and anchor fields as one [4, capacity] block (seat_state.py
        # gathers a round's into it in one call).
        self.seat_rows = self._dev_i32[:4 * cap].view(4, cap)
        # Fixed for the engine's life: query row offsets and in-block offsets.
        self.cu_q = torch.arange(0, cap * block + 1, block, dtype=torch.int32, device=device)
        self.offsets = torch.arange(block, dtype=torch.int32, device=device)
        # Draft outputs, written by the draft forward (also inside its graph) and read by the
        # verify: static, so they survive any replay (graphs share one memory pool). Without a
        # draft they stay empty: the verifier then checks no drafts (a block of one token).
        self.drafts = torch.zeros(cap, walk, dtype=torch.long, device=device)
        k = top_k if walk else 1
        self.cand_ids = torch.zeros(cap, walk, k, dtype=torch.long, device=device)
        self.cand_probs = torch.zeros(cap, walk, k, dtype=torch.float32, device=device)

    def _views(self, i32, f32, spans: dict, shapes: dict) -> dict:
        cap, views = self.capacity, {}
        for k, name in enumerate(_INT_FIELDS):
            views[name] = i32[k * cap:(k + 1) * cap]
        for name, (a, b) in spans.items():
            views[name] = f32[a:b].reshape(shapes[name])  # a view (numpy and torch alike)
        return views

    def flip(self) -> None:
        """Stages the next round in the other set of host buffers (CUDA; see the module's
        note). Every round's staging starts here."""
        if len(self._sets) > 1:
            self._sets.reverse()
            self._host_i32, self._host_f32, self.host = self._sets[0]

    def upload(self) -> None:
        """One copy per region (a no-op on the CPU, where host and device buffers coincide)."""
        if self.device.type == "cuda":
            self._dev_i32.copy_(self._host_i32, non_blocking=True)
            self._dev_f32.copy_(self._host_f32, non_blocking=True)

    def fill_rows(self, b: int, n: int, padding_seat: int) -> None:
        """Rows b..n-1 become padding: a seat whose table is page 0, anchor position -1 (so
        every slot is -1: nothing is written), no pending context, greedy."""
        h = self.host
        h["seats"][b:n] = padding_seat
        h["base"][b:n] = -1
        h["pending"][b:n] = 0
        h["anchors"][b:n] = 0
        h["top_k"][b:n] = 0
        h["temps"][b:n] = 0.0
        h["top_p"][b:n] = 1.0

