"""Randomly initialised DSpine/DFlash drafts for the tests: sized for SmolLM2-135M (the CPU and
GPU engine tests) or for the tiny test target (CLI and benchmark tests)."""
from __future__ import annotations

import torch

from dspine_engine.models.draft_config import DraftConfig, evenly_spaced_layers
from dspine_engine.models.dspine import DSpineDraft


def smollm2_draft_config(**kw) -> DraftConfig:
    base = dict(hidden_size=576, num_layers=2, num_heads=9, num_kv_heads=3, head_dim=64,
                intermediate_size=512, vocab_size=49152, rope_theta=100000.0,
                target_layer_ids=evenly_spaced_layers(30, 3), sliding_window=None,
                transition_rank=32)
    base.update(kw)
    return DraftConfig(**base)


def write_random_draft(path, **kw):
    DSpineDraft(smollm2_draft_config(**kw)).init_weights(seed=7).save(path, torch.float32)
    return path


def write_tiny_random_draft(path, seed: int, **kw):
    """A one-layer random draft that fits the `tiny_llama` test target (hidden 64, 3 layers)."""
    base = dict(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                intermediate_size=96, vocab_size=49152, target_layer_ids=[0, 2],
                max_position_embeddings=512, transition_rank=8)
    base.update(kw)
    cfg = DraftConfig(**base)
    DSpineDraft(cfg).init_weights(seed).save(path, torch.float32)
    return path
