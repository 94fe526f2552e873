"""Configuration of hybrid targets (Qwen3-Next / Qwen3.5 family): Gated DeltaNet linear-attention
layers interleaved with full-attention layers that carry an output gate and partial RoPE.

Read from the HF `config.json` of `Qwen3NextForCausalLM`, `Qwen3_5ForCausalLM`, or the text model
of `Qwen3_5ForConditionalGeneration` (its `text_config`; the vision tower is not loaded). Only the
dense-MLP variants are supported: mixture-of-experts layers are refused with a clear error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import ModelConfigError, TargetConfig, config_fields, decoder_fields

# HF architecture -> (flavour, prefix of the text model's tensors). The flavours differ only in
# how the linear-attention projections are stored (fused and interleaved per key-head group in
# Qwen3-Next, separate in Qwen3.5); the loader brings both to one layout.
HYBRID_ARCHITECTURES = {
    "Qwen3NextForCausalLM": ("qwen3_next", "model."),
    "Qwen3_5ForCausalLM": ("qwen3_5", "model."),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "model.language_model."),
}
_MOE_ARCHITECTURES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
LAYER_TYPES = ("linear_attention", "full_attention")
LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim")
MAX_CONV_KERNEL = 16  # the kernels keep the window in a fixed array (csrc/dspine_ops.h)
MAX_LINEAR_HEAD_DIM = 256


def refuse_unsupported_hybrid(arch) -> None:
    if arch in _MOE_ARCHITECTURES:
        raise ModelConfigError(f"{arch} is a mixture-of-experts model; only the dense-MLP hybrid "
                               f"targets are supported ({sorted(HYBRID_ARCHITECTURES)})")


@dataclass
class HybridConfig(TargetConfig):
    layer_types: list[str] = field(default_factory=list)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    conv_kernel: int = 0
    weight_prefix: str = "model."

    # ---------------------------------------------------------------- derived sizes
    @property
    def num_kv_layers(self) -> int:
        return self.layer_types.count("full_attention")

    @property
    def num_linear_layers(self) -> int:
        return self.layer_types.count("linear_attention")

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: q | k | v of the linear layers."""
        return 2 * self.key_dim + self.value_dim

    # ---------------------------------------------------------------- reading
    @classmethod
    def from_hf(cls, cfg: dict) -> "HybridConfig":
        arch = cfg["architectures"][0]
        flavour, prefix = HYBRID_ARCHITECTURES[arch]
        if arch.endswith("ForConditionalGeneration"):
            text = cfg.get("text_config")
            if not isinstance(text, dict):
                raise ModelConfigError(f"{arch} config.json lacks its text_config")
            # Top-level entries (tie_word_embeddings, token ids) apply unless the text model's own
            # config says otherwise.
            cfg = {**{k: v for k, v in cfg.items() if k != "text_config"}, **text}
        _refuse_moe(cfg)
        missing = [f for f in LINEAR_FIELDS if cfg.get(f) is None]
        if missing:
            raise ModelConfigError(f"hybrid config.json lacks the linear-attention fields "
                                   f"{missing}")
        with config_fields("config.json"):
            fields = {**decoder_fields(cfg, flavour), "qk_norm": True}
            c = cls(**fields,
                    layer_types=_layer_types(cfg),
                    rotary_dim=_rotary_dim(cfg),
                    linear_num_key_heads=int(cfg["linear_num_key_heads"]),
                    linear_num_value_heads=int(cfg["linear_num_value_heads"]),
                    linear_key_head_dim=int(cfg["linear_key_head_dim"]),
                    linear_value_head_dim=int(cfg["linear_value_head_dim"]),
                    conv_kernel=int(cfg["linear_conv_kernel_dim"]),
                    weight_prefix=prefix)
            if cfg.get("hidden_act", "silu") != "silu":
                raise ModelConfigError(f"hidden_act {cfg['hidden_act']!r} is not supported "
                                       f"(hybrid targets use silu)")
            if cfg.get("attn_output_gate", True) is False:
                raise ModelConfigError("attn_output_gate=false is not supported (the Qwen3-Next "
                                       "/ Qwen3.5 attention always gates its output)")
        c.validate()
        return c

    def validate(self) -> None:
        super().validate()
        if len(self.layer_types) != self.num_layers:
            raise ModelConfigError(f"layer_types has {len(self.layer_types)} entries for "
                                   f"{self.num_layers} layers")
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ModelConfigError(f"unknown layer types {unknown}; expected {list(LAYER_TYPES)}")
        for name in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"{name} must be positive")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ModelConfigError("linear_num_value_heads must be a multiple of "
                                   "linear_num_key_heads")
        if max(self.linear_key_head_dim, self.linear_value_head_dim) > MAX_LINEAR_HEAD_DIM:
            raise ModelConfigError(f"linear head dims above {MAX_LINEAR_HEAD_DIM} are not "
                                   f"supported")
        if not 2 <= self.conv_kernel <= MAX_CONV_KERNEL:
            raise ModelConfigError(f"linear_conv_kernel_dim must be in [2, {MAX_CONV_KERNEL}], "
                                   f"got {self.conv_kernel}")
        rot = self.rotary_dim
        if rot is not None and not (0 < rot <= self.head_dim and rot % 2 == 0):
            raise ModelConfigError(f"partial RoPE must rotate an even number of dims in "
                                   f"(0, head_dim={self.head_dim}], got {rot}")


def _refuse_moe(cfg: dict) -> None:
    """Qwen3-Next layers are MoE unless num_experts is 0 or the layer is in mlp_only_layers."""
    experts = int(cfg.get("num_experts") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or [])
    sparse = [i for i in range(layers) if experts > 0 and i not in dense and (i + 1) % step == 0]
    if sparse:
        raise ModelConfigError(f"layers {sparse[:8]}{'...' if len(sparse) > 8 else ''} are "
                               f"mixture-of-experts (num_experts={experts}); only dense-MLP "
                               f"hybrid targets are supported")


def _layer_types(cfg: dict) -> list[str]:
    """HF's rule: explicit layer_types, else every full_attention_interval-th layer is full."""
    if cfg.get("layer_types") is not None:
        return [str(t) for t in cfg["layer_types"]]
    interval = int(cfg.get("full_attention_interval", 4))
    if interval <= 0:
        raise ModelConfigError("full_attention_interval must be positive")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(int(cfg["num_hidden_layers"]))]


def _rotary_dim(cfg: dict) -> int:
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    params = cfg.get("rope_parameters") or {}
    factor = float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    if not 0 < factor <= 1:
        raise ModelConfigError(f"partial_rotary_factor must be in (0, 1], got {factor}")
    return int(head_dim * factor)
