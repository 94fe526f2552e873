"""Configuration of a DSpine draft model (and of DFlash checkpoints, which load as DSpine drafts
with injection and transition off)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .config import ModelConfigError, TargetConfig, config_fields, read_json

DRAFT_ARCHITECTURES = ("DSpineDraftModel", "DFlashDraftModel")


@dataclass
class DraftConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_layer_ids: list[int]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    block_size: int = 16
    sliding_window: int | None = 8192
    mask_token_id: int | None = None  # None: a learned mask embedding
    injection: bool = True
    transition: bool = True
    transition_rank: int = 256
    transition_top_k: int = 8
    architecture: str = "DSpineDraftModel"
    extra: dict = field(default_factory=dict)

    # ----------------------------------------------------------------- reading
    @classmethod
    def from_dict(cls, cfg: dict) -> "DraftConfig":
        arch = (cfg.get("architectures") or [None])[0]
        if arch not in DRAFT_ARCHITECTURES:
            raise ModelConfigError(
                f"not a draft model: architecture {arch!r}, expected one of {DRAFT_ARCHITECTURES}")
        sub = cfg.get("dflash_config") or {}
        pick = lambda k, default=None: sub.get(k, cfg.get(k, default))  # noqa: E731
        with config_fields("draft config"):
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            inj = cfg.get("injection") or {}
            tr = cfg.get("transition") or {}
            dspine = arch == "DSpineDraftModel"
            c = cls(
                hidden_size=hidden,
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate_size=int(cfg["intermediate_size"]),
                vocab_size=int(cfg["vocab_size"]),
                target_layer_ids=[int(i) for i in pick("target_layer_ids")],
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float((cfg.get("rope_parameters") or {}).get(
                    "rope_theta", cfg.get("rope_theta", 10000.0))),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
                block_size=int(pick("block_size", 16)),
                sliding_window=_window(cfg),
                mask_token_id=pick("mask_token_id"),
                injection=dspine and bool(inj.get("enabled", True)),
                transition=dspine and bool(tr.get("enabled", True)),
                transition_rank=int(tr.get("rank", 256)),
                transition_top_k=int(tr.get("top_k", 8)),
                architecture=arch,
            )
        c.validate()
        return c

    @classmethod
    def from_dir(cls, path: Path) -> "DraftConfig":
        return cls.from_dict(read_json(Path(path) / "config.json", "draft config"))

    def validate(self) -> None:
        if self.block_size < 2:
            raise ModelConfigError("block_size must be >= 2")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if not self.target_layer_ids or sorted(self.target_layer_ids) != self.target_layer_ids:
            raise ModelConfigError("target_layer_ids must be a non-empty ascending list")
        if self.transition and not 1 <= self.transition_top_k <= self.vocab_size:
            raise ModelConfigError("transition.top_k must be in [1, vocab_size]")

    def check_target(self, target: TargetConfig) -> None:
        """A draft shares the target's embeddings and reads its layers: refuse a mismatch."""
        problems = []
        if self.vocab_size != target.vocab_size:
            problems.append(f"vocab size {self.vocab_size} != target's {target.vocab_size}")
        if self.hidden_size != target.hidden_size:
            problems.append(f"hidden size {self.hidden_size} != target's {target.hidden_size}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            problems.append(f"target_layer_ids {bad} outside the target's "
                            f"{target.num_layers} layers")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < target.vocab_size:
            problems.append(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        if problems:
            raise ModelConfigError("draft does not fit this target: " + "; ".join(problems))

    # ----------------------------------------------------------------- writing
    def to_dict(self) -> dict:
        d = asdict(self)
        out = {
            "architectures": ["DSpineDraftModel"],
            "model_type": "dspine",
            "hidden_size": d["hidden_size"],
            "num_hidden_layers": d["num_layers"],
            "num_attention_heads": d["num_heads"],
            "num_key_value_heads": d["num_kv_heads"],
            "head_dim": d["head_dim"],
            "intermediate_size": d["intermediate_size"],
            "vocab_size": d["vocab_size"],
            "rms_norm_eps": d["rms_norm_eps"],
            "rope_theta": d["rope_theta"],
            "max_position_embeddings": d["max_position_embeddings"],
            "block_size": d["block_size"],
            "target_layer_ids": d["target_layer_ids"],
            "sliding_window": d["sliding_window"],
            "mask_token_id": d["mask_token_id"],
            "injection": {"enabled": d["injection"]},
            "transition": {"enabled": d["transition"], "rank": d["transition_rank"],
                           "top_k": d["transition_top_k"]},
        }
        out.update(self.extra)
        return out


def _window(cfg: dict) -> int | None:
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types and not any(t == "sliding_attention" for t in types):
        return None
    return int(window) if window else None


def evenly_spaced_layers(num_target_layers: int, num_taps: int) -> list[int]:
    """DFlash's choice of tapped layers: from layer 1 to layer L-3, evenly spaced."""
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_taps - 1)) for i in range(num_taps)]
