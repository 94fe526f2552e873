"""Hybrid targets: Gated DeltaNet linear-attention layers between full-attention layers
(Qwen3-Next / Qwen3.5 text models, dense MLP).

The full-attention layers are the target's ordinary attention layers with an output gate and
partial RoPE; the linear layers keep a recurrent state per sequence (models/recurrent_state.py)
instead of K/V. One forward serves prefill (chunked delta rule), decode (one recurrent step) and
the verify block (recurrent steps from the round's checkpoint, recording what replay needs); the
mode follows from the metadata.

Load-time conventions (all exact rewrites of the checkpoint, no approximation):
- Every RMSNorm but the gated one computes ``x * (1 + w)``: ``1 + w`` is stored.
- Partial RoPE: the dims of each q/k head are reordered so the rotated pairs (i, i + R/2) of the
  rotary part become (i, i + D/2) and the pass-through dims take frequency 0; q.k is invariant
  under the common reordering, so the ordinary RoPE kernels serve (ops.rope_cos_sin).
- q_proj's per-head [query | gate] rows become [all queries | ...] with the gates after v, and
  Qwen3-Next's per-key-group interleaved qkvz/ba projections become Qwen3.5's q | k | v | z | b |
  a, so both flavours run one code path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops
from .attention_meta import AttnMeta
from .dense import Dense
from .config import ModelConfigError
from .hybrid_config import HybridConfig
from .recurrent_state import RecurrentMeta, RecurrentState
from .target import TargetLayer, TargetModel
from .weights import WeightStore


@dataclass
class LinearLayer:
    """One Gated DeltaNet layer with its MLP."""

    in_norm: torch.Tensor
    proj: Dense  # q | k | v (the conv's input) | z | b | a
    conv_weight: torch.Tensor  # [conv_dim, K]
    a_log: torch.Tensor  # [Hv] fp32
    dt_bias: torch.Tensor  # [Hv] fp32
    norm: torch.Tensor  # gated RMSNorm weight [dv]
    out: Dense
    post_norm: torch.Tensor
    gate_up: Dense
    down: Dense
    state_index: int  # which linear layer of the RecurrentState


_EMPTY = torch.empty(0)


def partial_rope_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """New position -> checkpoint position of a head's dims, pairing rotated dims (i, i + D/2)."""
    half, rot_half = head_dim // 2, rotary_dim // 2
    rotated = torch.arange(rotary_dim)
    passing = torch.arange(rotary_dim, head_dim)
    pass_half = half - rot_half
    return torch.cat([rotated[:rot_half], passing[:pass_half], rotated[rot_half:],
                      passing[pass_half:]])


