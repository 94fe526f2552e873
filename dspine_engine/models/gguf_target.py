"""A llama-architecture GGUF loaded as a target whose weights stay quantised (CPU).

The file's own Q4_1 / Q8_0 blocks are read tensor by tensor (plain reads, so the file's pages
never count against the process) and repacked for the kernels; no fp32 copy
of a matrix is ever made. Tensors stored in another type (F16, F32, K-quants, ...) are
dequantised and requantised to Q8_0, as are fused groups (q|k|v, gate|up) whose members differ
in type. Norm weights are fp32 as in the file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .config import ModelConfigError, TargetConfig
from .gguf import _check_tensors, _torch_shape, llama_config, unpermute_rotary_rows
from .gguf_header import read_gguf_header
from .quant_dense import (GGUF_BLOCK_BYTES, QuantWeight, quant_weight_from_blocks,
                          quantize_blocks)
from .target import TargetLayer, TargetModel

FALLBACK_FORMAT = "q8_0"
QUANTIZED_DTYPE = "gguf"  # the dtype name that asks for this path explicitly


def use_quantized(dtype, device: torch.device, gguf_path: Path | None) -> bool:
    """Whether a target runs on its GGUF blocks: by default for a GGUF target on the CPU, always
    for ``dtype="gguf"`` (an error where it cannot), never for an explicit float dtype."""
    if dtype == QUANTIZED_DTYPE:
        if device.type != "cpu":
            raise ValueError(f"dtype={QUANTIZED_DTYPE!r} (quantised GGUF weights) runs on the CPU "
                             f"only, not on {device}; use bfloat16 or float32 there")
        if gguf_path is None:
            raise ValueError(f"dtype={QUANTIZED_DTYPE!r} needs a .gguf target (or the default "
                             "model); a model directory holds float weights")
        return True
    return dtype in (None, "auto") and device.type == "cpu" and gguf_path is not None



class _TensorReader:
    """Raw GGUF tensors by name, as [rows, row bytes] blocks or fp32 arrays."""

    def __init__(self, path: Path, tensors: dict):
        self.path = path
        self.tensors = tensors
        self.file = open(path, "rb")

    def format(self, name: str) -> str | None:
        kind = self.tensors[name].tensor_type.name.lower()
        return kind if kind in GGUF_BLOCK_BYTES else None

    def blocks(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        rows = _torch_shape(t)[0]
        self.file.seek(int(t.data_offset))
        data = np.fromfile(self.file, dtype=np.uint8, count=int(t.n_bytes))
        return data.reshape(rows, -1)

    def float32(self, name: str) -> torch.Tensor:
        from gguf.quants import dequantize

        t = self.tensors[name]
        values = np.asarray(dequantize(self.blocks(name), t.tensor_type), dtype=np.float32)
        return torch.from_numpy(values.reshape(_torch_shape(t)).copy())

    def close(self) -> None:
        self.file.close()


def load_gguf_target(path, progress: bool = True) -> TargetModel:
    """The target of a llama GGUF with quantised projections, embedding and lm_head."""
    from tqdm.auto import tqdm

    path = Path(path)
    meta, tensors = read_gguf_header(path)
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"unsupported GGUF architecture {meta.get('general.architecture')!r}: "
                         "only 'llama' can be imported")
    _check_tensors(tensors)
    if "blk.0.attn_q.bias" in tensors or "blk.0.ffn_up.bias" in tensors:
        raise ModelConfigError("the quantised CPU path has no projection biases; load this "
                               "model with dtype='float32'")
    cfg = TargetConfig.from_dict(llama_config(meta, tensors, torch.float32))
    raw = _TensorReader(path, tensors)
    try:
        bar = tqdm(total=cfg.num_layers + 1, desc="loading quantised target", unit="layer",
                   disable=not progress)
        with bar:
            layers = []
            for i in range(cfg.num_layers):
                layers.append(_layer(raw, cfg, i))
                bar.update(1)
            embed = _quant(raw, ["token_embd.weight"], cfg)
            lm_head = _quant(raw, ["output.weight"], cfg) if "output.weight" in tensors \
                else embed
            norm = raw.float32("output_norm.weight")
            bar.update(1)
    finally:
        raw.close()
    return TargetModel(cfg, embed, layers, norm, lm_head)


def _layer(raw: _TensorReader, cfg: TargetConfig, i: int) -> TargetLayer:
    p = f"blk.{i}."
    return TargetLayer(
        in_norm=raw.float32(p + "attn_norm.weight"),
        qkv=_quant(raw, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], cfg),
        q_norm=None, k_norm=None,
        o=_quant(raw, [p + "attn_output.weight"], cfg),
        post_norm=raw.float32(p + "ffn_norm.weight"),
        gate_up=_quant(raw, [p + "ffn_gate.weight", p + "ffn_up.weight"], cfg),
        down=_quant(raw, [p + "ffn_down.weight"], cfg),
        window=0,
        kv_index=i,
    )


def _quant(raw: _TensorReader, names: list[str], cfg: TargetConfig) -> QuantWeight:
    """The row-wise concatenation of `names` as one QuantWeight, in the file's format when they
    all share a supported one."""
    formats = {raw.format(n) for n in names}
    fmt = formats.pop() if len(formats) == 1 and None not in formats else None
    if fmt is not None:
        parts = [_hf_rows(raw.blocks(n), n, cfg) for n in names]
        return quant_weight_from_blocks(np.concatenate(parts) if len(parts) > 1 else parts[0],
                                        fmt)
    parts = [quantize_blocks(_hf_rows(raw.float32(n), n, cfg), FALLBACK_FORMAT) for n in names]
    return quant_weight_from_blocks(np.concatenate(parts), FALLBACK_FORMAT)


def _hf_rows(rows, name: str, cfg: TargetConfig):
    """Undo llama.cpp's interleaving of Q/K rows (works on block bytes as on values)."""
    heads = cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads \
        if ".attn_k." in name else None
    if heads is None:
        return rows
    as_tensor = torch.from_numpy(rows) if isinstance(rows, np.ndarray) else rows
    out = unpermute_rotary_rows(as_tensor, heads).contiguous()
    return out.numpy() if isinstance(rows, np.ndarray) else out
