"""Sizing and initialising a fresh DSpine (or DFlash-ablation) draft for a target."""
from __future__ import annotations

import torch

from ..models.config import ModelConfigError, TargetConfig
from ..models.draft_config import DraftConfig, evenly_spaced_layers
from ..models.dspine import DSpineDraft
from ..models.target import TargetModel


def new_draft_config(target: TargetConfig, layers: int = 5, heads: int | None = None,
                     kv_heads: int | None = None, head_dim: int | None = None,
                     intermediate: int | None = None, block_size: int = 16,
                     sliding_window: int | None = 8192, mask_token_id: int | None = None,
                     rank: int = 256, top_k: int = 8, target_layers: list[int] | None = None,
                     injection: bool = True, transition: bool = True) -> DraftConfig:
    """A draft config for ``target``: hidden size, vocabulary, RoPE base, norm eps and context
    length come from the target; attention/MLP shapes default to the target's own; the tapped
    layers default to DFlash's choice (as many as draft layers, evenly spaced)."""
    if target_layers is None:
        target_layers = evenly_spaced_layers(target.num_layers, layers)
        if sorted(set(target_layers)) != target_layers or target_layers[-1] >= target.num_layers:
            raise ModelConfigError(
                f"cannot space {layers} tapped layers over a {target.num_layers}-layer target; "
                "give --target-layers explicitly")
    cfg = DraftConfig(
        hidden_size=target.hidden_size, num_layers=layers,
        num_heads=heads or target.num_heads, num_kv_heads=kv_heads or target.num_kv_heads,
        head_dim=head_dim or target.head_dim,
        intermediate_size=intermediate or target.intermediate_size,
        vocab_size=target.vocab_size, target_layer_ids=list(target_layers),
        rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
        max_position_embeddings=target.max_position_embeddings, block_size=block_size,
        sliding_window=sliding_window or None, mask_token_id=mask_token_id,
        injection=injection, transition=transition, transition_rank=rank,
        transition_top_k=top_k)
    cfg.validate()
    cfg.check_target(target)
    return cfg


def mlp_neurons(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, keep: int):
    """The ``keep`` MLP neurons of a SwiGLU block with the largest weight-norm product
    ||gate_i|| ||up_i|| ||down_:,i|| (a magnitude prune, in their original order): how a draft
    with a narrower MLP than the target's starts from a target layer."""
    score = gate.float().norm(dim=1) * up.float().norm(dim=1) * down.float().norm(dim=0)
    return torch.topk(score, keep).indices.sort().values


@torch.no_grad()
def copy_target_layers(draft: DSpineDraft, target: TargetModel) -> list[int]:
    """Starts draft layer i from target layer L - n + i (the last n target layers, which work on
    representations closest to the output space the draft predicts in): attention, MLP and the
    two norms. Attention shapes must match; a narrower draft MLP takes the target's strongest
    neurons (`mlp_neurons`). Returns the target layers used."""
    c, t = draft.config, target.config
    same = (c.num_heads, c.num_kv_heads, c.head_dim) == (t.num_heads, t.num_kv_heads, t.head_dim)
    if not same or c.intermediate_size > t.intermediate_size:
        raise ModelConfigError("--init-from-target needs the draft's heads, kv heads and head "
                               "dim to equal the target's, and an intermediate size no larger")
    q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, t.intermediate_size
    used = list(range(t.num_layers - c.num_layers, t.num_layers))
    for layer, src in zip(draft.layers, (target.layers[i] for i in used)):
        a = layer.self_attn
        qkv = src.qkv.checkpoint_weight  # on the CPU an unpacked copy: made once a layer
        for proj, rows in ((a.q_proj, slice(0, q)), (a.k_proj, slice(q, q + kv)),
                           (a.v_proj, slice(q + kv, q + 2 * kv))):
            proj.weight.copy_(qkv[rows])
        a.o_proj.weight.copy_(src.o.checkpoint_weight)
        gate_up = src.gate_up.checkpoint_weight
        gate, up = gate_up[:inter], gate_up[inter:]
        down = src.down.checkpoint_weight
        keep = mlp_neurons(gate, up, down, c.intermediate_size)
        layer.mlp.gate_proj.weight.copy_(gate[keep])
        layer.mlp.up_proj.weight.copy_(up[keep])
        layer.mlp.down_proj.weight.copy_(down[:, keep])
        layer.input_layernorm.weight.copy_(src.in_norm)
        layer.post_attention_layernorm.weight.copy_(src.post_norm)
        if src.q_norm is not None:
            a.q_norm.weight.copy_(src.q_norm)
            a.k_norm.weight.copy_(src.k_norm)
    return used
