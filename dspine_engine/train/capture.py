"""Online capture of the target's tapped hidden states for a training batch.

The frozen target runs one causal prefill over every sequence of the batch (varlen, no padding)
through its own forward and a scratch paged KV cache, exactly as `ModelRunner.prefill` does at
inference. Because the verify forward is causal too, the state tapped at position t here is the
one the engine appends to the draft context at t, so training sees inference's context.
"""
from __future__ import annotations

import torch

from .. import ops
from ..engine.kv_cache import KVCache, pages_for
from ..models.attention_meta import AttnMeta
from ..models.target import TargetModel


class TargetCapture:
    """Runs the frozen target over batches and returns its tapped states, padded per sequence.

    The scratch cache is sized for ``max_tokens`` tokens at once and reused for every batch:
    each sequence takes a contiguous run of pages, so its slots are simply ``base + t``."""

    def __init__(self, target: TargetModel, tap_layers: list[int], max_tokens: int,
                 page_size: int = 16):
        cfg = target.config
        self.target = target
        self.tap_layers = tuple(tap_layers)
        self.page_size = page_size
        self.num_pages = pages_for(max_tokens, page_size) + 1
        self.kv = KVCache(cfg.num_kv_layers, self.num_pages, page_size, cfg.num_kv_heads,
                          cfg.head_dim, target.dtype, target.device)

    def prefill_meta(self, lengths: list[int]) -> AttnMeta:
        """Causal prefill metadata for sequences of these lengths, each in its own pages."""
        ps, dev = self.page_size, self.target.device
        pages = [pages_for(n, ps) for n in lengths]
        if sum(pages) > self.num_pages:
            raise ValueError(f"batch needs {sum(pages)} KV pages, the scratch cache has "
                             f"{self.num_pages}; lower --batch-size or --max-len")
        first_page = torch.tensor([0] + pages[:-1]).cumsum(0)
        lens = torch.tensor(lengths)
        seq = torch.repeat_interleave(torch.arange(len(lengths)), lens)
        cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
        positions = torch.arange(int(cu[-1])) - cu[:-1][seq]
        slots = first_page[seq] * ps + positions
        tables = first_page[:, None] + torch.arange(max(pages))[None, :]
        i32 = lambda t: t.to(device=dev, dtype=torch.int32)  # noqa: E731
        return AttnMeta(i32(positions), i32(slots), i32(tables.clamp(max=self.num_pages - 1)),
                        i32(lens), i32(cu), max(lengths), causal=True)

    def __call__(self, tokens: torch.Tensor, lengths: list[int], final: bool = False):
        """``tokens [b, S]`` (padded) -> taps ``[b, S, len(taps) * H]`` (zeros past each end),
        and with ``final`` also the target's final-normed states ``[b, S, H]`` (what its lm_head
        reads: the soft labels' source), as ``(taps, final)``.

        The results are ordinary tensors (not inference-mode ones), so the draft's first
        projection can save them for backward."""
        b, s = tokens.shape
        cfg, dev = self.target.config, self.target.device
        lens = torch.tensor(lengths, device=tokens.device)
        real = torch.arange(s, device=tokens.device)[None, :] < lens[:, None]
        flat = tokens[real].to(dev)
        real = real.to(dev)  # where the rows go back, on the target's device
        meta = self.prefill_meta(lengths)
        one_row = torch.zeros(1, dtype=torch.long, device=dev)  # logits are not needed
        layers = self.tap_layers + ((cfg.num_layers - 1,) if final else ())
        _, taps = self.target.forward(flat, meta, self.kv.k, self.kv.v, logit_rows=one_row,
                                      tap_layers=layers)
        if final:  # the last layer's output, normed as the target's lm_head sees it
            taps, last = taps[:, :-cfg.hidden_size], taps[:, -cfg.hidden_size:]
            normed = torch.zeros(b, s, cfg.hidden_size, dtype=taps.dtype, device=dev)
            normed[real] = ops.rms_norm(last.contiguous(), self.target.norm, cfg.rms_norm_eps)
        out = torch.zeros(b, s, taps.shape[-1], dtype=taps.dtype, device=dev)
        out[real] = taps
        return (out, normed) if final else out
