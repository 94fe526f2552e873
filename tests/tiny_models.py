"""Tiny randomly initialised models written with transformers' save_pretrained, carrying the
real SmolLM2 tokenizer so prompts, chat templates and detokenization are real."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def write_tiny_model(out: Path, flavour: str, tokenizer_dir: Path, seed: int = 0,
                     **overrides) -> Path:
    import transformers as tf

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    common.update(overrides)
    cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
           "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
           "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[flavour]
    if flavour == "qwen3":
        common.setdefault("head_dim", 32)
    torch.manual_seed(seed)
    model = cls[1](cls[0](**common)).float().eval()
    # Random init leaves norms at 1 and biases at 0: perturb them so those code paths count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    copy_tokenizer(tokenizer_dir, out)
    return Path(out)


def write_tiny_hybrid(out: Path, flavour: str, tokenizer_dir: Path, seed: int = 0,
                      **overrides) -> Path:
    """A tiny hybrid target: Qwen3.5 text model ("qwen3_5"), the text model inside a Qwen3.5
    vision-language checkpoint ("qwen3_5_vl", a one-block vision tower we never load) or dense
    Qwen3-Next ("qwen3_next"): Gated DeltaNet layers and gated attention with partial RoPE."""
    import transformers as tf

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4,
                  max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1,
                  eos_token_id=2, tie_word_embeddings=False)
    common.update(overrides)
    if flavour == "qwen3_5":
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        model_cls, cfg = Qwen3_5ForCausalLM, Qwen3_5TextConfig(**common)
    elif flavour == "qwen3_5_vl":
        from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5ForConditionalGeneration
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                      out_hidden_size=common["hidden_size"], num_position_embeddings=16)
        model_cls = Qwen3_5ForConditionalGeneration
        cfg = Qwen3_5Config(text_config=common, vision_config=vision,
                            tie_word_embeddings=common["tie_word_embeddings"])
    else:
        model_cls, cfg = tf.Qwen3NextForCausalLM, tf.Qwen3NextConfig(num_experts=0, **common)
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    # Zero-centred norms start at 0 and dt_bias at 1: perturb them so those code paths count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("dt_bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    copy_tokenizer(tokenizer_dir, out)
    return Path(out)


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copy(src, Path(out) / name)
