"""The target model: one implementation of the Llama / Qwen2 / Qwen3 decoder family.

Weights are held as plain tensors in fused layouts (q|k|v and gate|up) so a layer is a handful of
GEMMs plus our kernels; there is no nn.Module overhead on the decode path. The same forward serves
prefill (whole prompts), decode (one token per sequence) and verify (a block per sequence): the
shape is in the AttnMeta, not in the code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import ops
from .attention_meta import AttnMeta
from .config import ModelConfigError, TargetConfig
from .dense import Dense
from .quant_dense import QuantWeight, embedding_rows
from .weights import WeightStore, checkpoint_files


@dataclass
class TargetLayer:
    in_norm: torch.Tensor
    qkv: Dense | QuantWeight  # q | k | v projections fused (with the Qwen2 bias)
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Dense | QuantWeight
    post_norm: torch.Tensor
    gate_up: Dense | QuantWeight  # gate | up fused
    down: Dense | QuantWeight
    window: int
    kv_index: int  # which K/V cache of the model this layer writes and reads
    output_gate: bool = False  # q | k | v | gate: attention output * sigmoid(gate) (Qwen3-Next)


class TargetModel:
    def __init__(self, config: TargetConfig, embed, layers: list[TargetLayer],
                 norm: torch.Tensor, lm_head):
        """``embed`` and ``lm_head`` are tensors, or `QuantWeight` tables for a quantised target
        (models/gguf_target.py)."""
        self.config = config
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head  # E_out [V, H] (the embedding itself when tied)
        self.lm_head_dense = lm_head if isinstance(lm_head, QuantWeight) else Dense(lm_head, vocabulary=True)
        self.quantized = isinstance(lm_head, QuantWeight)
        self.device = embed.device
        self.dtype = embed.dtype
        self.cos_sin = self._rope_table(config.max_position_embeddings)
        self.scale = 1.0 / math.sqrt(config.head_dim)
        # Row-exact attention (ops.paged_attention, exact): the engine sets it from its
        # `attention` setting; a model used on its own (training capture, tests) runs "fast".
        self.exact_attention = False
        # The layers as ops.target_layers takes them (one op a forward), or None: the loop
        # below runs op by op (a GPU, fp32/bf16 weights, or a layer the op does not cover).
        self.layer_tables = self._layer_tables()

    # ---------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, model_dir: Path, device="cpu", dtype=torch.float32,
             progress: bool = True) -> "TargetModel":
        model_dir = Path(model_dir)
        cfg = TargetConfig.from_dir(model_dir)
        store = WeightStore(checkpoint_files(model_dir), desc="loading target", progress=progress)
        store.load_all()
        return target_class(cfg).from_store(cfg, store, device, dtype)

    @classmethod
    def from_store(cls, cfg: TargetConfig, store: WeightStore, device, dtype) -> "TargetModel":
        h, d = cfg.hidden_size, cfg.head_dim
        q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d

        def get(name, shape):
            return store.get(name, shape).to(device=device, dtype=dtype).contiguous()

        layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([get(p + "self_attn.q_proj.weight", (q_out, h)),
                             get(p + "self_attn.k_proj.weight", (kv_out, h)),
                             get(p + "self_attn.v_proj.weight", (kv_out, h))])
            bias = None
            if cfg.qkv_bias:
                bias = torch.cat([get(p + f"self_attn.{n}_proj.bias", (o,))
                                  for n, o in (("q", q_out), ("k", kv_out), ("v", kv_out))])
            layers.append(TargetLayer(
                in_norm=get(p + "input_layernorm.weight", (h,)),
                qkv=Dense(qkv, bias),
                q_norm=get(p + "self_attn.q_norm.weight", (d,)) if cfg.qk_norm else None,
                k_norm=get(p + "self_attn.k_norm.weight", (d,)) if cfg.qk_norm else None,
                o=Dense(get(p + "self_attn.o_proj.weight", (h, q_out))),
                post_norm=get(p + "post_attention_layernorm.weight", (h,)),
                gate_up=Dense(torch.cat([
                    get(p + "mlp.gate_proj.weight", (cfg.intermediate_size, h)),
                    get(p + "mlp.up_proj.weight", (cfg.intermediate_size, h))])),
                down=Dense(get(p + "mlp.down_proj.weight", (h, cfg.intermediate_size))),
                window=cfg.layer_windows[i] if cfg.layer_windows else 0,
                kv_index=i,
            ))
        embed = get("model.embed_tokens.weight", (cfg.vocab_size, h))
        if cfg.tie_word_embeddings or not store.has("lm_head.weight"):
            if not cfg.tie_word_embeddings:
                raise ModelConfigError("checkpoint lacks lm_head.weight and embeddings are untied")
            lm_head = embed
        else:
            lm_head = get("lm_head.weight", (cfg.vocab_size, h))
        return cls(cfg, embed, layers, get("model.norm.weight", (h,)), lm_head)

    def _rope_table(self, positions: int) -> torch.Tensor:
        c = self.config
        return ops.rope_cos_sin(c.head_dim, positions, c.rope_theta, c.rope_scaling,
                                device=self.device, rotary_dim=c.rotary_dim)

    def cover_positions(self, positions: int) -> None:
        """Extends the RoPE table to ``positions`` rows. The engine's last verify block of a full
        context reaches block-1 positions past the context; their logits are never committed,
        but the kernels must not read past the table (they refuse to)."""
        if positions > self.cos_sin.shape[0]:
            self.cos_sin = self._rope_table(positions)

    def _layer_tables(self) -> dict | None:
        layers = self.layers
        if not (self.quantized and self.device.type == "cpu" and type(self) is TargetModel
                and layers):  # a hybrid target's layers are not all attention layers
            return None
        tables = [p for lay in layers for p in (lay.qkv, lay.o, lay.gate_up, lay.down)]
        covered = all(lay.q_norm is None and not lay.output_gate and lay.kv_index == i
                      for i, lay in enumerate(layers))
        if not (covered and all(isinstance(t, QuantWeight) for t in tables)):
            return None
        return {"weights": [t.data for t in tables],
                "formats": [t.format for t in tables],
                "norms": [w for lay in layers for w in (lay.in_norm, lay.post_norm)],
                "windows": [lay.window for lay in layers]}

    def _layers_in_one_op(self, hidden, meta: AttnMeta, k_caches, v_caches,
                          tap_layers: tuple[int, ...]):
        """The decoder loop below as one op (ops.target_layers): (hidden, residual, taps)."""
        cfg, t = self.config, self.layer_tables
        order = sorted(set(tap_layers))
        hidden, residual, tapped = ops.target_layers(
            hidden, t["weights"], t["formats"], t["norms"], t["windows"], cfg.num_heads,
            cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps,
            meta.positions, meta.slots, self.cos_sin, list(k_caches), list(v_caches),
            meta.block_tables, meta.kv_lens, meta.cu_q, meta.max_q_len, meta.causal, self.scale,
            meta.max_kv_len, order)
        return hidden, residual, dict(zip(order, tapped))

    def _layers_op_by_op(self, hidden, meta: AttnMeta, k_caches, v_caches,
                         tap_layers: tuple[int, ...]):
        """The decoder loop, an op a step: (hidden, residual, taps) after the last layer."""
        cfg = self.config
        residual = None
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if residual is None:
                x, residual = ops.rms_norm(hidden, layer.in_norm, cfg.rms_norm_eps), hidden
            else:
                x, residual = ops.add_rms_norm(hidden, residual, layer.in_norm, cfg.rms_norm_eps)
            hidden = self._mix(layer, x, meta, k_caches, v_caches)
            x, residual = ops.add_rms_norm(hidden, residual, layer.post_norm, cfg.rms_norm_eps)
            hidden = layer.down(ops.silu_mul(layer.gate_up(x)))
            if i in tap_layers:
                taps[i] = hidden + residual  # the layer's output, before the next norm
        return hidden, residual, taps

    # ---------------------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, meta: AttnMeta, k_caches, v_caches,
                logit_rows: torch.Tensor | None = None, tap_layers: tuple[int, ...] = ()):
        """Runs the decoder over ``tokens [N]`` and returns ``(logits, taps)``.

        ``logits`` covers ``logit_rows`` (all rows when None); ``taps [N, len(tap_layers)*H]``
        concatenates the outputs of the requested layers (the draft's context), or is None."""
        cfg = self.config
        if any(not 0 <= t < cfg.num_layers for t in tap_layers):
            raise ValueError(f"tap layers {tap_layers} outside 0..{cfg.num_layers - 1}")
        hidden = embedding_rows(self.embed, tokens)
        layers = self._layers_op_by_op if self.layer_tables is None else self._layers_in_one_op
        hidden, residual, taps = layers(hidden, meta, k_caches, v_caches, tap_layers)
        if logit_rows is not None:
            hidden, residual = hidden[logit_rows], residual[logit_rows]
        x, _ = ops.add_rms_norm(hidden, residual, self.norm, cfg.rms_norm_eps)
        logits = self.lm_head_dense(x)
        tapped = torch.cat([taps[t] for t in tap_layers], dim=-1) if tap_layers else None
        return logits, tapped

    def _mix(self, layer, x, meta: AttnMeta, k_caches, v_caches) -> torch.Tensor:
        """The layer's token mixer (here always attention); x is the normed hidden state."""
        return self._attention(layer, x, meta, k_caches[layer.kv_index],
                               v_caches[layer.kv_index])

    def _attention(self, layer: TargetLayer, x, meta: AttnMeta, k_cache, v_cache):
        cfg = self.config
        n = x.shape[0]
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qkv = layer.qkv(x)
        q = qkv[:, :q_size].view(n, cfg.num_heads, cfg.head_dim)
        k = qkv[:, q_size:q_size + kv_size].view(n, cfg.num_kv_heads, cfg.head_dim)
        v = qkv[:, q_size + kv_size:q_size + 2 * kv_size].view(n, cfg.num_kv_heads, cfg.head_dim)
        # Qwen3's per-head q/k norms ride on the rotation and KV write (one launch on CUDA).
        q = ops.rope_write_kv(q, k, v, meta.positions, self.cos_sin, k_cache, v_cache, meta.slots,
                              layer.q_norm, layer.k_norm, cfg.rms_norm_eps)
        attn = ops.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.kv_lens,
                                   meta.cu_q, meta.max_q_len, meta.causal, layer.window,
                                   self.scale, meta.max_kv_len, self.exact_attention,
                                   meta.prefill).view(n, q_size)
        if layer.output_gate:
            attn = attn * torch.sigmoid(qkv[:, q_size + 2 * kv_size:])
        return layer.o(attn)


def target_class(cfg: TargetConfig) -> type[TargetModel]:
    """The model class that implements a config: hybrid configs get HybridTargetModel."""
    from .hybrid import HybridTargetModel
    from .hybrid_config import HybridConfig

    return HybridTargetModel if isinstance(cfg, HybridConfig) else TargetModel
