"""Weights kept in GGUF blocks (Q4_1 / Q8_0) on the CPU, and the layers that run on them.

`QuantWeight` is the quantised counterpart of `Dense` (``y = x @ W^T``, through
`ops.quant_matmul`) and of an embedding table (`lookup`, through `ops.quant_embedding`): the
target's projections, its embedding and its lm_head (the same table when tied) are held this
way, 4.5-8.5 bits a weight instead of 32. The blocks come straight from the GGUF file
(`pack_gguf_blocks`) or from fp32 weights through llama.cpp's reference quantisers
(`quantize_blocks`, used for tests and for tensors a GGUF stores in another type).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import ops
from .weight_arena import weight_buffer

# Bytes of one GGUF block of 32 values: fp16 d [+ fp16 m] + the quants.
GGUF_BLOCK_BYTES = {"q8_0": 34, "q4_1": 20}
FORMATS = tuple(GGUF_BLOCK_BYTES)
_TILE = ops.QUANT_TILE_ROWS
_BLOCK = ops.QUANT_BLOCK


@dataclass
class QuantWeight:
    """A ``[rows, cols]`` matrix in packed GGUF blocks (layout: csrc/cpu/quant_gemm.h)."""

    data: torch.Tensor  # uint8 [ceil(rows/16), cols/32, tile-block bytes]
    format: str
    rows: int
    cols: int

    dtype = torch.float32  # what it computes in and returns (so it can stand in for a table)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def out_features(self) -> int:
        return self.rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ops.quant_matmul(x, self.data, self.format, self.rows)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 rows ``ids`` (an embedding lookup)."""
        return ops.quant_embedding(ids, self.data, self.format, self.rows)

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` as fp32 (the exact values the blocks encode)."""
        stop = self.rows if stop is None else stop
        return self.lookup(torch.arange(start, stop))


def embedding_rows(table, ids: torch.Tensor) -> torch.Tensor:
    """``table[ids]`` for a plain tensor or a `QuantWeight`."""
    return table.lookup(ids) if isinstance(table, QuantWeight) else F.embedding(ids, table)


def table_times(table, weight_t: torch.Tensor, chunk_rows: int = 4096,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``table [V, H] @ weight_t [H, r]``, in ``dtype`` (default the product's); a `QuantWeight`
    is dequantised a chunk at a time and each chunk's product converted, so neither the full
    fp32 table nor the full fp32 product ever exists."""
    if not isinstance(table, QuantWeight):
        return (table @ weight_t).to(dtype or weight_t.dtype)
    out = torch.empty(table.rows, weight_t.shape[1], dtype=dtype or weight_t.dtype)
    for i in range(0, table.rows, chunk_rows):
        j = min(i + chunk_rows, table.rows)
        out[i:j] = table.dequantize(i, j) @ weight_t
    return out


# ---------------------------------------------------------------------------------- packing

def pack_gguf_blocks(raw: np.ndarray, format: str, chunk_tiles: int = 256) -> torch.Tensor:
    """Repack GGUF blocks ``raw [rows, cols/32 * block_bytes]`` (uint8, row-major as stored in
    the file) into the tiled layout the kernels read. Works a chunk of tiles at a time, so the
    temporaries stay small beside the result."""
    if format not in GGUF_BLOCK_BYTES:
        raise ValueError(f"unknown quantised format {format!r}; use one of {FORMATS}")
    rows, row_bytes = raw.shape
    bs = GGUF_BLOCK_BYTES[format]
    if row_bytes % bs:
        raise ValueError(f"{format} rows must be whole blocks of {bs} bytes, got {row_bytes}")
    nb = row_bytes // bs
    tiles = math.ceil(rows / _TILE)
    tile_bytes = ops.QUANT_TILE_BLOCK_BYTES[format]
    out = weight_buffer(tiles * nb * tile_bytes).view(tiles, nb, tile_bytes)  # huge pages
    out_np = out.numpy()
    for t0 in range(0, tiles, chunk_tiles):
        t1 = min(tiles, t0 + chunk_tiles)
        chunk = raw[t0 * _TILE:t1 * _TILE]
        if chunk.shape[0] < (t1 - t0) * _TILE:  # zero rows pad the last tile
            chunk = np.concatenate([chunk, np.zeros(((t1 - t0) * _TILE - chunk.shape[0],
                                                     row_bytes), np.uint8)])
        out_np[t0:t1] = _tile_chunk(chunk.reshape(t1 - t0, _TILE, nb, bs), format)
    return out


def _tile_chunk(blocks: np.ndarray, format: str) -> np.ndarray:
    # blocks [T, 16 rows, nb, block bytes] -> [T, nb, tile-block bytes]
    t, _, nb, _ = blocks.shape

    def per_row(a, b):  # a 2-byte field of every row, rows side by side
        return blocks[..., a:b].transpose(0, 2, 1, 3).reshape(t, nb, 2 * _TILE)

    def quads(a, n_quads):  # quant bytes regrouped: 4 consecutive k of row 0, row 1, ...
        q = blocks[..., a:].reshape(t, _TILE, nb, n_quads, 4).transpose(0, 2, 3, 1, 4)
        return q.reshape(t, nb, n_quads * 4 * _TILE)

    if format == "q4_1":  # d, m, then 16 nibble bytes (low = element j, high = j + 16)
        return np.concatenate([per_row(0, 2), per_row(2, 4), quads(4, 4)], axis=-1)
    return np.concatenate([per_row(0, 2), quads(2, 8)], axis=-1)  # q8_0: d, then 32 int8


def quantize_blocks(weight: torch.Tensor, format: str) -> np.ndarray:
    """GGUF blocks of an fp32 ``[rows, cols]`` matrix, by llama.cpp's reference quantisers
    (q8_0: d = amax/127; q4_1: d = (max-min)/15, m = min; scales stored as fp16)."""
    rows, cols = weight.shape
    if cols % _BLOCK:
        raise ValueError(f"cannot quantise {cols} columns: not a multiple of {_BLOCK}")
    x = weight.detach().float().cpu().reshape(rows, cols // _BLOCK, _BLOCK)
    if format == "q8_0":
        d = x.abs().amax(-1) / 127
        inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.round(x * inv[..., None]).clamp(-127, 127).to(torch.int8)
        fields = [d.half().view(torch.uint8).reshape(rows, -1, 2), q.view(torch.uint8)]
    elif format == "q4_1":
        lo, hi = x.amin(-1), x.amax(-1)
        d = (hi - lo) / 15
        inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.round((x - lo[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        fields = [d.half().view(torch.uint8).reshape(rows, -1, 2),
                  lo.half().view(torch.uint8).reshape(rows, -1, 2), packed]
    else:
        raise ValueError(f"unknown quantised format {format!r}; use one of {FORMATS}")
    return torch.cat(fields, dim=-1).reshape(rows, -1).numpy()


def quant_weight_from_blocks(raw: np.ndarray, format: str) -> QuantWeight:
    rows = raw.shape[0]
    cols = raw.shape[1] // GGUF_BLOCK_BYTES[format] * _BLOCK
    return QuantWeight(pack_gguf_blocks(raw, format), format, rows, cols)


def quantize_weight(weight: torch.Tensor, format: str) -> QuantWeight:
    """An fp32 ``[out, in]`` weight as a `QuantWeight` (quantised, then packed)."""
    return quant_weight_from_blocks(quantize_blocks(weight, format), format)


def in_format(table, format: str, chunk_rows: int = 4096) -> QuantWeight:
    """``table`` (a `QuantWeight` or a `Dense`) as a `QuantWeight` in ``format``: itself when it
    already is one, else its values quantised again (a `QuantWeight` a chunk of rows at a time,
    so the full fp32 table never exists)."""
    if isinstance(table, QuantWeight):
        if table.format == format:
            return table
        blocks = [quantize_blocks(table.dequantize(i, min(i + chunk_rows, table.rows)), format)
                  for i in range(0, table.rows, chunk_rows)]
        return quant_weight_from_blocks(np.concatenate(blocks), format)
    return quantize_weight(table.checkpoint_weight, format)
