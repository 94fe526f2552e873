"""The sm90 attention kernel's TMA boxes land where its CuTe layout expects them: a host-only
C++ check (tests/sm90_tma_layout_check.cu) compiled with nvcc against the CUTLASS headers, so it
runs without a GPU wherever both are installed (the GPU machine; CI skips it without CUTLASS)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _nvcc():
    found = shutil.which("nvcc")
    if found is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        found = "/usr/local/cuda/bin/nvcc"
    return found


def _cutlass_include():
    """Where the build looks first (setup.py): DSPINE_CUTLASS_INCLUDE, then the nvidia-cutlass wheel."""
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    wheel = Path(spec.origin).parent / "source" / "include" if spec is not None and spec.origin else None
    for path in (os.environ.get("DSPINE_CUTLASS_INCLUDE"), wheel):
        if path and (Path(path) / "cute" / "tensor.hpp").is_file():
            return Path(path)
    return None


def test_tma_boxes_land_where_the_cute_layout_puts_them(tmp_path):
    nvcc, cutlass = _nvcc(), _cutlass_include()
    if nvcc is None:
        pytest.skip("no nvcc")
    if cutlass is None:
        pytest.skip("no CUTLASS headers (pip install nvidia-cutlass, or DSPINE_CUTLASS_INCLUDE)")
    exe = tmp_path / "sm90_tma_layout_check"
    build = subprocess.run([nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-DDSPINE_WITH_SM90",
                            f"-I{ROOT / 'csrc'}", f"-I{cutlass}", str(ROOT / "tests" / "sm90_tma_layout_check.cu"),
                            "-o", str(exe)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout
    assert run.stdout.count(" 0 mismatches") == 4, run.stdout
