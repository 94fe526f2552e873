"""Import llama-architecture GGUF files as HF-format model directories.

`convert_gguf` reads a GGUF with the `gguf` package, dequantises every tensor, and writes a
directory that any standard loader (ours, or `transformers`) reads: `config.json`,
`model.safetensors`, `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`, and a
`dspine_source.json` marker that lets a later call reuse the conversion when the source and the
converter have not changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Bump when the output of the converter changes, so cached conversions are redone.
CONVERTER_VERSION = 1
MARKER_NAME = "dspine_source.json"

# Above this many bytes the weights are split into several safetensors shards plus an index,
# so that a large model never has to be held in memory all at once.
MAX_SHARD_BYTES = 4 << 30

_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# llama.cpp token types (tokenizer.ggml.token_type) that matter here; 2 is unknown, 5 unused
# and 6 a byte-fallback piece such as <0x41>.
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 3, 4


# --------------------------------------------------------------------------------------------
# Public entry point


def convert_gguf(gguf_path, out_dir, dtype=torch.float32, progress: bool = True,
                 sha256: str | None = None) -> Path:
    """Convert a llama-architecture GGUF into an HF-format directory at `out_dir`; return it.

    A directory already converted from the same file (same sha256), by the same converter
    version and to the same dtype is reused as is. The directory is built in a temporary sibling
    and renamed into place, so an interrupted conversion never leaves a half-written model.
    `sha256` may pass the file's digest when the caller has already verified it, to skip hashing.
    """
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    dtype = _torch_dtype(dtype)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    source = {
        "gguf_sha256": sha256 or file_sha256(gguf_path),
        "converter_version": CONVERTER_VERSION,
        "dtype": _dtype_name(dtype),
    }
    if conversion_matches(out_dir, source):
        return out_dir
    _refuse_foreign_directory(out_dir)
    reader = open_gguf(gguf_path)  # parsing the metadata is slow: only when really converting

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_model_dir(reader, tmp_dir, dtype, progress)
        _make_readable(tmp_dir)
        marker = dict(source, source_path=str(gguf_path.resolve()))
        (tmp_dir / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        _move_into_place(tmp_dir, out_dir, source)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def conversion_matches(out_dir, source: dict) -> bool:
    """True when `out_dir` holds a finished conversion whose marker agrees with `source`."""
    marker_path = Path(out_dir) / MARKER_NAME
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError):
        return False
    return all(marker.get(key) == value for key, value in source.items())


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def open_gguf(path):
    """A `gguf.GGUFReader` for `path`, or an error that names the file and what is wrong."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        reader = _bounded_reader(path)
    except _PastTheEnd as exc:
        raise ValueError(f"{path} is truncated: {exc}; the file is incomplete (an interrupted "
                         "download or copy?), fetch it again") from None
    except Exception as exc:  # the reader raises many kinds on garbage input
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from exc
    if reader.byte_order != "I":
        raise ValueError(f"{path} is a byte-swapped (big-endian) GGUF, which is not supported")
    _check_tensor_extents(reader, path)
    return reader


class _PastTheEnd(ValueError):
    pass


def _bounded_reader(path):
    """gguf's reader, refusing any read past the end of the file: a truncated file then says so
    instead of failing later on a numpy reshape of a short slice."""
    import gguf
    import numpy as np

    class BoundedReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + int(np.empty([], dtype=dtype).itemsize) * int(count)
            if end > len(self.data):
                raise _PastTheEnd(f"it has {len(self.data)} bytes, but its layout needs "
                                  f"bytes up to {end}")
            return super()._get(offset, dtype, count, override_order)

    return BoundedReader(path)


def read_metadata(reader) -> dict[str, Any]:
    """All key/value fields of a GGUF as plain Python values (str, int, float, bool, lists)."""
    return {name: _field_value(field) for name, field in reader.fields.items()
            if not name.startswith("GGUF.")}


# --------------------------------------------------------------------------------------------
# Directory writing


