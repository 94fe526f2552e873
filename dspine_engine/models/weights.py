"""Reading and writing safetensors checkpoints: one file, or shards listed in
`model.safetensors.index.json`."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .config import ModelConfigError


def checkpoint_files(model_dir: Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelConfigError(f"{index} is malformed ({e})") from None
        files = [model_dir / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards listed in {index.name} are missing: {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


class WeightStore:
    """Lazy access to the tensors of a checkpoint, with clear errors for missing names."""

    def __init__(self, files: list[Path], desc: str = "loading weights", progress: bool = True):
        self._where: dict[str, Path] = {}
        self._tensors: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as h:
                    for name in h.keys():
                        self._where[name] = f
            except Exception as e:  # safetensors raises its own types for corrupt headers
                raise ModelConfigError(f"cannot read {f}: {e}") from None
        self._files = files
        self._desc = desc
        self._progress = progress

    def names(self) -> set[str]:
        return set(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def load_all(self) -> None:
        """Reads every tensor once (file by file), with a progress bar."""
        bar = tqdm(total=len(self._where), desc=self._desc, unit="tensor",
                   disable=not self._progress, leave=False)
        for f in self._files:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    self._tensors[name] = h.get_tensor(name)
                    bar.update()
        bar.close()

    def get(self, name: str, shape: tuple | None = None) -> torch.Tensor:
        if name not in self._where:
            raise ModelConfigError(f"checkpoint lacks tensor {name!r}")
        t = self._tensors.get(name)
        if t is None:
            with safe_open(str(self._where[name]), framework="pt") as h:
                t = h.get_tensor(name)
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ModelConfigError(
                f"tensor {name!r} has shape {tuple(t.shape)}, the config implies {tuple(shape)}")
        return t


def save_checkpoint(tensors: dict[str, torch.Tensor], out_dir: Path,
                    max_shard_bytes: int | None = None) -> list[Path]:
    """Writes `model.safetensors`, or shards plus `model.safetensors.index.json` when the
    tensors exceed `max_shard_bytes` (the layout `checkpoint_files` reads). Old weight files in
    `out_dir` are removed first so a stale shard can never be read with the new ones."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = list(out_dir.glob("model*.safetensors")) + [out_dir / "model.safetensors.index.json"]
    for old in stale:
        old.unlink(missing_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        path = out_dir / "model.safetensors"
        save_file(shards[0], str(path), metadata={"format": "pt"})
        return [path]
    paths, weight_map = [], {}
    for i, shard in enumerate(shards):
        path = out_dir / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        weight_map.update({name: path.name for name in shard})
        paths.append(path)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in tensors.values())},
             "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return paths
