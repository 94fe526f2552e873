"""Megatron-style sharding of a built dense target, in place (the idea of gpt-fast's tp.py).

The model is loaded whole, then each layer's projections are cut into this rank's share:
- q|k|v: column-parallel, by heads: this rank's query heads and its KV heads (GQA groups stay
  whole: query head h reads KV head h // group, and both are cut at the same group boundary);
- gate|up: column-parallel, this rank's slice of the intermediate features (of both halves);
- o and down: row-parallel, the matching input slices, one all-reduce each (parallel_dense.py);
- lm_head: vocabulary-parallel, logits gathered on rank 0;
- embeddings, norms (q/k norms are per head-dim, shared by all heads) and RoPE: replicated.
Afterwards ``model.config`` describes this rank's shard (heads, KV heads and intermediate size
divided by N), as gpt-fast rewrites ``n_head`` and friends: the forward and the paged KV pool
then size themselves for this rank's heads with no other change. The vocabulary stays whole in
the config: the gathered logits cover it.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..models.dense import Dense
from ..models.target import TargetModel
from .parallel_dense import RowParallelDense, VocabParallelHead


def shard_target(model: TargetModel, rank: int, world: int) -> TargetModel:
    """Cuts ``model`` (a dense Llama/Qwen2/Qwen3 target, validated by layout.check_layout) into
    rank ``rank``'s share of ``world``, in place; returns it."""
    cfg = model.config
    d, inter = cfg.head_dim, cfg.intermediate_size
    heads, kv_heads, share = cfg.num_heads // world, cfg.num_kv_heads // world, inter // world
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d
    qkv_parts = [(0, heads * d), (q_out, kv_heads * d), (q_out + kv_out, kv_heads * d)]
    for layer in model.layers:
        layer.qkv = _column_slices(layer.qkv, qkv_parts, rank)
        layer.o = RowParallelDense(_input_slice(layer.o, rank * heads * d, heads * d))
        layer.gate_up = _column_slices(layer.gate_up, [(0, share), (inter, share)], rank)
        layer.down = RowParallelDense(_input_slice(layer.down, rank * share, share))
    model.lm_head_dense = _vocab_shard(model.lm_head_dense, cfg.vocab_size, rank, world)
    model.config = dataclasses.replace(cfg, num_heads=heads, num_kv_heads=kv_heads,
                                       intermediate_size=share)
    model.layer_tables = None  # ops.target_layers holds whole tables: the sharded loop runs op by op
    return model


def _column_slices(dense: Dense, parts: list[tuple[int, int]], rank: int) -> Dense:
    """The output rows ``start + rank*size .. + size`` of every (start, size) part, fused."""
    w, b = dense.checkpoint_weight, dense.bias
    rows = [slice(start + rank * size, start + (rank + 1) * size) for start, size in parts]
    weight = torch.cat([w[r] for r in rows]).contiguous()
    bias = torch.cat([b[r] for r in rows]).contiguous() if b is not None else None
    return Dense(weight, bias)


def _input_slice(dense: Dense, start: int, size: int) -> Dense:
    return Dense(dense.checkpoint_weight[:, start:start + size].contiguous(), dense.bias)


def _vocab_shard(head: Dense, vocab: int, rank: int, world: int) -> VocabParallelHead:
    rows = -(-vocab // world)
    w = head.checkpoint_weight
    if rows * world != vocab:
        w = F.pad(w, (0, 0, 0, rows * world - vocab))
    shard = Dense(w[rank * rows:(rank + 1) * rows].contiguous(), vocabulary=True)
    return VocabParallelHead(shard, vocab, rank, world)
