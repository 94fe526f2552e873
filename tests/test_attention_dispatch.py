"""Which attention kernel a call takes: the dispatch rules (csrc/cuda/attention_heuristics.h),
compiled from the header alone with the host C++ compiler and checked without a GPU
(tests/attention_dispatch_check.cpp). The GPU tests check that the kernels chosen agree."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_prefills_take_the_wgmma_kernel_whatever_their_batch(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path / "attention_dispatch_check"
    build = subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{ROOT / 'csrc'}",
                            str(ROOT / "tests" / "attention_dispatch_check.cpp"), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip().endswith("0 failures"), run.stdout
