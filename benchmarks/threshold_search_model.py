"""A Python model of the sampled verify's candidate threshold search (csrc/cuda/sampling.cuh),
checked against the radix passes' definition on the GPU test's rows: python
benchmarks/threshold_search_model.py. It models the math (keys, integer weights, the two bounds,
the 512-candidate gather), not the kernel; the GPU test checks the kernel."""
import math
import struct
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_kernels_gpu import _threshold_rows  # noqa: E402  (the GPU test's rows)

THREADS, CAP, FAST_TOP_K = 256, 512, 128
LEVELS = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -7, 2.0 ** -8, 2.0 ** -9]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def order_key(f):
    u = struct.unpack("<I", struct.pack("<f", f))[0]
    if (u << 1) & 0xFFFFFFFF == 0:
        u = 0
    return (~u & 0xFFFFFFFF) if u & 0x80000000 else u | 0x80000000


def radix_threshold(values, weights, need):
    """The largest weighted key whose weight from above reaches need (what the radix finds)."""
    cum = 0
    for k, w in sorted(((order_key(v), w) for v, w in zip(values, weights) if w), reverse=True):
        cum += w
        if cum >= need:
            return k
    return None


def candidate_threshold(values, weights, need, bound):
    cands = [(order_key(v), w) for v, w in zip(values, weights) if w and v >= bound]
    if len(cands) > CAP:
        return "overflow"
    found = [ki for ki, _ in cands if sum(w for k, w in cands if k >= ki) >= need]
    return max(found) if found else None


def check_row(row, temperature, top_k, top_p):
    vocab, inv_t = len(row), f32(1.0 / temperature)
    chunk = ((vocab + THREADS - 1) // THREADS + 7) // 8 * 8
    xs = [f32(x * inv_t) for x in row]
    result, kth = {}, -math.inf
    if 0 < top_k < vocab:
        count = [0 if math.isnan(v) else 1 for v in xs]
        want = radix_threshold(xs, count, top_k)
        maxima = sorted((max([v for v in xs[t * chunk:(t + 1) * chunk] if not math.isnan(v)], default=-math.inf)
                         for t in range(THREADS)), reverse=True)
        bound = maxima[top_k - 1] if top_k <= THREADS else -math.inf
        fast = top_k <= FAST_TOP_K and (bound > -math.inf or vocab <= CAP)
        got = candidate_threshold(xs, count, top_k, bound) if fast else "radix"
        result["top-k"] = (got if isinstance(got, str) else "candidates", got in ("overflow", "radix") or got == want)
        if want is not None:
            kth = struct.unpack("<f", struct.pack("<I", (want & 0x7FFFFFFF) if want & 0x80000000
                                                  else ~want & 0xFFFFFFFF))[0]
    if top_p < 1:
        kept = [v for v in xs if not math.isnan(v) and v >= kth]
        m = max(kept, default=-math.inf)
        z = sum(math.exp(v - m) for v in kept)
        p = [0.0 if math.isnan(v) or not v >= kth else f32(math.exp(v - m) / z) for v in xs]
        mass = [int(round(v * 2 ** 48)) for v in p]
        need = max(1, math.ceil(top_p * 2 ** 48))
        want = radix_threshold(p, mass, need)
        level = next((lv for lv in LEVELS if sum(w for v, w in zip(p, mass) if v >= lv) >= need), 0.0)
        got = candidate_threshold(p, mass, need, level) if level > 0 else "radix"
        result["top-p"] = (got if isinstance(got, str) else "candidates", got in ("overflow", "radix") or got == want)
    return result


def main():
    mismatches = 0
    for vocab in (300, 20011):
        for row, temperature, top_k, top_p in _threshold_rows(vocab, torch.Generator().manual_seed(vocab)):
            result = check_row(row.tolist(), temperature, top_k, top_p)
            mismatches += sum(not ok for _, ok in result.values())
            print(f"V={vocab} T={temperature} top_k={top_k} top_p={top_p}: "
                  + ", ".join(f"{name} by {path}{'' if ok else ' MISMATCH'}" for name, (path, ok) in result.items()))
    print(f"{mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