def _write_model_dir(reader, out_dir: Path, dtype: torch.dtype, progress: bool) -> None:
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r}: only 'llama' can be imported")
    tensors = {t.name: t for t in reader.tensors}
    _check_tensors(tensors)

    config = llama_config(meta, tensors, dtype)
    tokenizer, token_strings = build_tokenizer(meta)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", generation_config(meta))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(meta, token_strings))
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_weights(tensors, config, out_dir, dtype, progress)


def _refuse_foreign_directory(out_dir: Path) -> None:
    # Replacing a stale conversion of ours is fine; wiping somebody's unrelated directory is not.
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER_NAME).exists():
        raise FileExistsError(
            f"{out_dir} exists and is not a dspine_engine GGUF conversion (no {MARKER_NAME}); "
            "choose another output directory or remove it")


def _make_readable(directory: Path) -> None:
    # mkdtemp makes a private directory; the finished model should get the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def _move_into_place(tmp_dir: Path, out_dir: Path, source: dict) -> None:
    if out_dir.exists():
        # A stale conversion of ours: move it aside first so the rename below stays atomic.
        stale = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.stale-", dir=out_dir.parent))
        try:
            os.replace(out_dir, stale / "old")
        except FileNotFoundError:
            pass  # someone else removed it meanwhile
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp_dir, out_dir)
    except OSError:
        # Another process finished the same conversion first; theirs is as good as ours.
        if not conversion_matches(out_dir, source):
            raise


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------
# Metadata


def _field_value(field):
    """Decode one GGUF key/value field (portable across `gguf` package versions)."""
    import gguf

    kind = field.types[0]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if kind != gguf.GGUFValueType.ARRAY:
        return field.parts[field.data[0]][0].item()
    item_kind = field.types[-1] if len(field.types) > 1 else None
    if item_kind == gguf.GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    if item_kind == gguf.GGUFValueType.ARRAY:
        return None  # nested arrays are not used by anything we import
    if not field.data:
        return []
    return np.concatenate([field.parts[i] for i in field.data]).tolist()


def _required(meta: dict, key: str):
    if key not in meta:
        raise ValueError(f"GGUF metadata lacks {key!r}, which a llama model needs")
    return meta[key]


