"""A light GGUF header reader: scalar metadata and tensor locations, nothing else.

`gguf.GGUFReader` builds numpy views for every element of every array field; for a 49K-token
vocabulary that takes about 10 s and 160 MB, which the quantised loader (small RSS, quick
start) cannot afford. Here array fields are skipped (the tokenizer comes from the converted
directory) and the header is parsed from a short-lived memory map, so only its own pages are
ever touched.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}


@dataclass
class TensorInfo:
    """Where one tensor's bytes are (the names `gguf.ReaderTensor` uses for the same facts)."""

    name: str
    shape: np.ndarray  # GGUF order: fastest-varying dimension first
    tensor_type: object  # gguf.GGMLQuantizationType
    data_offset: int  # from the start of the file
    n_bytes: int


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise ValueError(f"{self.path} is truncated or corrupt (header ends early)") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path} is truncated or corrupt (header ends early)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item == _STRING:
                for _ in range(count):
                    length = self.take("<Q")  # (not `pos += take()`: pos would be read first)
                    self.pos += length
            elif item in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item])
            else:  # nested arrays: walk them
                for _ in range(count):
                    self.value(item)
            return None
        if kind not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind}")
        return self.take(_SCALARS[kind])


def read_gguf_header(path) -> tuple[dict, dict[str, TensorInfo]]:
    """``(metadata, tensors)``: scalar and string fields (array fields are None) and the tensors
    by name. Raises ValueError for a file that is not a little-endian GGUF or is truncated."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 24 or f.read(4) != _MAGIC:
            raise ValueError(f"{path} is not a readable GGUF file (bad magic)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf, path)
            cur.pos = 4
            version = cur.take("<I")
            if version not in (2, 3):
                raise ValueError(f"{path}: unsupported GGUF version {version} (or byte-swapped)")
            n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
            meta = {}
            for _ in range(n_kv):
                key = cur.string()
                meta[key] = cur.value(cur.take("<I"))
            infos = []
            for _ in range(n_tensors):
                name = cur.string()
                dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
                infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
            alignment = int(meta.get("general.alignment") or 32)
            data_start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        qtype = gguf.GGMLQuantizationType(kind)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(dims)) // block * type_size
        start = data_start + offset
        if start + n_bytes > size:
            raise ValueError(f"{path} is truncated or corrupt: tensor {name!r} extends past the "
                             "end of the file")
        tensors[name] = TensorInfo(name, np.array(dims, dtype=np.int64), qtype, start, n_bytes)
    return meta, tensors
