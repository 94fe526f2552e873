"""The launch-chain rule of csrc/cuda/launch.cuh, checked on the sources (CPU): every CUDA kernel
calls join_chain() (or chain_wait()) — a kernel launched chained without it could read its input
before the previous kernel wrote it — and no launch bypasses launch_kernel (a <<<>>> launch would
silently leave the chain)."""
import re
from pathlib import Path

CUDA = Path(__file__).resolve().parents[1] / "csrc" / "cuda"


def _kernel_bodies(text):
    """(name, body) of each __global__ function defined in the text."""
    for match in re.finditer(r"__global__", text):
        depth, i = 0, match.end()
        while i < len(text):
            c = text[i]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == ";" and depth == 0:
                break  # a declaration
            elif c == "{" and depth == 0:
                start, level = i, 0
                while True:
                    level += {"{": 1, "}": -1}.get(text[i], 0)
                    i += 1
                    if level == 0:
                        break
                head = text[match.end():start]
                name = re.findall(r"(\w+)\s*\(", head)[-1]
                yield name, text[start:i]
                break
            i += 1


def _sources():
    return {p.name: p.read_text() for p in sorted(CUDA.glob("*.cu*"))}


def test_every_kernel_joins_the_launch_chain():
    kernels = {(f, name): body for f, text in _sources().items() for name, body in _kernel_bodies(text)}
    assert len(kernels) >= 19, sorted(kernels)
    missing = [k for k, body in kernels.items() if not re.search(r"\b(join_chain|chain_wait)\(\)", body)]
    assert not missing, f"kernels that never wait for the previous one: {missing}"


def test_no_launch_bypasses_launch_kernel():
    code = {f: re.sub(r"//[^\n]*", "", text) for f, text in _sources().items()}
    raw = [f for f, text in code.items() if "<<<" in text]
    direct = [f for f, text in code.items() if f != "launch.cuh" and re.search(r"\bcudaLaunch(KernelEx|Kernel|CooperativeKernel)\b", text)]
    assert not raw and not direct, f"launches outside launch_kernel: {raw + direct}"


def test_the_scanner_sees_a_kernel_without_the_wait():
    text = ("template <int N>\n__global__ void __launch_bounds__(128) leaky(const P p) {\n"
            "  if (p.x) { p.y[0] = 1; }\n}\n__global__ void declared(int);\n")
    found = dict(_kernel_bodies(text))
    assert list(found) == ["leaky"]
    assert "join_chain" not in found["leaky"] and "p.y[0] = 1" in found["leaky"]