def llama_config(meta: dict, tensors: dict, dtype: torch.dtype) -> dict:
    """The `config.json` of a `LlamaForCausalLM` described by GGUF metadata."""
    hidden = int(_required(meta, "llama.embedding_length"))
    heads = int(_required(meta, "llama.attention.head_count"))
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    head_dim = int(meta.get("llama.attention.key_length", hidden // heads))
    vocab_size = int(_torch_shape(tensors["token_embd.weight"])[0])
    special = _special_token_ids(meta)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_required(meta, "llama.feed_forward_length")),
        "num_hidden_layers": int(_required(meta, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.get("llama.context_length", 2048)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
        "bos_token_id": special.get("bos"),
        "eos_token_id": special.get("eos"),
        "pad_token_id": special.get("pad"),
        "torch_dtype": _dtype_name(dtype),
    }
    rope_scaling = _rope_scaling(meta)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    return config


def _rope_scaling(meta: dict) -> dict | None:
    kind = meta.get("llama.rope.scaling.type")
    factor = meta.get("llama.rope.scaling.factor")
    if kind in (None, "none") or not factor or factor == 1.0:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": float(factor)}
        original = meta.get("llama.rope.scaling.original_context_length")
        if original:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    raise ValueError(f"unsupported rope scaling type {kind!r} in GGUF metadata")


def _special_token_ids(meta: dict) -> dict[str, int]:
    names = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding",
             "eot": "eot", "eom": "eom"}
    ids = {}
    for short, gguf_name in names.items():
        value = meta.get(f"tokenizer.ggml.{gguf_name}_token_id")
        if value is not None:
            ids[short] = int(value)
    return ids


def generation_config(meta: dict) -> dict:
    ids = _special_token_ids(meta)
    # Chat models often end a turn with an end-of-turn token distinct from eos: stop on both.
    stops = [ids[k] for k in ("eos", "eot", "eom") if k in ids]
    stops = list(dict.fromkeys(stops))
    config = {"eos_token_id": stops[0] if len(stops) == 1 else stops}
    for key in ("bos", "pad"):
        if key in ids:
            config[f"{key}_token_id"] = ids[key]
    return config


def _adds_bos(meta: dict) -> bool:
    # Without the flag llama.cpp adds BOS for SentencePiece vocabularies and not for BPE ones.
    default = meta.get("tokenizer.ggml.model") == "llama"
    return bool(meta.get("tokenizer.ggml.add_bos_token", default))


def tokenizer_config(meta: dict, token_strings: list[str]) -> dict:
    ids = _special_token_ids(meta)

    def token(key):
        index = ids.get(key)
        return token_strings[index] if index is not None and index < len(token_strings) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("pad"),
        "unk_token": token("unk"),
        "add_bos_token": _adds_bos(meta),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": int(meta.get("llama.context_length", 2048)),
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


# --------------------------------------------------------------------------------------------
# Tensors


def _check_tensor_extents(reader, path: Path) -> None:
    # A truncated file can still parse its header; make sure every tensor's bytes are there.
    size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > size or tensor.data.nbytes != tensor.n_bytes:
            raise ValueError(f"{path} is truncated or corrupt: tensor {tensor.name!r} extends "
                             f"past the end of the file")


def _check_tensors(tensors: dict) -> None:
    unknown = [name for name in tensors if _hf_tensor_name(name) is None]
    if "rope_freqs.weight" in unknown:
        raise ValueError("GGUF has a rope_freqs tensor (per-dimension RoPE scaling, as in "
                         "Llama 3.1+); importing that scaling is not supported")
    if unknown:
        raise ValueError(f"GGUF has tensors a llama model does not use: {unknown[:8]}")
    for name in ("token_embd.weight", "output_norm.weight"):
        if name not in tensors:
            raise ValueError(f"GGUF lacks the {name!r} tensor")
    import gguf

    for tensor in tensors.values():
        if tensor.tensor_type not in (gguf.GGMLQuantizationType.F32,
                                      gguf.GGMLQuantizationType.F16) \
                and tensor.tensor_type not in getattr(gguf.quants, "_type_traits", {}):
            raise ValueError(f"unsupported GGUF tensor type {tensor.tensor_type.name} "
                             f"(tensor {tensor.name!r}): cannot dequantise it")


def _hf_tensor_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() \
            and parts[2] in _LAYER_TENSORS and parts[3] in ("weight", "bias"):
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{parts[3]}"
    return None


def _torch_shape(tensor) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-varying first, the reverse of torch.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def dequantize(tensor) -> np.ndarray:
    """A GGUF tensor as a float32 numpy array in torch dimension order."""
    from gguf.quants import dequantize as gguf_dequantize

    values = np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    if not values.flags.writeable:  # F32 tensors come back as a view of the read-only map
        values = values.copy()
    return values.reshape(_torch_shape(tensor))


def unpermute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of Q/K projection rows.

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3), ... of each head, so its converter
    interleaves the rows of every head: row 2i takes HF row i and row 2i+1 takes HF row
    i + head_dim/2. HF rotates the two halves of a head instead, so put the rows back.
    """
    head_dim = weight.shape[0] // n_heads
    rest = weight.shape[1:]
    return weight.reshape(n_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(weight.shape)


def permute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The permutation llama.cpp applies (inverse of `unpermute_rotary_rows`); for tests."""
    head_dim = weight.shape[0] // n_heads
    rest = weight.shape[1:]
    return weight.reshape(n_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(weight.shape)


def _hf_tensor(tensor, config: dict, dtype: torch.dtype) -> torch.Tensor:
    weight = torch.from_numpy(dequantize(tensor))
    if ".attn_q." in tensor.name:
        weight = unpermute_rotary_rows(weight, config["num_attention_heads"])
    elif ".attn_k." in tensor.name:
        weight = unpermute_rotary_rows(weight, config["num_key_value_heads"])
    return weight.to(dtype).contiguous()


def _write_weights(tensors: dict, config: dict, out_dir: Path, dtype: torch.dtype,
                   progress: bool) -> None:
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    shards = _plan_shards(list(tensors.values()), torch.tensor([], dtype=dtype).element_size())
    names = _shard_file_names(len(shards))
    weight_map = {}
    bar = tqdm(total=len(tensors), desc="Dequantising GGUF", unit="tensor", disable=not progress)
    with bar:
        for shard, file_name in zip(shards, names):
            state = {}
            for tensor in shard:
                hf_name = _hf_tensor_name(tensor.name)
                state[hf_name] = _hf_tensor(tensor, config, dtype)
                weight_map[hf_name] = file_name
                bar.update(1)
            save_file(state, str(out_dir / file_name), metadata={"format": "pt"})
            del state
    if len(names) > 1:
        total = sum(int(np.prod(_torch_shape(t))) for t in tensors.values())
        index = {"metadata": {"total_size": total * torch.tensor([], dtype=dtype).element_size()},
                 "weight_map": weight_map}
        _write_json(out_dir / "model.safetensors.index.json", index)


def _plan_shards(tensors: list, element_size: int) -> list[list]:
    shards, current, current_bytes = [], [], 0
    for tensor in tensors:
        size = int(np.prod(_torch_shape(tensor))) * element_size
        if current and current_bytes + size > MAX_SHARD_BYTES:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(tensor)
        current_bytes += size
    shards.append(current)
    return shards


def _shard_file_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def _torch_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        chosen = dtype
    else:
        chosen = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
                  "fp16": torch.float16, "bfloat16": torch.bfloat16,
                  "bf16": torch.bfloat16}.get(str(dtype))
    if chosen not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {dtype!r}: use float32, bfloat16 or float16")
    return chosen


