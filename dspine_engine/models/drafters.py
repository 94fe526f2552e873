"""Where draft models come from: a directory, or "default" for the drafter shipped in the package."""
from __future__ import annotations

from pathlib import Path

# The drafter trained for the default target (SmolLM2-135M-Instruct), shipped as package data.
DEFAULT_DRAFTER = Path(__file__).resolve().parent.parent / "drafters" / "smollm2-135m-dspine"


def resolve_draft_path(spec) -> Path:
    if spec in (None, "default"):
        path = DEFAULT_DRAFTER
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"no default drafter is shipped in this build ({path}); pass a draft directory")
        return path
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"draft model {spec!r} does not exist")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise FileNotFoundError(f"draft model {spec!r} must be a directory with config.json and "
                                "*.safetensors")
    return path
