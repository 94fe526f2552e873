"""Chained launches (csrc/cuda/launch.cuh, DSPINE_PDL=1: programmatic dependent launch on sm_90+):
a chain of the round's kernels (add + RMSNorm, the dense GEMM, SiLU-mul, the GEMM again, layer
after layer, on buffers the caching allocator hands back and forth) gives bitwise the results of
unchained launches, eagerly and replayed from a CUDA graph. A kernel that read its input before
the previous kernel finished, or wrote a buffer that kernel still read, would differ.
Run: python -m pytest -q -m gpu tests/test_launch_chain_gpu.py
"""
import os
import subprocess
import sys

import pytest
import torch

from dspine_engine import ops

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available()
                                 or torch.cuda.get_device_capability() < (9, 0),
                                 reason="chained launches need an sm_90+ GPU")]

DEV = "cuda"
EPS = 1e-6


def _layers(hidden, inter, count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        norm = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(torch.bfloat16).to(DEV)
        up = (torch.randn(2 * inter, hidden, generator=gen) / hidden ** 0.5).to(torch.bfloat16)
        down = (torch.randn(hidden, inter, generator=gen) / inter ** 0.5).to(torch.bfloat16)
        out.append((norm, ops.dense_pack(up.to(DEV)), ops.dense_pack(down.to(DEV))))
    return out


def _chain(x, layers, hidden, inter):
    h, residual = x, torch.zeros_like(x)
    for norm, up, down in layers:
        normed, residual = ops.add_rms_norm(h, residual, norm, EPS)
        h = ops.dense_matmul(ops.silu_mul(ops.dense_matmul(normed, up, 2 * inter)), down, hidden)
    return h, residual


@pytest.mark.parametrize("chained", ["1", None], ids=["pdl1", "pdl_unset"])
@pytest.mark.parametrize("rows", [1, 16, 100])
def test_chained_launches_give_the_unchained_results(rows, chained, monkeypatch):
    """Chained (DSPINE_PDL=1, and unset: the default) equals unchained, eager and in a graph."""
    hidden, inter = 1024, 2816
    layers = _layers(hidden, inter, 6)
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16).to(DEV)
    monkeypatch.setenv("DSPINE_PDL", "0")
    want = [t.clone() for t in _chain(x, layers, hidden, inter)]
    assert all(torch.isfinite(t.float()).all() for t in want)

    if chained is None:
        monkeypatch.delenv("DSPINE_PDL")
    else:
        monkeypatch.setenv("DSPINE_PDL", chained)
    for _ in range(3):
        got = _chain(x, layers, hidden, inter)
        for g, w in zip(got, want):
            assert torch.equal(g, w), "an eager chained launch changed a result"

    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _chain(x, layers, hidden, inter)  # warm-up on the capture stream (workspaces, attributes)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        captured = _chain(x, layers, hidden, inter)
    for _ in range(3):
        for t in captured:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for g, w in zip(captured, want):
            assert torch.equal(g, w), "a chained launch in a graph changed a result"


def test_a_bad_chain_setting_warns_and_launches_unchained():
    code = ("import torch; from dspine_engine import ops; "
            "x = torch.randn(4, 256, device='cuda', dtype=torch.bfloat16); "
            "w = torch.ones(256, device='cuda', dtype=torch.bfloat16); "
            "assert torch.equal(ops.rms_norm(x, w, 1e-6), ops.rms_norm(x, w, 1e-6)); "
            "torch.cuda.synchronize()")
    env = {**os.environ, "DSPINE_PDL": "yes"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("DSPINE_PDL=yes is neither 0 nor 1") == 1