def dtype_name(dtype) -> str:
    """'float32', 'bfloat16' or 'float16' for a torch dtype or one of its usual spellings."""
    return _dtype_name(_torch_dtype(dtype))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------------------------
# Tokenizer

# Split patterns of the pre-tokenizers llama.cpp names in `tokenizer.ggml.pre`; these are the
# regexes of the original HF tokenizers (Llama 3 and Qwen2; Qwen2 differs by single digits).
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level_pre_tokenizer(pre: str):
    from tokenizers import Regex, normalizers, pre_tokenizers

    def split_then_bytes(pattern):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])

    gpt2_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                          use_regex=True)
    if pre in ("default", "gpt2"):
        return None, gpt2_bytes
    if pre == "smollm":
        # SmolLM/StarCoder-style: every digit on its own, then the GPT-2 byte-level regex.
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              gpt2_bytes])
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return None, split_then_bytes(_LLAMA3_PATTERN)
    if pre == "qwen2":
        return normalizers.NFC(), split_then_bytes(_QWEN2_PATTERN)
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre); supported: "
                     "smollm, llama-bpe/llama3, qwen2, default/gpt2")


def build_tokenizer(meta: dict):
    """A `tokenizers.Tokenizer` from GGUF tokenizer metadata, and the list of token strings."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF has no tokenizer (tokenizer.ggml.tokens is missing)")
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(meta, tokens)
    elif kind == "llama":
        tokenizer = _sentencepiece_bpe(meta, tokens)
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (tokenizer.ggml.model); "
                         "supported: gpt2 (byte-level BPE), llama (SentencePiece BPE)")
    _add_special_tokens(tokenizer, meta, tokens)
    _set_post_processor(tokenizer, meta, tokens, byte_level=(kind == "gpt2"))
    return tokenizer, tokens


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # a repeated string keeps its first id
    if len(vocab) != len(tokens):
        warnings.warn(f"GGUF vocabulary repeats {len(tokens) - len(vocab)} token strings; "
                      "only the first id of each is reachable by the tokenizer")
    return vocab


def _byte_level_bpe(meta: dict, tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models

    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise ValueError("GGUF byte-level BPE tokenizer lacks tokenizer.ggml.merges")
    model = models.BPE(vocab=_vocab(tokens), merges=[tuple(m.split(" ", 1)) for m in merges],
                       fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(model)
    normalizer, pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre",
                                                                   "default"))
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(meta: dict, tokens: list[str]):
    """Llama/Mistral-style SentencePiece BPE, expressed as a `tokenizers` BPE with byte fallback.

    The GGUF keeps only pieces and scores; the merges are recovered from them: a piece that can
    be split into two pieces is a merge of them, and a higher score merges earlier.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        raise ValueError("GGUF SentencePiece tokenizer lacks tokenizer.ggml.scores")
    types = meta.get("tokenizer.ggml.token_type") or [_TOKEN_NORMAL] * len(tokens)
    vocab = _vocab(tokens)
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    model = models.BPE(vocab=vocab, merges=_sentencepiece_merges(tokens, scores, types),
                       unk_token=unk, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    steps = []
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.append(normalizers.Prepend("▁"))
    steps.append(normalizers.Replace(" ", "▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    decoder_steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        decoder_steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decoder_steps)
    return tokenizer


def _sentencepiece_merges(tokens, scores, types) -> list[tuple[str, str]]:
    # Only ordinary pieces take part in merges; byte pieces (<0x41>) and control tokens do not.
    mergeable = {tok: i for i, tok in enumerate(tokens)
                 if types[i] in (_TOKEN_NORMAL, _TOKEN_USER_DEFINED)}
    candidates = []
    for piece, piece_id in mergeable.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                candidates.append((-scores[piece_id], mergeable[left], mergeable[right],
                                   left, right))
    candidates.sort()
    return [(left, right) for *_, left, right in candidates]


def _add_special_tokens(tokenizer, meta: dict, tokens: list[str]) -> None:
    from tokenizers import AddedToken

    types = meta.get("tokenizer.ggml.token_type") or []
    # Control tokens (<|im_start|>, <s>) are special: matched whole, skipped on request when
    # decoding. User-defined tokens (<think>) are matched whole too but are ordinary text.
    special = [AddedToken(tok, special=True, normalized=False)
               for tok, kind in zip(tokens, types) if kind == _TOKEN_CONTROL]
    user = [AddedToken(tok, special=False, normalized=False)
            for tok, kind in zip(tokens, types) if kind == _TOKEN_USER_DEFINED]
    if special:
        tokenizer.add_special_tokens(special)
    if user:
        tokenizer.add_tokens(user)


def _set_post_processor(tokenizer, meta: dict, tokens: list[str], byte_level: bool) -> None:
    from tokenizers import processors

    ids = _special_token_ids(meta)
    add_bos = _adds_bos(meta) and "bos" in ids
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and "eos" in ids
    steps = [processors.ByteLevel(trim_offsets=False)] if byte_level else []
    if add_bos or add_eos:
        bos = f"{tokens[ids['bos']]}:0 " if add_bos else ""
        eos = f" {tokens[ids['eos']]}:0" if add_eos else ""
        bos_b = f" {tokens[ids['bos']]}:1" if add_bos else ""
        eos_b = f" {tokens[ids['eos']]}:1" if add_eos else ""
        special = []
        if add_bos:
            special.append((tokens[ids["bos"]], ids["bos"]))
        if add_eos and (not add_bos or ids["eos"] != ids["bos"]):
            special.append((tokens[ids["eos"]], ids["eos"]))
        steps.append(processors.TemplateProcessing(
            single=f"{bos}$A:0{eos}",
            pair=f"{bos}$A:0{eos}{bos_b} $B:1{eos_b}",
            special_tokens=special))
    if len(steps) == 1:
        tokenizer.post_processor = steps[0]
    elif steps:
        tokenizer.post_processor = processors.Sequence(steps)
