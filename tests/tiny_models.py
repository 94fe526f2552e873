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
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copy(src, Path(out) / name)
    return Path(out)
