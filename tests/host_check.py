"""Builds and runs a host-only C++ check (tests/*_check.cpp over a plain C++ header of csrc/) with
the host compiler: rules the GPU tests cannot pin without the right card, checked in CI."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_host_check(tmp_path: Path, source: str) -> str:
    """Compiles tests/<source> (warnings are errors) and runs it; returns its output, which must
    end with "0 failures". Skips where no host C++ compiler exists."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path / Path(source).stem
    build = subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{ROOT / 'csrc'}",
                            str(ROOT / "tests" / source), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("0 failures"), run.stdout
    return run.stdout
