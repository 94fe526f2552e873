"""Builds dspine_engine._C: the CPU kernels always, the CUDA kernels when they can be built.

Environment switches (all optional):
  DSPINE_CUDA=1/0        force the CUDA kernels on (fail if impossible) or off; default: on when
                         torch is a CUDA build and nvcc is found.
  DSPINE_CUDA_ARCHS      e.g. "80;90a" (default). Each entry becomes -gencode for that sm.
  DSPINE_CUTLASS_INCLUDE the CUTLASS/CuTe include directory (the one holding cute/ and cutlass/)
                         for the Hopper attention kernel (csrc/cuda/attention_sm90.cuh). Default:
                         the headers of the installed nvidia-cutlass wheel (cutlass_library/
                         source/include), else $CUTLASS_PATH/include. CUDA builds only; without
                         the headers the build goes on without the sm90 path (a warning says so).
  DSPINE_PORTABLE=1      build the CPU kernels without -march=native (for redistributable wheels).
  DSPINE_SANITIZE=address  build the C++ (not the CUDA) code with AddressSanitizer: run Python
                         with LD_PRELOAD=$(c++ -print-file-name=libasan.so) and
                         ASAN_OPTIONS=detect_leaks=0 (Python is not instrumented).
  MAX_JOBS               parallel compile jobs (torch's ninja builder reads it).
"""
import glob
import os
import shutil

from setuptools import setup

try:
    from torch.utils import cpp_extension as ce
except ImportError:  # pip's isolated build env: it would fetch a multi-GB torch we must not build against
    raise SystemExit(
        "dspine-engine compiles its kernels against the torch installed in your environment, "
        "so it must not be built in an isolated environment. Install torch first, then:\n"
        "    pip install --no-build-isolation -e .") from None

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name):
    value = os.environ.get(name)
    return None if value is None or value == "" else value not in ("0", "false", "False", "no")


def _want_cuda():
    forced = _flag("DSPINE_CUDA")
    import torch

    possible = torch.version.cuda is not None and (ce.CUDA_HOME is not None or shutil.which("nvcc"))
    if forced and not possible:
        raise RuntimeError("DSPINE_CUDA=1 but torch is not a CUDA build or nvcc is missing")
    return bool(possible) if forced is None else forced


def _gencode():
    archs = os.environ.get("DSPINE_CUDA_ARCHS", "80;90a").replace(",", ";").split(";")
    flags = []
    for arch in filter(None, (a.strip() for a in archs)):
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


def _cutlass_include():
    """The CUTLASS include directory for the sm90 attention kernel, or None (CUDA builds only)."""
    import importlib.util

    candidates = [os.environ.get("DSPINE_CUTLASS_INCLUDE")]
    spec = importlib.util.find_spec("cutlass_library")  # the nvidia-cutlass wheel; not imported
    if spec is not None and spec.origin:
        candidates.append(os.path.join(os.path.dirname(spec.origin), "source", "include"))
    if os.environ.get("CUTLASS_PATH"):
        candidates.append(os.path.join(os.environ["CUTLASS_PATH"], "include"))
    for path in filter(None, candidates):
        if os.path.isfile(os.path.join(path, "cute", "tensor.hpp")):
            return path
    return None


def extensions():
    cxx = ["-O3", "-std=c++17", "-fopenmp"]
    link = ["-fopenmp"]
    if not _flag("DSPINE_PORTABLE"):
        cxx.append("-march=native")
    sanitize = os.environ.get("DSPINE_SANITIZE")
    if sanitize:
        cxx += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
        link.append(f"-fsanitize={sanitize}")
    sources = sorted(glob.glob("csrc/*.cpp")) + sorted(glob.glob("csrc/cpu/*.cpp"))
    include_dirs = [os.path.join(ROOT, "csrc")]
    if _want_cuda():
        nvcc = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "--use_fast_math", "-lineinfo",
                "-DDSPINE_WITH_CUDA"] + _gencode()
        defines = ["-DDSPINE_WITH_CUDA"]
        # CuTe (the sm90 attention kernel, cuda_attention_sm90.cu) is the only CUTLASS user: its
        # headers are needed exactly when that kernel is built. A CPU-only build never gets here.
        cutlass = _cutlass_include()
        if cutlass is not None:
            include_dirs.append(cutlass)
            defines.append("-DDSPINE_WITH_SM90")
        else:
            print("dspine-engine: CUTLASS headers not found (pip install nvidia-cutlass, or set "
                  "DSPINE_CUTLASS_INCLUDE): building without the sm90 attention path")
        return [ce.CUDAExtension(
            "dspine_engine._C",
            sources + sorted(glob.glob("csrc/cuda/*.cu")),
            include_dirs=include_dirs,
            extra_compile_args={"cxx": cxx + defines, "nvcc": nvcc + defines[1:]},
            extra_link_args=link,
        )]
    return [ce.CppExtension(
        "dspine_engine._C", sources, include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx}, extra_link_args=link,
    )]


setup(ext_modules=extensions(), cmdclass={"build_ext": ce.BuildExtension})
