"""Hybrid target configs: what is read, and every missing or inconsistent linear-attention field
refused with a clear error."""
import json

import pytest
import torch

from dspine_engine.models.config import ModelConfigError, TargetConfig
from dspine_engine.models.hybrid_config import HybridConfig
from dspine_engine.models.target import TargetModel

BASE = {
    "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}


def _cfg(**changes):
    cfg = {**BASE, **changes}
    return {k: v for k, v in cfg.items() if v is not None}


def test_reads_a_qwen3_5_config():
    c = TargetConfig.from_dict(_cfg())
    assert isinstance(c, HybridConfig) and c.flavour == "qwen3_5"
    assert c.layer_types == ["linear_attention"] * 3 + ["full_attention"]  # HF's default rule
    assert (c.num_kv_layers, c.num_linear_layers, c.rotary_dim, c.conv_dim) == (1, 3, 8, 128)
    assert c.qk_norm and c.weight_prefix == "model."


def test_reads_the_text_model_of_a_vision_language_checkpoint():
    text = {k: v for k, v in _cfg(full_attention_interval=2).items() if k != "architectures"}
    c = TargetConfig.from_dict({"architectures": ["Qwen3_5ForConditionalGeneration"],
                                "tie_word_embeddings": False, "text_config": text})
    assert c.weight_prefix == "model.language_model."
    assert c.layer_types == ["linear_attention", "full_attention"] * 2


REFUSED = {
    "missing linear field": (_cfg(linear_num_value_heads=None), "linear_num_value_heads"),
    "layer_types length": (_cfg(layer_types=["full_attention"] * 3), "3 entries for 4 layers"),
    "unknown layer type": (_cfg(layer_types=["mamba"] * 4), "unknown layer types"),
    "v heads vs k heads": (_cfg(linear_num_value_heads=3), "multiple of linear_num_key_heads"),
    "zero head dim": (_cfg(linear_key_head_dim=0), "linear_key_head_dim must be positive"),
    "conv kernel": (_cfg(linear_conv_kernel_dim=1), "linear_conv_kernel_dim"),
    "activation": (_cfg(hidden_act="gelu"), "hidden_act"),
    "output gate": (_cfg(attn_output_gate=False), "attn_output_gate"),
    "odd rotary dim": (_cfg(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.3}),
                       "even number of dims"),
    "qwen3-next moe": (_cfg(architectures=["Qwen3NextForCausalLM"], num_experts=8),
                       "mixture-of-experts"),
    "qwen3.5 moe": (_cfg(architectures=["Qwen3_5MoeForCausalLM"]), "mixture-of-experts"),
    "vl without text_config": ({"architectures": ["Qwen3_5ForConditionalGeneration"]},
                               "text_config"),
    "mistyped field": (_cfg(linear_num_key_heads="two"), "wrong type"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_configs_are_refused(case):
    cfg, message = REFUSED[case]
    with pytest.raises(ModelConfigError, match=message):
        TargetConfig.from_dict(cfg)


def test_dense_qwen3_next_with_mlp_only_layers_is_accepted():
    c = TargetConfig.from_dict(_cfg(architectures=["Qwen3NextForCausalLM"], num_experts=8,
                                    mlp_only_layers=[0, 1, 2, 3]))
    assert c.flavour == "qwen3_next"


def test_checkpoint_whose_shapes_contradict_the_config_is_refused(tmp_path, smollm2_dir):
    from tiny_models import write_tiny_hybrid

    path = write_tiny_hybrid(tmp_path / "m", "qwen3_5", smollm2_dir, num_hidden_layers=2,
                             layer_types=["linear_attention", "full_attention"])
    cfg = json.loads((path / "config.json").read_text())
    cfg["linear_value_head_dim"] = 8
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="in_proj_qkv.weight"):
        TargetModel.load(path, progress=False)


def test_partial_rope_table_rotates_only_the_leading_pairs():
    from dspine_engine import ops

    cs = ops.rope_cos_sin(32, 100, 1e4, rotary_dim=8)
    full8 = ops.rope_cos_sin(8, 100, 1e4)
    assert torch.equal(cs[:, :4], full8[:, :4]) and torch.equal(cs[:, 16:20], full8[:, 4:])
    assert (cs[:, 4:16] == 1).all() and (cs[:, 20:] == 0).all()



def test_engine_refuses_an_inconsistent_hybrid_config_clearly(tmp_path, smollm2_dir):
    """Through the engine: a checkpoint missing a linear-attention field is refused with the
    field's name before any weight loads."""
    from dspine_engine import Engine
    from tiny_models import write_tiny_hybrid

    path = write_tiny_hybrid(tmp_path / "m", "qwen3_5", smollm2_dir, num_hidden_layers=2,
                             layer_types=["linear_attention", "full_attention"])
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("linear_key_head_dim")
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="linear_key_head_dim"):
        Engine(path, progress=False)
