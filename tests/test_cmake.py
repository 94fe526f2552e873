"""The plain C++ library of CMakeLists.txt, built the way a non-Python serving stack builds it.

Configures, builds and runs ctest in a temporary build directory (the C API of csrc/capi against
the naive references in tests/cpp), then installs the package and builds tests/cpp/consumer
against it with find_package(), as a static and as a shared library. No torch involved; needs a
C++ compiler and CMake >= 3.18 (from PATH, else from the `cmake` PyPI package).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONSUMER = ROOT / "tests" / "cpp" / "consumer"
JOBS = "2"  # CI machines have two cores
TIMEOUT_S = 600  # per command: a hang fails instead of blocking the suite


def _cxx_compiler() -> str | None:
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"]) or os.environ["CXX"]
    return next((p for p in map(shutil.which, ("c++", "g++", "clang++")) if p), None)


def _cmake_tool(name: str) -> str:
    """`cmake` or `ctest` from PATH, else from the cmake PyPI package."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import cmake  # the PyPI package ships the binaries
    except ImportError:
        pytest.fail(f"{name} is neither on PATH nor installed as the `cmake` Python package "
                    "(pip install cmake)")
    return os.path.join(cmake.CMAKE_BIN_DIR, name)


pytestmark = pytest.mark.skipif(_cxx_compiler() is None, reason="no C++ compiler found")


def _run(cmd: list, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"`{' '.join(map(str, cmd))}` exited with {proc.returncode}:\n"
                    f"{proc.stdout[-6000:]}")
    return proc.stdout


def _configure_and_build(build: Path, *options: str) -> None:
    # CPU only unless asked: compiling the CUDA kernels on a CI machine would take minutes.
    _run([_cmake_tool("cmake"), "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
          "-DDSPINE_WITH_CUDA=OFF", *options])
    _run([_cmake_tool("cmake"), "--build", build, "--parallel", JOBS])


def _install_and_build_consumer(build: Path, work: Path) -> str:
    """Installs `build` under work/prefix, builds the find_package consumer, returns its output."""
    prefix = work / "prefix"
    _run([_cmake_tool("cmake"), "--install", build, "--prefix", prefix])
    assert (prefix / "include" / "dspine_kernels.h").is_file()
    consumer = work / "consumer"
    _run([_cmake_tool("cmake"), "-S", CONSUMER, "-B", consumer, f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run([_cmake_tool("cmake"), "--build", consumer, "--parallel", JOBS])
    return _run([consumer / "dspine_consumer"])


def test_cmake_version():
    out = _run([_cmake_tool("cmake"), "--version"])
    major, minor = map(int, re.search(r"version (\d+)\.(\d+)", out).groups())
    assert (major, minor) >= (3, 18), out


@pytest.fixture(scope="module")
def static_build(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("cmake_static") / "build"
    _configure_and_build(build)
    return build


def test_ctest_passes(static_build):
    out = _run([_cmake_tool("ctest"), "--output-on-failure", "--parallel", JOBS], cwd=static_build)
    assert "100% tests passed" in out, out
    # Every op family ran: one ctest test each, plus the C compile/link check.
    for group in ("norm", "rope", "write_kv", "attention", "injection", "transition_walk",
                  "block_verify", "errors", "c_smoke"):
        assert f"capi.{group} " in out, f"ctest did not run capi.{group}:\n{out}"


def test_installed_static_package_links(static_build, tmp_path):
    assert "consumer OK" in _install_and_build_consumer(static_build, tmp_path)


def test_shared_library_exports_only_the_c_api(tmp_path):
    build = tmp_path / "build"
    _configure_and_build(build, "-DBUILD_SHARED_LIBS=ON", "-DDSPINE_BUILD_TESTS=OFF")
    assert "consumer OK" in _install_and_build_consumer(build, tmp_path)
    nm = shutil.which("nm")
    libs = sorted((tmp_path / "prefix").rglob("libdspine_kernels.so*"))
    if nm is None or not libs:  # not an ELF toolchain: the link test above is the check
        return
    out = _run([nm, "-D", "--defined-only", libs[0]])
    exported = {line.split()[-1] for line in out.splitlines() if re.search(r" [TDBRVW] ", line)}
    leaked = sorted(s for s in exported if not s.startswith("dspine_"))
    assert not leaked, f"symbols beyond the C API are exported: {leaked[:20]}"
    assert "dspine_cpu_paged_attention_f32" in exported


@pytest.mark.gpu
def test_cuda_build_passes_ctest(tmp_path):
    """The CUDA entry points (dspine_kernels_cuda.h) against the same references, on the GPU."""
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("no nvcc")
    build = tmp_path / "build"
    _configure_and_build(build, "-DDSPINE_WITH_CUDA=ON")
    out = _run([_cmake_tool("ctest"), "--output-on-failure", "--parallel", JOBS], cwd=build)
    assert "100% tests passed" in out and "capi.cuda.attention" in out, out
