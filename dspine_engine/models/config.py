"""Target model configuration, read from an HF `config.json` (Llama / Qwen2 / Qwen3 family)."""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# HF architecture name -> our flavour. One implementation covers all three: Qwen2 adds a bias on
# q/k/v, Qwen3 adds per-head RMSNorm on q and k.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class ModelConfigError(ValueError):
    """A model directory whose config cannot be used (malformed, unsupported, inconsistent)."""


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{what}: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{what}: {path} must hold a JSON object")
    return data


@contextmanager
def config_fields(what: str):
    """Turns a missing or mistyped field met while reading `what` into a ModelConfigError."""
    try:
        yield
    except ModelConfigError:
        raise
    except KeyError as e:
        raise ModelConfigError(f"{what} lacks the required field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ModelConfigError(f"{what} has a field of the wrong type: {e}") from None


@dataclass
class TargetConfig:
    flavour: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    layer_windows: list[int] = field(default_factory=list)  # 0 = full attention
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    rotary_dim: int | None = None  # partial RoPE: dims of a head that rotate (None = all)

    @property
    def num_kv_layers(self) -> int:
        """Layers that keep paged K/V (every layer of a pure-attention model)."""
        return self.num_layers

    @classmethod
    def from_dict(cls, cfg: dict) -> "TargetConfig":
        """The config of any supported target; hybrid (Gated DeltaNet) architectures give a
        HybridConfig."""
        from .hybrid_config import HYBRID_ARCHITECTURES, HybridConfig, refuse_unsupported_hybrid

        arch = (cfg.get("architectures") or [None])[0]
        if arch in HYBRID_ARCHITECTURES:
            return HybridConfig.from_hf(cfg)
        refuse_unsupported_hybrid(arch)
        if arch not in SUPPORTED_ARCHITECTURES:
            supported = sorted(SUPPORTED_ARCHITECTURES) + sorted(HYBRID_ARCHITECTURES)
            raise ModelConfigError(f"unsupported architecture {arch!r}; supported: {supported}")
        return cls.from_llama_family(cfg, SUPPORTED_ARCHITECTURES[arch])

    @classmethod
    def from_llama_family(cls, cfg: dict, flavour: str) -> "TargetConfig":
        with config_fields("config.json"):
            c = cls(**decoder_fields(cfg, flavour))
        c.validate()
        return c

    @classmethod
    def from_dir(cls, model_dir: Path) -> "TargetConfig":
        return cls.from_dict(read_json(Path(model_dir) / "config.json", "model config"))

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ModelConfigError("head_dim must be even (RoPE)")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"{name} must be positive")


def decoder_fields(cfg: dict, flavour: str) -> dict:
    """The TargetConfig fields every decoder config spells the same way (call inside
    `config_fields`, which turns a missing or mistyped field into a ModelConfigError)."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    layers = int(cfg["num_hidden_layers"])
    return dict(
        flavour=flavour,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(_rope_theta(cfg)),
        rope_scaling=_rope_scaling(cfg),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=flavour == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=flavour == "qwen3",
        layer_windows=_layer_windows(cfg, layers),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_as_list(cfg.get("eos_token_id")),
    )


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in (x if isinstance(x, (list, tuple)) else [x])]


def _rope_theta(cfg: dict) -> float:
    params = cfg.get("rope_parameters") or {}
    return params.get("rope_theta", cfg.get("rope_theta", 10000.0))


def _rope_scaling(cfg: dict) -> dict | None:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return None if kind == "default" else dict(scaling)


def _layer_windows(cfg: dict, layers: int) -> list[int]:
    """Sliding window per layer (0 = full), following HF's layer_types / use_sliding_window."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types:
        return [int(window or 0) if t == "sliding_attention" else 0 for t in types]
    if not window or cfg.get("use_sliding_window") is False:
        return [0] * layers
    start = int(cfg.get("max_window_layers", 0) or 0) if "use_sliding_window" in cfg else 0
    return [int(window) if i >= start else 0 for i in range(layers)]