class HybridTargetModel(TargetModel):
    config: HybridConfig

    @classmethod
    def from_store(cls, cfg: HybridConfig, store: WeightStore, device,
                   dtype) -> "HybridTargetModel":
        loader = _Loader(cfg, store, device, dtype)
        layers, kv_index, state_index = [], 0, 0
        for i, kind in enumerate(cfg.layer_types):
            if kind == "full_attention":
                layers.append(loader.attention_layer(i, kv_index))
                kv_index += 1
            else:
                layers.append(loader.linear_layer(i, state_index))
                state_index += 1
        embed, norm, lm_head = loader.embeddings()
        return cls(cfg, embed, layers, norm, lm_head)

    # ---------------------------------------------------------------------------- state
    def new_state(self, num_slots: int, ring_len: int = 0) -> RecurrentState:
        return RecurrentState(self.config, num_slots, ring_len, self.dtype, self.device)

    # ---------------------------------------------------------------------------- forward
    def forward(self, tokens: torch.Tensor, meta: AttnMeta, k_caches, v_caches,
                logit_rows: torch.Tensor | None = None, tap_layers: tuple[int, ...] = ()):
        """As TargetModel.forward; ``meta.recurrent`` names each sequence's state slot. Without
        it (a one-off causal prefill, e.g. the trainer's capture) every sequence starts from a
        zero state that is dropped afterwards."""
        if meta.recurrent is None:
            b = meta.kv_lens.shape[0]
            slots = torch.arange(b, dtype=torch.int32, device=self.device)
            meta = dataclasses.replace(meta, recurrent=RecurrentMeta(self.new_state(b), slots))
        return super().forward(tokens, meta, k_caches, v_caches, logit_rows, tap_layers)

    def _mix(self, layer, x, meta: AttnMeta, k_caches, v_caches) -> torch.Tensor:
        if isinstance(layer, LinearLayer):
            return self._gated_delta_net(layer, x, meta)
        return super()._mix(layer, x, meta, k_caches, v_caches)

    def _gated_delta_net(self, layer: LinearLayer, x, meta: AttnMeta) -> torch.Tensor:
        cfg, rec = self.config, meta.recurrent
        n, hk, hv = x.shape[0], cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv, kd, cd = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.key_dim, cfg.conv_dim
        conv_state, ssm, ring_k, ring_u, ring_g = rec.state.layer(layer.state_index)
        proj = layer.proj(x)
        mixed = ops.causal_conv1d(proj[:, :cd], layer.conv_weight, conv_state, rec.slots,
                                  meta.cu_q, meta.max_q_len, rec.checkpoint)
        q, k = mixed[:, :kd].view(n, hk, dk), mixed[:, kd:2 * kd].view(n, hk, dk)
        v = mixed[:, 2 * kd:].view(n, hv, dv)
        z = proj[:, cd:cd + cfg.value_dim].view(n, hv, dv)
        b, a = proj[:, cd + cfg.value_dim:cd + cfg.value_dim + hv], proj[:, -hv:]
        args = (q, k, v, a, b, layer.a_log, layer.dt_bias, ssm, rec.slots, meta.cu_q,
                meta.max_q_len)
        if rec.checkpoint:  # a verify block: keep the checkpoint, record the replay inputs
            o = ops.gated_delta_recurrent(*args, ring_k, ring_u, ring_g, _EMPTY)
        elif meta.max_q_len == 1:  # decode
            o = ops.gated_delta_recurrent(*args, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
        else:  # prefill
            o = ops.gated_delta_chunk(*args)
        o = ops.rms_norm(o, layer.norm, cfg.rms_norm_eps) * F.silu(z)
        return layer.out(o.view(n, cfg.value_dim))


class _Loader:
    """Reads one hybrid checkpoint into the fused layouts described in the module docstring."""

    def __init__(self, cfg: HybridConfig, store: WeightStore, device, dtype):
        self.cfg, self.store, self.device, self.dtype = cfg, store, device, dtype

    def get(self, name: str, shape, dtype=None) -> torch.Tensor:
        t = self.store.get(self.cfg.weight_prefix + name, shape)
        return t.to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def norm(self, name: str, size: int) -> torch.Tensor:
        """A zero-centred RMSNorm weight, stored as the 1 + w it multiplies by."""
        return (1.0 + self.get(name, (size,), torch.float32)).to(self.dtype)

    def mlp(self, p: str) -> dict:
        h, inter = self.cfg.hidden_size, self.cfg.intermediate_size
        return dict(in_norm=self.norm(p + "input_layernorm.weight", h),
                    post_norm=self.norm(p + "post_attention_layernorm.weight", h),
                    gate_up=Dense(torch.cat([self.get(p + "mlp.gate_proj.weight", (inter, h)),
                                             self.get(p + "mlp.up_proj.weight", (inter, h))])),
                    down=Dense(self.get(p + "mlp.down_proj.weight", (h, inter))))

    def attention_layer(self, i: int, kv_index: int) -> TargetLayer:
        cfg, p = self.cfg, f"layers.{i}."
        h, d, heads, kv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        order = partial_rope_order(d, cfg.rotary_dim or d).to(self.device)
        qg = self.get(p + "self_attn.q_proj.weight", (heads * 2 * d, h)).view(heads, 2, d, h)
        query, gate = qg[:, 0][:, order].reshape(heads * d, h), qg[:, 1].reshape(heads * d, h)
        key = self.get(p + "self_attn.k_proj.weight", (kv * d, h)).view(kv, d, h)[:, order]
        value = self.get(p + "self_attn.v_proj.weight", (kv * d, h))
        bias = None
        if cfg.qkv_bias:
            qb = self.get(p + "self_attn.q_proj.bias", (heads * 2 * d,)).view(heads, 2, d)
            kb = self.get(p + "self_attn.k_proj.bias", (kv * d,)).view(kv, d)[:, order]
            bias = torch.cat([qb[:, 0][:, order].reshape(-1), kb.reshape(-1),
                              self.get(p + "self_attn.v_proj.bias", (kv * d,)),
                              qb[:, 1].reshape(-1)])
        return TargetLayer(
            qkv=Dense(torch.cat([query, key.reshape(kv * d, h), value, gate]), bias),
            q_norm=self.norm(p + "self_attn.q_norm.weight", d)[order].contiguous(),
            k_norm=self.norm(p + "self_attn.k_norm.weight", d)[order].contiguous(),
            o=Dense(self.get(p + "self_attn.o_proj.weight", (h, heads * d))),
            window=0, kv_index=kv_index, output_gate=True, **self.mlp(p))

    def linear_layer(self, i: int, state_index: int) -> LinearLayer:
        cfg, p = self.cfg, f"layers.{i}.linear_attn."
        h, hv, cd, vd = cfg.hidden_size, cfg.linear_num_value_heads, cfg.conv_dim, cfg.value_dim
        if cfg.flavour == "qwen3_next":
            qkv, z, b, a = self._qwen3_next_projections(p)
        else:
            qkv = self.get(p + "in_proj_qkv.weight", (cd, h))
            z = self.get(p + "in_proj_z.weight", (vd, h))
            b = self.get(p + "in_proj_b.weight", (hv, h))
            a = self.get(p + "in_proj_a.weight", (hv, h))
        if self.store.has(cfg.weight_prefix + p + "conv1d.bias"):
            raise ModelConfigError(f"{p}conv1d has a bias; the hybrid targets' convolution has none")
        return LinearLayer(
            proj=Dense(torch.cat([qkv, z, b, a])),
            conv_weight=self.get(p + "conv1d.weight", (cd, 1, cfg.conv_kernel))[:, 0].contiguous(),
            a_log=self.get(p + "A_log", (hv,), torch.float32),
            dt_bias=self.get(p + "dt_bias", (hv,), torch.float32),
            norm=self.get(p + "norm.weight", (cfg.linear_value_head_dim,)),
            out=Dense(self.get(p + "out_proj.weight", (h, vd))),
            state_index=state_index, **self.mlp(f"layers.{i}."))

    def _qwen3_next_projections(self, p: str):
        """Qwen3-Next stores [q_g | k_g | v_g | z_g] and [b_g | a_g] per key-head group g."""
        cfg, h = self.cfg, self.cfg.hidden_size
        hk, r = cfg.linear_num_key_heads, cfg.linear_num_value_heads // cfg.linear_num_key_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        qkvz = self.get(p + "in_proj_qkvz.weight", (2 * cfg.key_dim + 2 * cfg.value_dim, h))
        q, k, v, z = qkvz.view(hk, -1, h).split([dk, dk, r * dv, r * dv], dim=1)
        ba = self.get(p + "in_proj_ba.weight", (2 * cfg.linear_num_value_heads, h))
        b, a = ba.view(hk, 2 * r, h).split([r, r], dim=1)
        flat = [t.reshape(-1, h) for t in (q, k, v, z, b, a)]
        return torch.cat(flat[:3]), flat[3], flat[4], flat[5]

    def embeddings(self):
        cfg, h = self.cfg, self.cfg.hidden_size
        embed = self.get("embed_tokens.weight", (cfg.vocab_size, h))
        if cfg.tie_word_embeddings or not self.store.has("lm_head.weight"):
            if not cfg.tie_word_embeddings:
                raise ModelConfigError("checkpoint lacks lm_head.weight and embeddings are untied")
            lm_head = embed
        else:
            lm_head = self.store.get("lm_head.weight", (cfg.vocab_size, h)).to(
                device=self.device, dtype=self.dtype).contiguous()
        return embed, self.norm("norm.weight", h), lm_head
