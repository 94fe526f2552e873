"""CUDA kernels against the PyTorch references, on fresh random inputs.

The kernels run on the GPU; each reference (dspine_engine.ops.*_ref) runs in fp32 on CPU copies of
the same inputs. Memory a kernel must not read holds NaN, memory it must not write starts as NaN,
and NaN/inf in an output never passes. Run: python -m pytest -q -m gpu tests/test_kernels_gpu.py
"""
import functools
import math

import pytest
import torch

from dspine_engine import _C, ops
from kernel_cases import verify_case, walk_case
from kernel_cases_gpu import (attention_inputs, check_verify_invariants, graph_table_width,
                              rel_err_fp32, same_up_to_boundary, verify_equal, walk_equal,
                              with_table_width)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = "cuda"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
FLOATS = [torch.float32, torch.bfloat16, torch.float16]


def test_extension_has_cuda_kernels():
    assert _C.with_cuda, "dspine_engine._C was built without the CUDA kernels"


# --------------------------------------------------------------------------------------------
# Norms, RoPE, KV write, injection
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 64), (7, 576), (33, 130), (4096, 128), (3, 4096), (5, 8192),
                                   (2, 7), (2, 5, 64)])
def test_rms_norm(shape, dtype):
    d = shape[-1]
    x, w, r = torch.randn(shape).to(dtype), torch.randn(d).to(dtype), torch.randn(shape).to(dtype)
    got = ops.rms_norm(x.to(DEV), w.to(DEV), 1e-5)
    assert got.shape == x.shape
    assert rel_err_fp32(got, ops.rms_norm_ref(x.float(), w.float(), 1e-5)) < TOL[dtype]

    out, s = ops.add_rms_norm(x.to(DEV), r.to(DEV), w.to(DEV), 1e-6)
    _, ref_s = ops.add_rms_norm_ref(x, r, w, 1e-6)
    assert torch.equal(s.cpu(), ref_s), "the residual sum must be x + residual rounded to the dtype"
    assert rel_err_fp32(out, ops.rms_norm_ref(ref_s.float(), w.float(), 1e-6)) < TOL[dtype]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("heads,d", [(9, 64), (3, 128), (2, 256), (5, 96)])
def test_rope(heads, d, dtype):
    n = 37
    cs = ops.rope_cos_sin(d, 4096, 10000.0)
    wide = torch.randn(n, 2 * heads, d).to(dtype)  # x is a row view, like a split projection
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32)
    got = ops.rope(wide.to(DEV)[:, :heads], pos.to(DEV), cs.to(DEV))
    assert got.is_contiguous() and got.shape == (n, heads, d)
    assert rel_err_fp32(got, ops.rope_ref(wide[:, :heads].float(), pos, cs)) < TOL[dtype]


@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_gradient(dtype):
    """The training forward's rope backward (the inverse rotation through the same kernel)."""
    n, heads, d = 37, 3, 128
    cs = ops.rope_cos_sin(d, 4096, 10000.0)
    x = torch.randn(n, heads, d).to(dtype)
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32)
    weight = torch.randn(n, heads, d).to(dtype)
    xd = x.to(DEV).requires_grad_()
    (ops.trainable_rope(xd, pos.to(DEV), cs.to(DEV)) * weight.to(DEV)).sum().backward()
    xr = x.float().requires_grad_()
    (ops.rope_ref(xr, pos, cs) * weight.float()).sum().backward()
    assert rel_err_fp32(xd.grad, xr.grad) < TOL[dtype]


def _poisoned_caches(pages, page_size, heads, d, dtype):
    return [torch.full((pages, page_size, heads, d), float("nan"), dtype=dtype) for _ in range(2)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rotate", [True, False])
@pytest.mark.parametrize("heads,d,page_size", [(9, 64, 16), (3, 128, 7), (2, 256, 1), (8, 128, 64)])
def test_write_kv(heads, d, page_size, rotate, dtype):
    n = 41
    pages = 2 * n // page_size + 2  # room for every row, plus slots that stay unwritten
    cs = ops.rope_cos_sin(d, 4096, 10000.0) if rotate else torch.empty(0)
    k = torch.randn(n, 3 * heads, d).to(dtype)[:, heads:2 * heads]  # strided view
    v = torch.randn(n, heads, d).to(dtype)
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::5] = -1  # padding rows must not be written
    kc, vc = _poisoned_caches(pages, page_size, heads, d, dtype)
    kc_dev, vc_dev = kc.to(DEV), vc.to(DEV)
    ops.write_kv(k.to(DEV), v.to(DEV), pos.to(DEV), cs.to(DEV), kc_dev, vc_dev, slots.to(DEV))
    ref_k, ref_v = _poisoned_caches(pages, page_size, heads, d, torch.float32)
    ops.write_kv_ref(k.float(), v.float(), pos, cs, ref_k, ref_v, slots)
    written = slots[slots >= 0].long()
    untouched = torch.ones(pages * page_size, dtype=torch.bool)
    untouched[written] = False
    for got, ref in ((kc_dev, ref_k), (vc_dev, ref_v)):
        flat_g, flat_r = got.cpu().view(-1, heads, d), ref.view(-1, heads, d)
        assert rel_err_fp32(flat_g[written], flat_r[written]) < TOL[dtype]
        assert torch.isnan(flat_g[untouched].float()).all(), "write_kv wrote a slot it was not given"


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("hq,hkv,d,page_size", [(9, 3, 64, 16), (32, 8, 128, 16), (4, 2, 256, 7)])
def test_rope_write_kv(hq, hkv, d, page_size, dtype):
    """One launch that rotates the queries and writes the keys and values: bitwise what rope and
    write_kv give apart (the same pair functions), and the references' values; padding rows and
    slots past the cache are skipped, no other slot touched."""
    n = 41
    pages = 2 * n // page_size + 2
    cs = ops.rope_cos_sin(d, 4096, 10000.0).to(DEV)
    qkv = torch.randn(n, hq + 2 * hkv, d).to(dtype).to(DEV)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32).to(DEV)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::5] = -1
    slots[3] = pages * page_size + 100  # past the cache: skipped, not written
    slots = slots.to(DEV)
    fused_k, fused_v, apart_k, apart_v = (c.to(DEV) for c in _poisoned_caches(pages, page_size, hkv, d, dtype)
                                          + _poisoned_caches(pages, page_size, hkv, d, dtype))
    out = ops.rope_write_kv(q, k, v, pos, cs, fused_k, fused_v, slots)
    apart = ops.rope(q, pos, cs)
    ops.write_kv(k, v, pos, cs, apart_k, apart_v, slots)
    assert torch.equal(out, apart)
    for got, want in ((fused_k, apart_k), (fused_v, apart_v)):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    assert rel_err_fp32(out, ops.rope_ref(q.float().cpu(), pos.cpu(), cs.cpu())) < TOL[dtype]
    written = slots.cpu()[(slots.cpu() >= 0) & (slots.cpu() < pages * page_size)].long()
    assert int((~fused_k.cpu().view(-1, hkv, d).isnan().all(-1).all(-1)).sum()) == written.numel()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("hq,hkv,d,page_size,offset", [
    (9, 3, 64, 16, 0), (32, 8, 128, 16, 0), (4, 2, 256, 7, 0), (5, 1, 128, 3, 1), (3, 1, 130, 5, 0)])
def test_rope_write_kv_with_head_norms(hq, hkv, d, page_size, offset, dtype):
    """Qwen3's q/k norms inside the rotation and KV write: the reference's values (norm, rounded,
    rotated) on vector rows and on rows the scalar path takes (a view one element off its 16-byte
    alignment, an odd half of 65), one norm or both; padding rows and slots past the cache are
    skipped and no other slot touched (their lanes still join the norm's shuffles). rope and
    write_kv apart take the same norms (the draft's layers call them so)."""
    n, eps = 37, 1e-6
    pages = 2 * n // page_size + 2
    cs = ops.rope_cos_sin(d, 4096, 10000.0).to(DEV)
    flat = torch.randn(n, (hq + 2 * hkv) * d + offset).to(dtype).to(DEV)
    qkv = flat[:, offset:].view(n, hq + 2 * hkv, d)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    q_norm, k_norm = (torch.rand(d).add(0.5).to(dtype).to(DEV) for _ in range(2))
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32).to(DEV)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::5] = -1
    slots[3] = pages * page_size + 100
    slots = slots.to(DEV)
    for qn, kn in ((q_norm, k_norm), (q_norm, None), (None, k_norm)):
        got_k, got_v = (c.to(DEV) for c in _poisoned_caches(pages, page_size, hkv, d, dtype))
        ref_k, ref_v = _poisoned_caches(pages, page_size, hkv, d, torch.float32)
        out = ops.rope_write_kv(q, k, v, pos, cs, got_k, got_v, slots, qn, kn, eps)
        ref = ops.rope_write_kv_ref(*(t.cpu().float() for t in (q, k, v)), pos.cpu(), cs.cpu(), ref_k, ref_v,
                                    slots.cpu(), *(None if w is None else w.cpu().float() for w in (qn, kn)), eps)
        assert not out.isnan().any() and rel_err_fp32(out, ref) < TOL[dtype]
        apart_k, apart_v = (c.to(DEV) for c in _poisoned_caches(pages, page_size, hkv, d, dtype))
        apart = ops.rope(q, pos, cs, qn, eps)
        ops.write_kv(k, v, pos, cs, apart_k, apart_v, slots, kn, eps)
        assert rel_err_fp32(apart, ref) < TOL[dtype]
        for got, want in ((got_k, ref_k), (got_v, ref_v), (apart_k, ref_k), (apart_v, ref_v)):
            got = got.cpu()
            assert torch.equal(got.isnan(), want.isnan()), "wrote a slot it was not given"
            assert rel_err_fp32(got.nan_to_num(), want.nan_to_num()) < TOL[dtype]


def test_write_kv_skips_slots_outside_cache():
    """The CUDA op cannot reject a bad slot without a host sync: it must skip it, never write."""
    k = torch.randn(3, 2, 64, device=DEV)
    kc, vc = (torch.full((2, 4, 2, 64), float("nan"), device=DEV) for _ in range(2))
    slots = torch.tensor([1, 8, 1000], dtype=torch.int32, device=DEV)
    ops.write_kv(k, k, torch.zeros(3, dtype=torch.int32, device=DEV), torch.empty(0, device=DEV), kc, vc,
                 slots)
    flat = kc.view(-1, 2, 64)
    assert torch.equal(flat[1], k[0])
    assert torch.isnan(flat[torch.arange(8, device=DEV) != 1]).all()


_OUT_OF_TABLE = """
import sys, torch
from dspine_engine import ops
cs = ops.rope_cos_sin(64, 8, 10000.0, device="cuda")
x = torch.randn(3, 2, 64, device="cuda")
pos = torch.tensor([0, int(sys.argv[2]), 3], dtype=torch.int32, device="cuda")
if sys.argv[1] == "rope":
    ops.rope(x, pos, cs)
else:
    kc = torch.zeros(1, 4, 2, 64, device="cuda")
    ops.write_kv(x, x, pos, cs, kc, kc.clone(), torch.tensor([0, 1, 2], dtype=torch.int32,
                                                              device="cuda"))
torch.cuda.synchronize()
print("NO ERROR")
"""


@pytest.mark.parametrize("op", ["rope", "write_kv"])
@pytest.mark.parametrize("bad", [8, -1])
def test_rope_position_outside_the_table_is_an_error(op, bad):
    """A position past the cos/sin table stops the kernel with a device-side assert (it used to
    write NaN without an error). An assert poisons the CUDA context, hence the subprocess."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _OUT_OF_TABLE, op, str(bad)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0 and "NO ERROR" not in out.stdout
    assert "outside the cos/sin table" in out.stdout + out.stderr
    assert "device-side assert" in out.stderr


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (16, 1536), (5, 12288), (3, 65), (48, 8)])
def test_silu_mul(rows, inter, dtype):
    """The gated MLP's activation against silu(gate) * up in fp32 (16-byte packs where inter
    allows, single elements at inter = 65); far tails never give NaN."""
    x = (4 * torch.randn(rows, 2 * inter)).to(dtype)
    x[0, :3] = torch.tensor([-90.0, 90.0, 0.0])
    got = ops.silu_mul(x.to(DEV))
    assert got.shape == (rows, inter) and got.dtype == dtype
    assert rel_err_fp32(got, ops.silu_mul_ref(x.float())) < TOL[dtype]
    assert got[0, 0].item() == 0 and got[0, 2].item() == 0


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 16, 64), (3, 5, 576), (2, 16, 130), (1, 16, 4096), (5, 16, 4096)])
def test_fused_injection(shape, dtype):
    n, b, h = shape
    x, g, f = torch.randn(n, b, h).to(dtype), torch.randn(n, b, h).to(dtype), torch.randn(n, b, 2 * h).to(dtype)
    got = ops.fused_injection(x.to(DEV), g.to(DEV), f.to(DEV))
    assert torch.equal(got[:, 0].cpu(), x[:, 0]), "the anchor row passes through unchanged"
    assert rel_err_fp32(got, ops.fused_injection_ref(x.float(), g.float(), f.float())) < TOL[dtype]


# --------------------------------------------------------------------------------------------
# Paged attention
# --------------------------------------------------------------------------------------------

def _lens(seed, count, lo, hi):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (count,), generator=g).tolist()


ATTN_CASES = [
    # (id, q_lens, kv_lens, q_heads, kv_heads, head_dim, page_size, causal, window)
    ("prefill_varlen_gqa3", [5, 1, 17, 130], [5, 40, 17, 300], 9, 3, 64, 16, True, 0),
    ("prefill_gqa4_2k", [2048, 333], [2048, 333 + 100], 8, 2, 128, 16, True, 0),
    ("prefill_window_hd256", [700], [900], 6, 1, 256, 32, True, 128),
    ("prefill_gqa8_page64", [200, 64], [200, 64], 16, 2, 128, 64, True, 0),
    ("prefill_window_gqa6", [1000], [1500], 12, 2, 64, 16, True, 300),
    ("with_empty_sequence", [3, 0, 5], [10, 20, 5], 4, 1, 128, 16, True, 0),
    ("decode_mha_page8", [1] * 5, [1, 33, 100, 1000, 4097], 4, 4, 64, 8, True, 0),
    ("decode_gqa4_16k_split", [1], [16384], 32, 8, 128, 16, True, 0),
    ("decode_gqa6_hd256_32k", [1, 1], [32768, 9000], 6, 1, 256, 16, True, 0),
    ("decode_window_8192", [1] * 3, [20000, 8192, 8193], 8, 2, 128, 16, True, 8192),
    ("decode_batch32", [1] * 32, _lens(1, 32, 1, 3000), 8, 2, 128, 16, True, 0),
    ("verify16_gqa4_8k", [16] * 2, [8192, 3000], 32, 8, 128, 16, True, 0),
    ("verify16_batch32", [16] * 32, _lens(2, 32, 16, 2000), 8, 2, 128, 16, True, 0),
    ("verify16_window_pages", [16] * 3, [9000, 8300, 100], 8, 2, 128, 16, True, 8192),
    ("verify16_gqa3_hd64_12k", [16], [12000], 9, 3, 64, 16, True, 0),
    ("draft16_gqa6_hd256_window", [16] * 2, [8192 + 16, 5000], 24, 4, 256, 16, False, 8192),
    ("draft16_gqa3_hd64", [16] * 4, [16, 17, 500, 3000], 9, 3, 64, 16, False, 0),
    ("draft16_gqa8_batch8", [16] * 8, _lens(3, 8, 16, 1200), 16, 2, 128, 16, False, 0),
    ("draft16_window_small", [16, 16], [16 + 90, 16 + 7], 6, 1, 64, 16, False, 20),
    ("draft16_long_32k", [16], [32768], 8, 2, 128, 16, False, 8192),
    ("page_size_1", [3], [3], 2, 1, 64, 1, True, 0),
    ("page_size_128_gqa8", [16, 1], [5000, 300], 16, 2, 64, 128, True, 0),
    ("page_size_24_bidir", [7, 16], [1000, 2000], 6, 2, 128, 24, False, 0),
    ("sliding_causal_odd", [13, 1], [77, 64], 4, 2, 256, 32, True, 9),
]
ATTN_IDS = [c[0] for c in ATTN_CASES]


def _run_attention(case, dtype, seed, q_row_pad=0, table_width=None, page_runs=1):
    _, q_lens, kv_lens, hq, hkv, d, ps, causal, window = case
    dev_args, ref_args = attention_inputs(q_lens, kv_lens, hq, hkv, d, ps, dtype, DEV, seed, causal=causal,
                                          window=window, q_row_pad=q_row_pad, page_runs=page_runs)
    if table_width is not None:
        dev_args, ref_args = with_table_width(dev_args, ref_args, table_width)
    scale = 1 / math.sqrt(d)
    got = ops.paged_attention(*dev_args, causal, window, scale)
    q, kc, vc, *meta = ref_args
    ref = ops.paged_attention_ref(q.float(), kc.float(), vc.float(), *meta, causal, window, scale)
    return got, ref


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ATTN_CASES, ids=ATTN_IDS)
def test_paged_attention(case, dtype):
    # Odd cases read q as a row view of a fused QKV projection (q_row_pad = 2 * kv_heads * D).
    pad = 2 * case[4] * case[5] if ATTN_IDS.index(case[0]) % 2 else 0
    got, ref = _run_attention(case, dtype, seed=ATTN_IDS.index(case[0]), q_row_pad=pad)
    assert rel_err_fp32(got, ref) < TOL[dtype]


@pytest.mark.parametrize("form", ["1", "2"], ids=["row_tiles", "key_split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ATTN_CASES, ids=ATTN_IDS)
def test_paged_attention_exact_mode(case, dtype, form, monkeypatch):
    """The row-exact mode's two forms (DSPINE_ATTN_EXACT=1: row tiles split at absolute 256-key
    segments; =2: the key split for every block of <= 16 tokens, 16 rows a CTA) against the
    reference, on the same poisoned cases: no unseen key read, every mode, window and page size."""
    monkeypatch.setenv("DSPINE_ATTN_EXACT", form)
    pad = 2 * case[4] * case[5] if ATTN_IDS.index(case[0]) % 2 else 0
    got, ref = _run_attention(case, dtype, seed=50 + ATTN_IDS.index(case[0]), q_row_pad=pad)
    assert rel_err_fp32(got, ref) < TOL[dtype]


# (block tokens, context before it, window, q heads, kv heads, head dim): the default model's
# heads, Qwen3-8B's, head dim 256, contexts on and across segment boundaries, a window.
EXACT_ROWS = [(16, 70, 0, 9, 3, 64), (5, 1000, 0, 9, 3, 64), (7, 249, 0, 9, 3, 64),
              (16, 600, 64, 9, 3, 64), (16, 2100, 0, 32, 8, 128), (16, 300, 0, 8, 2, 256)]


@pytest.mark.parametrize("via", ["argument", "env", "env_key_split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,context,window,hq,hkv,d", EXACT_ROWS)
def test_exact_mode_verify_rows_are_the_decoded_rows(n, context, window, hq, hkv, d, dtype, via,
                                                     monkeypatch):
    """Greedy speculative == autoregressive on the GPU rests on this: in the exact mode (the
    op's ``exact=True``, which the engine passes by default, or DSPINE_ATTN_EXACT=1 for every
    call), query i of a causal block (the verify) gets bit for bit what decoding it alone gets,
    what decoding it beside another sequence gets, under table bounds that give other split
    counts (a CUDA graph's full width; a table just wide enough). The "fast" kernels fail it
    (benchmarks/gpu_row_exactness.py: 0% of rows)."""
    if via != "argument":
        monkeypatch.setenv("DSPINE_ATTN_EXACT", "2" if via == "env_key_split" else "1")
    _assert_block_rows_are_decoded_rows(n, context, window, hq, hkv, d, dtype, via == "argument")


@pytest.mark.parametrize("segment", ["64", "128", "1024"])
@pytest.mark.parametrize("n,context,window,hq,hkv,d", EXACT_ROWS)
def test_exact_mode_rows_at_other_segment_sizes(n, context, window, hq, hkv, d, segment, monkeypatch):
    """DSPINE_ATTN_EXACT_SEGMENT changes where the exact mode cuts a row's keys, never that a
    verify row is the decoded row (bitwise, as above)."""
    monkeypatch.setenv("DSPINE_ATTN_EXACT_SEGMENT", segment)
    _assert_block_rows_are_decoded_rows(n, context, window, hq, hkv, d, torch.bfloat16, True)


def test_exact_segment_size_reaches_the_reference_and_refuses_odd_sizes(monkeypatch):
    """64-key segments over a 16K context (up to 256 of them, the combine's most) match the reference;
    a size that is no power of two in 64..1024 is refused with the knob's name."""
    monkeypatch.setenv("DSPINE_ATTN_EXACT", "1")
    monkeypatch.setenv("DSPINE_ATTN_EXACT_SEGMENT", "64")
    case = next(c for c in ATTN_CASES if c[0] == "decode_gqa4_16k_split")
    got, ref = _run_attention(case, torch.bfloat16, seed=11)
    assert rel_err_fp32(got, ref) < TOL[torch.bfloat16]
    monkeypatch.setenv("DSPINE_ATTN_EXACT_SEGMENT", "96")
    with pytest.raises(RuntimeError, match="DSPINE_ATTN_EXACT_SEGMENT"):
        _run_attention(case, torch.bfloat16, seed=11)


def _assert_block_rows_are_decoded_rows(n, context, window, hq, hkv, d, dtype, exact_arg):
    attention = functools.partial(ops.paged_attention, exact=exact_arg)
    other = context // 2 + 3
    (q, kc, vc, bt, kl, cu, mq), _ = attention_inputs([n, 1], [context + n, other], hq, hkv, d, 16,
                                                      dtype, DEV, 90 + n + window + d, window=window)
    scale = 1 / math.sqrt(d)
    block = attention(q, kc, vc, bt, kl, cu, mq, True, window, scale)
    one, two = (torch.tensor(c, dtype=torch.int32, device=DEV) for c in ([0, 1], [0, 1, 2]))
    bound = bt.shape[1] * 16
    for i in range(n):
        kv_i = context + i + 1
        # Alone with a table just wide enough (fewer segments: one below 256 keys, where the
        # output is stored directly instead of folded), beside another sequence at the full bound.
        alone = attention(q[i:i + 1].clone(), kc, vc, bt[:1, :(kv_i + 15) // 16].clone(),
                          torch.tensor([kv_i], dtype=torch.int32, device=DEV), one, 1,
                          True, window, scale)
        beside = attention(torch.cat([q[i:i + 1], q[n:n + 1]]), kc, vc, bt,
                           torch.tensor([kv_i, other], dtype=torch.int32, device=DEV), two,
                           1, True, window, scale, bound)
        for name, got in (("alone", alone[0]), ("beside another sequence", beside[0])):
            assert torch.equal(got.view(torch.int16), block[i].view(torch.int16)), f"query {i} of {n}, {name}"


FP32_CASES = [c for c in ATTN_CASES if c[0] in (
    "prefill_varlen_gqa3", "prefill_window_hd256", "decode_gqa4_16k_split", "verify16_window_pages",
    "draft16_gqa6_hd256_window", "draft16_window_small", "page_size_1", "sliding_causal_odd")]


@pytest.mark.parametrize("case", FP32_CASES, ids=[c[0] for c in FP32_CASES])
def test_paged_attention_fp32(case):
    got, ref = _run_attention(case, torch.float32, seed=7)
    assert rel_err_fp32(got, ref) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [c for c in ATTN_CASES if c[0] in (
    "draft16_gqa3_hd64", "verify16_gqa3_hd64_12k", "decode_mha_page8", "prefill_varlen_gqa3")],
    ids=lambda c: c[0])
def test_paged_attention_wide_block_table(case, dtype):
    """Block tables as wide as the longest context (what CUDA graphs capture) make the split
    heuristic pick many splits for short sequences, most of them with no key tile at all."""
    width = graph_table_width(case[2], case[6])
    got, ref = _run_attention(case, dtype, seed=3, table_width=width)
    assert rel_err_fp32(got, ref) < TOL[dtype]


# Contexts that fill their block table to the last column, which has no spare column after it
# (8224 = 514 pages of 16 = a SmolLM2 graph's table width), or put one key on the last page.
TABLE_EDGE_CASES = [
    ("verify16_gqa3_hd64_fills", [16], [8224], 9, 3, 64, 16, True, 0),
    ("verify16_gqa3_hd64_last_key", [16], [8209], 9, 3, 64, 16, True, 0),
    ("draft16_gqa3_hd64_fills", [16, 16], [8224, 40], 9, 3, 64, 16, False, 0),
    ("decode_mha_page8_fills", [1, 1], [8216, 8], 4, 4, 64, 8, True, 0),
    ("verify16_gqa4_hd128_fills", [16], [8224], 8, 2, 128, 16, True, 0),
    ("verify16_window_hd256_fills", [16], [8224], 6, 1, 256, 16, True, 8192),
]


@pytest.mark.parametrize("splits", ["0", "1", "128"])  # 0: the heuristic's count
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", TABLE_EDGE_CASES, ids=[c[0] for c in TABLE_EDGE_CASES])
def test_paged_attention_context_fills_block_table(case, dtype, splits, monkeypatch):
    monkeypatch.setenv("DSPINE_ATTN_SPLITS", splits)
    width = math.ceil(max(case[2]) / case[6])
    got, ref = _run_attention(case, dtype, seed=5, table_width=width)
    assert rel_err_fp32(got, ref) < TOL[dtype]


def test_paged_attention_rejects_bad_metadata():
    (q, kc, vc, bt, kl, cu, mq), _ = attention_inputs([4], [4], 2, 1, 64, 16, torch.bfloat16, DEV, 0)
    with pytest.raises(RuntimeError, match="int32"):
        ops.paged_attention(q, kc, vc, bt.long(), kl, cu, mq, True, 0, 0.1)
    # The one table check CUDA can make without reading kv_lens: a stated bound past the table.
    with pytest.raises(RuntimeError, match="too narrow"):
        ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.1, bt.shape[1] * 16 + 1)


# Split-KV and the key-split variant (<= 16 rows a tile): odd groups and lengths, page sizes that
# are not powers of two, windows whose start falls inside a page (pages below it freed: -1), short
# causal blocks of a small group (several queries in one key-split tile), exactly 16 rows.
SPLIT_CASES = [
    ("decode_gqa4_8k_b8", [1] * 8, _lens(4, 8, 7000, 8193), 32, 8, 128, 16, True, 0),
    ("decode_gqa3_odd_lens", [1] * 6, [1, 17, 63, 65, 129, 4099], 9, 3, 64, 7, True, 0),
    ("decode_gqa16_hd256", [1, 1], [5000, 333], 32, 2, 256, 16, True, 0),
    ("decode_window_mid_page", [1] * 3, [4000, 1000, 37], 8, 2, 128, 16, True, 1000 - 13),
    ("decode_window_page7", [1, 1], [3001, 500], 12, 4, 64, 7, True, 45),
    ("block4_gqa4_keysplit", [4, 3, 4], [4000, 700, 4], 8, 2, 128, 16, True, 0),
    ("block2_gqa8_window", [2, 2], [6000, 90], 16, 2, 64, 16, True, 77),
    ("block5_gqa3_bidir", [5, 5], [2000, 5], 6, 2, 256, 16, False, 0),
    ("verify16_gqa4_window_mid_page", [16] * 4, [9000, 5000, 8200, 16], 32, 8, 128, 16, True, 8192 - 5),
]


def _poison_allocator(nbytes=256 << 20):
    """Frees a NaN-filled block so that the next allocations (the output, the split workspace)
    are likely to reuse NaN memory: a row the kernel forgets to write, or a partial it reads
    without a split having written it, shows up as NaN."""
    junk = torch.full((nbytes // 4,), float("nan"), device=DEV)
    del junk


@pytest.mark.parametrize("splits", ["0", "1", "3", "128"])  # 0: the plan's count
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_paged_attention_splits(case, dtype, splits, monkeypatch):
    monkeypatch.setenv("DSPINE_ATTN_SPLITS", splits)
    _poison_allocator()
    got, ref = _run_attention(case, dtype, seed=SPLIT_CASES.index(case) + 20)
    assert rel_err_fp32(got, ref) < TOL[dtype]


@pytest.mark.parametrize("case", [c for c in SPLIT_CASES if c[0] in (
    "decode_gqa4_8k_b8", "decode_gqa3_odd_lens", "verify16_gqa4_window_mid_page")], ids=lambda c: c[0])
def test_paged_attention_max_kv_len_plans_the_same_result(case):
    """The host bound only changes the split plan (and the grid it launches), never the result
    beyond fp32 rounding of the combine; a graph-wide table with the exact bound too."""
    _, q_lens, kv_lens, hq, hkv, d, ps, causal, window = case
    dev_args, ref_args = attention_inputs(q_lens, kv_lens, hq, hkv, d, ps, torch.bfloat16, DEV, 9,
                                          causal=causal, window=window)
    dev_args, ref_args = with_table_width(dev_args, ref_args, graph_table_width(kv_lens, ps))
    q, kc, vc, *meta = ref_args
    ref = ops.paged_attention_ref(q.float(), kc.float(), vc.float(), *meta, causal, window, 0.1)
    for bound in (0, max(kv_lens), 4 * max(kv_lens)):
        if bound > dev_args[3].shape[1] * ps:
            continue
        _poison_allocator()
        got = ops.paged_attention(*dev_args, causal, window, 0.1, bound)
        assert rel_err_fp32(got, ref) < TOL[torch.bfloat16], bound


@pytest.mark.parametrize("splits", ["0", "7"])
def test_fused_split_combine_under_graph_replay(splits, monkeypatch):
    """The last split to arrive combines; its arrival counters are zeroed by a memset inside the
    graph, so every replay combines again. Two graphs share one memory pool (as the engine's do)
    and the second one's temporaries overwrite the first one's workspace between replays."""
    monkeypatch.setenv("DSPINE_ATTN_SPLITS", splits)
    case_a = SPLIT_CASES[0]
    case_b = ("verify16", [16] * 2, [3000, 700], 32, 8, 128, 16, True, 0)

    def inputs(case, seed):
        _, q_lens, kv_lens, hq, hkv, d, ps, causal, window = case
        return attention_inputs(q_lens, kv_lens, hq, hkv, d, ps, torch.bfloat16, DEV, seed,
                                causal=causal, window=window)

    (args_a, ref_a), (args_b, ref_b) = inputs(case_a, 1), inputs(case_b, 2)
    run_a = lambda: ops.paged_attention(*args_a, True, 0, 0.1)  # noqa: E731
    run_b = lambda: ops.paged_attention(*args_b, True, 0, 0.1) * 2  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_a(), run_b()
    torch.cuda.current_stream().wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    graph_a, graph_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_a, pool=pool):
        out_a = run_a()
    with torch.cuda.graph(graph_b, pool=pool):
        out_b = run_b()
    results = []
    for _ in range(2):
        graph_a.replay()
        results.append(out_a.clone())
        graph_b.replay()
    torch.cuda.synchronize()
    assert torch.equal(results[0], results[1])
    q, kc, vc, *meta = ref_a
    want = ops.paged_attention_ref(q.float(), kc.float(), vc.float(), *meta, True, 0, 0.1)
    assert rel_err_fp32(results[0], want) < TOL[torch.bfloat16]
    q, kc, vc, *meta = ref_b
    want_b = ops.paged_attention_ref(q.float(), kc.float(), vc.float(), *meta, True, 0, 0.1) * 2
    assert rel_err_fp32(out_b, want_b) < TOL[torch.bfloat16]


@pytest.mark.parametrize("d", [64, 96])
def test_paged_attention_unaligned_q_rows_and_odd_head_dim(d):
    """q rows that are not 16-byte aligned (copied first) and a head_dim without tensor-core path."""
    case = ("odd", [16, 3], [300, 40], 6, 2, d, 16, True, 0)
    got, ref = _run_attention(case, torch.bfloat16, seed=11, q_row_pad=3)
    assert rel_err_fp32(got, ref) < TOL[torch.bfloat16]

# --------------------------------------------------------------------------------------------
# Paged attention on Hopper: the sm_90a wgmma path (attention_sm90.cuh)
# --------------------------------------------------------------------------------------------

def _is_hopper():
    return torch.cuda.get_device_capability() == (9, 0)


def _sm90_launches():
    return torch.ops.dspine.attention_sm90_launches()


def _sm90_tma_launches():
    return torch.ops.dspine.attention_sm90_tma_launches()


def _tma_offered(page_size):
    """attention_heuristics.h:sm90_tma_loads: pages of a power of two >= 8 keys (else every tile
    goes by cp.async)."""
    return page_size >= 8 and page_size & (page_size - 1) == 0


def _tma_tiles(tables, kv_lens, page_size):
    """128-key tiles inside their sequence whose pages are consecutive: the tiles the sm90 kernel
    loads by TMA where a CTA sees all their keys (attention_sm90.cuh, sm90_tile_slot)."""
    count = 0
    for row, kv in zip(tables.tolist(), kv_lens):
        for k0 in range(0, kv - 127, 128):
            pages = row[k0 // page_size: (k0 + 127) // page_size + 1]
            count += all(p == pages[0] + i for i, p in enumerate(pages)) and pages[0] >= 0
    return count


def _sm90_available():
    return (torch.cuda.is_available() and _is_hopper() and hasattr(torch.ops.dspine, "attention_sm90_available")
            and torch.ops.dspine.attention_sm90_available() == 1)


needs_sm90 = pytest.mark.skipif(
    not _sm90_available(),
    reason="needs an H100/H200 and a build with the sm90 path (test_sm90_path_is_built_on_hopper)")


def test_sm90_path_is_built_on_hopper():
    """On a Hopper GPU the build must carry the sm90 kernel (CUTLASS headers found, 90a in
    DSPINE_CUDA_ARCHS): otherwise every sm90 test below would skip without a word."""
    if not _is_hopper():
        pytest.skip("not a Hopper GPU")
    assert torch.ops.dspine.attention_sm90_available() == 1


SM90_CASES = [
    # (id, q_lens, kv_lens, q_heads, kv_heads, head_dim, page_size, causal, window)
    ("prefill_gqa4_hd128_2k", [2048], [2048], 32, 8, 128, 16, True, 0),
    ("varlen_gqa3_hd64", [5, 1, 17, 130, 300], [5, 40, 17, 300, 300], 9, 3, 64, 16, True, 0),
    ("chunked_prefill_gqa8_hd128", [333, 517], [333 + 1000, 517 + 4000], 16, 2, 128, 16, True, 0),
    ("chunk_of_one_tile_long_ctx", [16], [16 + 9000], 32, 4, 128, 16, True, 0),
    ("odd_page_24_mha_hd64", [257], [1000], 4, 4, 64, 24, True, 0),
    ("page_size_1_hd128", [77], [77], 2, 1, 128, 1, True, 0),
    ("page_128_gqa8_hd64", [200, 64], [5000, 64], 16, 2, 64, 128, True, 0),
    ("odd_page_40_gqa5_hd128", [131], [131 + 257], 10, 2, 128, 40, True, 0),
    ("with_empty_sequence", [3, 0, 129], [10, 20, 129], 4, 1, 128, 16, True, 0),
    ("bidir_block_gqa6_hd64", [100, 37], [300, 37], 12, 2, 64, 16, False, 0),
    # The producer's runs of consecutive keys (KeyRun): 8 keys a run at head dim 64, exactly a
    # page of 8 (one table read); 16 at head dim 128, longer than a page of 8 (a read per key).
    ("page_8_run_of_a_page_hd64", [150], [150 + 300], 4, 2, 64, 8, True, 0),
    ("page_8_shorter_than_run_hd128", [140], [140 + 200], 8, 2, 128, 8, True, 0),
    # TMA tiles inside a page of 256 (a tile starts mid-page); pages of 24 (no TMA: not a power
    # of two) beside a second sequence whose range starts mid-tile.
    ("page_256_tiles_inside_a_page_hd128", [300], [300 + 700], 8, 2, 128, 256, True, 0),
    ("page_24_two_seqs_hd128", [70, 260], [70 + 500, 260], 8, 4, 128, 24, True, 0),
]


@needs_sm90
@pytest.mark.parametrize("loads", ["tma", "cp.async"])
@pytest.mark.parametrize("arrive", ["wait", "async"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", SM90_CASES, ids=[c[0] for c in SM90_CASES])
def test_paged_attention_sm90(case, dtype, arrive, loads, monkeypatch):
    """The forced sm90 path against the fp32 reference: NaN in every cache slot no query sees,
    the output allocated over NaN, q as a fused-QKV row view in odd cases, pages shuffled in runs
    (tiles on consecutive pages and tiles across runs in one call); and the launch counters prove
    the call ran the wgmma kernel, not the mma.sync one, offered TMA where the page size allows it
    and DSPINE_SM90_LOADS does not ask for cp.async. Both ways the producer announces its loads
    (DSPINE_SM90_ARRIVE)."""
    monkeypatch.setenv("DSPINE_ATTN_SM90", "1")
    monkeypatch.setenv("DSPINE_SM90_ARRIVE", arrive)
    monkeypatch.setenv("DSPINE_SM90_LOADS", loads)
    index = SM90_CASES.index(case)
    pad = 2 * case[4] * case[5] if index % 2 else 0
    _poison_allocator()
    before, tma_before = _sm90_launches(), _sm90_tma_launches()
    got, ref = _run_attention(case, dtype, seed=100 + index, q_row_pad=pad, page_runs=20)
    torch.cuda.synchronize()
    assert _sm90_launches() == before + 1, "the call did not take the sm90 path"
    by_tma = loads == "tma" and _tma_offered(case[6])
    assert _sm90_tma_launches() == tma_before + by_tma, "TMA loads offered where not meant, or not offered"
    assert rel_err_fp32(got, ref) < TOL[dtype]


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [c for c in SM90_CASES if c[0] in (
    "prefill_gqa4_hd128_2k", "chunked_prefill_gqa8_hd128", "varlen_gqa3_hd64")], ids=lambda c: c[0])
def test_paged_attention_sm90_matches_mma_path(case, dtype, monkeypatch):
    """Both paths on the same inputs (DSPINE_ATTN_SM90=0 then 1) agree to bf16/fp16 rounding."""
    _, q_lens, kv_lens, hq, hkv, d, ps, causal, window = case
    dev_args, _ = attention_inputs(q_lens, kv_lens, hq, hkv, d, ps, dtype, DEV, 41, causal=causal, window=window)
    outs = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("DSPINE_ATTN_SM90", mode)
        before = _sm90_launches()
        outs[mode] = ops.paged_attention(*dev_args, causal, window, 1 / math.sqrt(d)).float()
        torch.cuda.synchronize()
        assert _sm90_launches() == before + (mode == "1")
    assert rel_err_fp32(outs["1"], outs["0"]) < TOL[dtype]


@needs_sm90
@pytest.mark.parametrize("page_runs", [20, 10**6], ids=["runs", "in_order"])
@pytest.mark.parametrize("case", [c for c in SM90_CASES if c[0] in (
    "prefill_gqa4_hd128_2k", "chunked_prefill_gqa8_hd128", "page_8_run_of_a_page_hd64",
    "page_256_tiles_inside_a_page_hd128")], ids=lambda c: c[0])
def test_sm90_arrive_modes_agree_bitwise(case, page_runs, monkeypatch):
    """The two producer announcers and the two ways of loading a tile (TMA, cp.async rows)
    change only how and when a stage lands, never the arithmetic: the outputs must be
    bit-identical, over several launches (a stage read before its copies land would show as a
    difference in some launch). Pages in shuffled runs (some tiles by TMA, some not) and all in
    order (every whole tile by TMA); the layout must hold such tiles, or the test proves nothing."""
    monkeypatch.setenv("DSPINE_ATTN_SM90", "1")
    _, q_lens, kv_lens, hq, hkv, d, ps, causal, window = case
    dev_args, _ = attention_inputs(q_lens, kv_lens, hq, hkv, d, ps, torch.bfloat16, DEV, 43, causal=causal,
                                   page_runs=page_runs)
    assert _tma_tiles(dev_args[3].cpu(), kv_lens, ps) > 0
    outs = {}
    modes = [(a, l) for a in ("wait", "async") for l in ("tma", "cp.async")]
    for arrive, loads in modes + modes:
        monkeypatch.setenv("DSPINE_SM90_ARRIVE", arrive)
        monkeypatch.setenv("DSPINE_SM90_LOADS", loads)
        out = ops.paged_attention(*dev_args, causal, window, 1 / math.sqrt(d))
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), (arrive, loads)
        if (arrive, loads) in outs:
            assert torch.equal(out, outs[arrive, loads]), f"{arrive}, {loads}: two launches differ"
        outs[arrive, loads] = out
    first = outs[modes[0]]
    for mode in modes[1:]:
        assert torch.equal(outs[mode], first), mode


@needs_sm90
def test_sm90_dispatch_heuristic_and_fallbacks(monkeypatch):
    """Unset (the default): a long call that is not a prefill stays on mma.sync, exact or not
    (the heuristic depends on the batch); a prefill takes the sm90 path, exact or not, even a
    one-token one; DSPINE_ATTN_SM90=0 keeps a prefill off it. auto: a long non-prefill call (row
    tiles fill the GPU) takes the sm90 path, a decode batch does not. Forced on: fp32, head dim
    256, sliding windows and decode still run the existing kernels (correctly)."""
    long_prefill = ("prefill_gqa4_hd128_2k", [2048], [2048], 32, 8, 128, 16, True, 0)
    one_token = ("one_token_prompt", [1], [1], 32, 8, 128, 16, True, 0)
    decode = ("decode_gqa4", [1] * 4, [3000] * 4, 32, 8, 128, 16, True, 0)
    # (DSPINE_ATTN_SM90, case, prefill, exact, sm90 launches expected)
    runs = [(None, long_prefill, False, False, 0), (None, long_prefill, False, True, 0),
            (None, long_prefill, True, True, 1), (None, long_prefill, True, False, 1),
            (None, one_token, True, True, 1), ("0", long_prefill, True, True, 0),
            ("auto", long_prefill, False, False, 1), ("auto", decode, False, False, 0)]
    for env, case, prefill, exact, expect in runs:
        if env is None:
            monkeypatch.delenv("DSPINE_ATTN_SM90", raising=False)
        else:
            monkeypatch.setenv("DSPINE_ATTN_SM90", env)
        _, q_lens, kv_lens, hq, hkv, d, ps, causal, window = case
        dev_args, ref_args = attention_inputs(q_lens, kv_lens, hq, hkv, d, ps, torch.bfloat16, DEV, 7)
        before = _sm90_launches()
        got = ops.paged_attention(*dev_args, causal, window, 1 / math.sqrt(d), 0, exact, prefill)
        torch.cuda.synchronize()
        assert _sm90_launches() == before + expect, (env, case[0], prefill, exact)
        q, kc, vc, *meta = ref_args
        ref = ops.paged_attention_ref(q.float(), kc.float(), vc.float(), *meta, causal, window, 1 / math.sqrt(d))
        assert rel_err_fp32(got, ref) < TOL[torch.bfloat16]
    monkeypatch.setenv("DSPINE_ATTN_SM90", "1")
    unsupported = [
        (("fp32_prefill", [300], [300], 8, 2, 128, 16, True, 0), torch.float32),
        (("hd256_prefill", [300], [400], 8, 2, 256, 16, True, 0), torch.bfloat16),
        (("window_prefill", [700], [900], 8, 2, 128, 16, True, 128), torch.bfloat16),
        (("decode_gqa4", [1] * 4, [3000] * 4, 32, 8, 128, 16, True, 0), torch.float16),
    ]
    for case, dtype in unsupported:
        before = _sm90_launches()
        got, ref = _run_attention(case, dtype, seed=8)
        torch.cuda.synchronize()
        assert _sm90_launches() == before, case[0]
        assert rel_err_fp32(got, ref) < TOL[dtype]


@needs_sm90
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sm90_prefill_rows_do_not_depend_on_the_batch(head_dim, monkeypatch):
    """The engine's prefill takes the wgmma kernel in exact mode because each row is summed over
    the same absolute key tiles whatever the call's other rows: a prompt prefilled alone must be
    bit for bit the same prompt prefilled beside longer and shorter ones (another max_q_len,
    another grid, other neighbours in its CTAs' key ranges) and in another place of the batch."""
    monkeypatch.delenv("DSPINE_ATTN_SM90", raising=False)
    hq, hkv = (9, 3) if head_dim == 64 else (32, 8)
    prompt, others = 333, [1, 700, 64, 2048]
    scale = 1 / math.sqrt(head_dim)

    def prefill(lens, seed):
        dev_args, _ = attention_inputs(lens, lens, hq, hkv, head_dim, 16, torch.bfloat16, DEV, seed,
                                       page_runs=20)
        return dev_args

    alone = prefill([prompt], 5)
    q0, kc0, vc0, bt0 = alone[0], alone[1], alone[2], alone[3]
    before = _sm90_launches()
    ref = ops.paged_attention(*alone, True, 0, scale, prompt, True, True)
    for position in (0, 2):
        lens = others[:position] + [prompt] + others[position:]
        batch = prefill(lens, 6 + position)
        q, kc, vc, bt, kl, cu, mq = batch
        start = sum(lens[:position])
        q[start:start + prompt] = q0  # the prompt's own queries, keys and values
        rows = bt[position, : bt0.shape[1] - 1].long()
        kc[rows] = kc0[bt0[0, : rows.numel()].long()]
        vc[rows] = vc0[bt0[0, : rows.numel()].long()]
        got = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, scale, max(lens), True, True)
        torch.cuda.synchronize()
        assert torch.equal(got[start:start + prompt], ref), position
    assert _sm90_launches() == before + 3, "the prefills did not all take the sm90 path"


@needs_sm90
def test_sm90_path_under_cuda_graph_replay(monkeypatch):
    """The sm90 launch reads nothing on the host: captured once, replayed on new q/K/V contents
    and page tables of the same shapes, it matches the reference."""
    monkeypatch.setenv("DSPINE_ATTN_SM90", "1")
    case = ("graph", [300, 200], [1300, 700], 16, 2, 128, 16, True, 0)
    dev_args, ref_args = attention_inputs(*case[1:7], torch.bfloat16, DEV, 51)
    static = [a.clone() if torch.is_tensor(a) else a for a in dev_args]
    ops.paged_attention(*static, True, 0, 0.08)  # warm-up: smem attribute, image query
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.paged_attention(*static, True, 0, 0.08)
    for seed in (52, 53):
        dev_args, ref_args = attention_inputs(*case[1:7], torch.bfloat16, DEV, seed)
        for dst, src in zip(static, dev_args):
            if torch.is_tensor(dst):
                dst.copy_(src)
        graph.replay()
        q, kc, vc, *meta = ref_args
        ref = ops.paged_attention_ref(q.float(), kc.float(), vc.float(), *meta, True, 0, 0.08)
        assert rel_err_fp32(out, ref) < TOL[torch.bfloat16], seed


# --------------------------------------------------------------------------------------------
# Transition walk and block verify
# --------------------------------------------------------------------------------------------

WALK_CASES = [
    # (batch, J, vocab, rank, top_k, dtype)
    (3, 15, 1000, 32, 8, torch.float32),
    (3, 3, 100, 7, 1, torch.float32),
    (3, 15, 300, 16, 5, torch.float32),
    (5, 7, 257, 16, 16, torch.float16),
    (4, 15, 151936, 256, 32, torch.float32),
    (32, 15, 151936, 256, 8, torch.bfloat16),
]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("use_transition", [True, False])
@pytest.mark.parametrize("case", WALK_CASES, ids=[f"b{c[0]}_j{c[1]}_v{c[2]}_k{c[4]}_{str(c[5])[6:]}"
                                                  for c in WALK_CASES])
def test_transition_walk(case, use_transition, seed):
    batch, j_len, vocab, rank, top_k, dtype = case
    if vocab > 100000 and seed > 0:
        pytest.skip("one seed is enough for the large-vocabulary reference (slow on the CPU)")
    temps = [[0.0, 1.0, 0.5][b % 3] for b in range(batch)]
    args = walk_case(batch, j_len, vocab, rank, top_k, "cpu", seed, temps, dtype=dtype,
                     use_transition=use_transition)
    dev_args = tuple(a.to(DEV) if torch.is_tensor(a) else a for a in args)
    got, flips = same_up_to_boundary(ops.transition_walk, ops.transition_walk_ref, dev_args, args, 7,
                                     walk_equal)
    assert flips <= 1
    tokens, cand_ids, cand_probs = got
    assert tokens.dtype == torch.long and cand_ids.dtype == torch.long and cand_probs.dtype == torch.float32
    assert torch.allclose(cand_probs.sum(-1), torch.ones(batch, j_len), atol=1e-5)


def test_transition_walk_ties_go_to_the_lower_id():
    logits = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    logits[:, :, 10] = logits[:, :, 20] = logits[:, :, 5] = 1.0
    empty = torch.empty(0, dtype=torch.bfloat16)
    args = (logits, empty, empty, empty, torch.tensor([0, 3]), 4, torch.zeros(2), torch.rand(2, 4))
    got = ops.transition_walk(*(a.to(DEV) if torch.is_tensor(a) else a for a in args))
    assert got[1][0, 0].tolist() == [5, 10, 20, 0]
    assert (got[0].cpu() == 5).all()


@pytest.mark.parametrize("splits", [2, 5, 16])
@pytest.mark.parametrize("use_transition", [False, True], ids=["u_only", "transition"])
def test_transition_walk_sliced_rows_equal_unsliced(splits, use_transition, monkeypatch):
    """Rows whose top-k pass runs in slices (forced with DSPINE_WALK_SPLITS; the heuristic slices
    only small batches) give the unsliced walk bitwise: the same candidates in the same order, so
    the same pair scores, tokens and probabilities. The vocabulary leaves an uneven last slice, and
    tied maxima straddle the slice borders (the lower ids must win across slices)."""
    batch, j_len, vocab, rank, top_k = 3, 6, 30011, 32, 8
    args = list(walk_case(batch, j_len, vocab, rank, top_k, "cpu", splits, [0.0, 1.0, 0.5],
                          dtype=torch.bfloat16, use_transition=use_transition))
    rows = args[0].view(batch * j_len, vocab)
    border = -(-vocab // splits)  # about where the first slice ends
    tied = [4, 7, 8, border - 4, border - 3, border + 5, border + 9, min(2 * border + 1, vocab - 2)]
    rows[0, tied + [vocab - 1]] = 40.0  # nine tied maxima: the highest id loses
    dev_args = [a.to(DEV) if torch.is_tensor(a) else a for a in args]
    monkeypatch.setenv("DSPINE_WALK_SPLITS", "1")
    want = ops.transition_walk(*dev_args)
    monkeypatch.setenv("DSPINE_WALK_SPLITS", str(splits))
    got = ops.transition_walk(*dev_args)
    assert want[1][0, 0].tolist() == tied
    for w, g in zip(want, got):
        assert torch.equal(w, g)


WALK_FLOOR_CASES = [
    # (batch, J, vocab, top_k, dtype): the top-k pass skips what falls below its warp's floor
    (32, 15, 151936, 8, torch.bfloat16),
    (1, 15, 49152, 16, torch.float32),
    (2, 3, 100003, 32, torch.float16),
    (2, 3, 65536, 16, torch.float16),  # 16-byte rows: fp16's packed scan
    (3, 4, 8191, 1, torch.bfloat16),
]


@pytest.mark.parametrize("splits", ["", "7"], ids=["planned", "sliced7"])
@pytest.mark.parametrize("case", WALK_FLOOR_CASES,
                         ids=[f"b{c[0]}_j{c[1]}_v{c[2]}_k{c[3]}_{str(c[4])[6:]}" for c in WALK_FLOOR_CASES])
def test_transition_walk_candidates_exact_with_ties_nan_and_inf(case, splits, monkeypatch):
    """The candidates are the reference's exactly (value order, ties to the lower id, NaN never)
    with more tied maxima than top_k spread over the whole row (every warp and lane), NaNs beside
    large values (a whole 16-byte group of NaN, seven NaN beside the row's maximum: the packed
    compares against the floor must never mark them), and a row of -inf but for a few ids (the
    rest of its list is tied -inf); as planned (small batches run sliced rows) and with every row
    in 7 slices (their merge sees empty entries of a row of NaN and tied -inf entries from several
    slices)."""
    monkeypatch.setenv("DSPINE_WALK_SPLITS", splits)
    batch, j_len, vocab, top_k, dtype = case
    g = torch.Generator().manual_seed(vocab + top_k)
    logits = torch.randn(batch, j_len, vocab, generator=g).to(dtype)
    rows = logits.view(batch * j_len, vocab)
    tied = torch.arange(vocab - 1, 0, -max(1, vocab // (3 * top_k + 5)))
    rows[0, tied] = 30.0
    if len(rows) > 1:
        rows[-1, torch.randint(0, vocab, (40,), generator=g)] = float("nan")
        rows[-1, torch.randint(0, vocab, (top_k,), generator=g)] = 25.0
        group = vocab // 2 // 8 * 8  # two aligned groups of eight: all NaN, and NaN around the maximum
        rows[-1, group:group + 16] = float("nan")
        rows[-1, group + 13] = 26.0
    if len(rows) > 2:
        rows[len(rows) // 2] = float("-inf")
        rows[len(rows) // 2, torch.randint(0, vocab, (max(1, top_k // 2),), generator=g)] = 0.0
    empty = torch.empty(0, dtype=dtype)
    args = (logits, empty, empty, empty, torch.randint(0, vocab, (batch,), generator=g), top_k,
            torch.zeros(batch), torch.rand(batch, j_len, generator=g))
    want = ops.transition_walk_ref(*args)
    assert want[1].view(-1, top_k)[0].tolist() == sorted(tied.tolist())[:top_k]
    got = ops.transition_walk(*(a.to(DEV) if torch.is_tensor(a) else a for a in args))
    for w, x in zip(want, got):
        assert torch.equal(x.cpu(), w)


VERIFY_CASES = [
    # (batch, T, vocab, cand, dtype)
    (5, 16, 1000, 1, torch.float32),
    (5, 16, 257, 8, torch.float32),
    (5, 1, 500, 1, torch.float32),
    (5, 5, 64, 4, torch.float32),
    (6, 16, 4096, 8, torch.float16),
    (8, 16, 151936, 8, torch.float32),
    (32, 16, 151936, 1, torch.bfloat16),
]


def _set_filters(args, kind):
    """verify_case mixes top-k 0/5/50 and top-p 1/0.9/0.5; also try a large top-k and none."""
    args = list(args)
    batch = args[0].shape[0]
    if kind == "large_k":
        args[5] = torch.full((batch,), 1000, dtype=torch.int32)
        args[6] = torch.full((batch,), 0.95)
    elif kind == "none":
        args[5] = torch.zeros(batch, dtype=torch.int32)
        args[6] = torch.ones(batch)
    return tuple(args)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("filters", ["mixed", "large_k", "none"])
@pytest.mark.parametrize("case", VERIFY_CASES, ids=[f"b{c[0]}_t{c[1]}_v{c[2]}_k{c[3]}_{str(c[4])[6:]}"
                                                    for c in VERIFY_CASES])
def test_block_verify(case, filters, seed):
    batch, t_len, vocab, cand, dtype = case
    if vocab > 100000 and seed > 0:
        pytest.skip("one seed is enough for the large-vocabulary reference (slow on the CPU)")
    temps = [[0.0, 1.0, 0.7, 0.0, 1.3][b % 5] for b in range(batch)]
    args = _set_filters(verify_case(batch, t_len, vocab, cand, "cpu", seed, temps, dtype=dtype), filters)
    dev_args = tuple(a.to(DEV) for a in args)
    got, flips = same_up_to_boundary(ops.block_verify, ops.block_verify_ref, dev_args, args, 7,
                                     verify_equal)
    assert flips <= 1
    check_verify_invariants(got, args[1])


def test_block_verify_greedy_accepts_exact_prefix():
    logits = torch.full((1, 4, 10), -5.0)
    for j, tok in enumerate([3, 7, 2, 9]):
        logits[0, j, tok] = 5.0
    draft = torch.tensor([[3, 7, 5]])
    args = (logits, draft, draft[..., None], torch.ones(1, 3, 1), torch.zeros(1),
            torch.zeros(1, dtype=torch.int32), torch.ones(1), torch.rand(1, 4))
    accept, out = ops.block_verify(*(a.to(DEV) for a in args))
    assert int(accept[0]) == 2 and out[0].tolist() == [3, 7, 2, -1]


GREEDY_SPLIT_CASES = [
    # (batch, T, vocab, dtype): on an H200 1 to 19 CTAs read a row (verify.cuh, verify_splits);
    # vocabularies that are not a multiple of 8 take the unvectorised loads.
    (1, 16, 151936, torch.bfloat16),
    (32, 17, 151936, torch.bfloat16),
    (3, 16, 49152, torch.float32),
    (2, 5, 100003, torch.float16),
    (4, 16, 8191, torch.bfloat16),
    (1, 1, 151936, torch.float32),
]


@pytest.mark.parametrize("case", GREEDY_SPLIT_CASES,
                         ids=[f"b{c[0]}_t{c[1]}_v{c[2]}_{str(c[3])[6:]}" for c in GREEDY_SPLIT_CASES])
def test_block_verify_greedy_rows_read_in_slices(case):
    """Greedy rows are read by several CTAs a row: every argmax, accept length and bonus must be
    the reference's exactly, with the maximum tied at ids spread over all slices (the lowest id
    wins), NaNs in several slices (the first one wins), an all -inf row (id 0), and drafts that
    follow the target's argmax for a while before they leave it."""
    batch, t_len, vocab, dtype = case
    g = torch.Generator().manual_seed(vocab + 7 * batch + t_len)
    logits = torch.randn(batch, t_len, vocab, generator=g).to(dtype)
    rows = logits.view(batch * t_len, vocab)
    tied = torch.arange(vocab - 1, 0, -max(1, vocab // 13))
    rows[0, tied] = 30.0
    if len(rows) > 1:
        rows[-1, torch.tensor([vocab - 2, vocab // 2, vocab // 3 + 1])] = float("nan")
    if len(rows) > 2:
        rows[len(rows) // 2] = float("-inf")
    want = logits.float().argmax(-1)  # torch.argmax: first NaN, then first maximum
    assert int(want.view(-1)[0]) == int(tied.min())
    assert len(rows) < 2 or int(want.view(-1)[-1]) == vocab // 3 + 1
    assert len(rows) < 3 or int(want.view(-1)[len(rows) // 2]) == 0
    follow = torch.randint(0, t_len, (batch,), generator=g)  # drafts that match the argmax
    draft = torch.randint(0, vocab, (batch, t_len - 1), generator=g)
    for b in range(batch):
        n = int(follow[b])
        draft[b, :n] = want[b, :min(n, t_len - 1)]
    args = (logits, draft, draft[..., None], torch.ones(batch, t_len - 1, 1), torch.zeros(batch),
            torch.zeros(batch, dtype=torch.int32), torch.ones(batch), torch.rand(batch, t_len, generator=g))
    ref_accept, ref_out = ops.block_verify_ref(*args)
    for _ in range(2):  # the arrival counters start from zero on every call
        accept, out = ops.block_verify(*(a.to(DEV) for a in args))
        assert torch.equal(accept.cpu(), ref_accept) and torch.equal(out.cpu(), ref_out)


def _threshold_rows(vocab, gen):
    """(logits row, temperature, top_k, top_p) cases for the sampled rows' two threshold searches:
    candidates gathered under a bound, or radix passes where no bound keeps them few."""
    flat = torch.randn(vocab, generator=gen) * 3
    ranks = torch.randperm(vocab, generator=gen).float() + 1
    peaked = -2.0 * torch.log(ranks) + 0.5 * torch.randn(vocab, generator=gen)  # p ~ 1 / rank^2
    cluster = flat.clone()
    cluster[vocab // 3:vocab // 3 + 700] = float(flat.max()) + 1  # 700 tied maxima: the gather overflows
    ties = torch.randint(-4, 5, (vocab,), generator=gen).float()  # ties at every threshold
    holes = flat.clone()
    holes[torch.randint(0, vocab, (vocab // 20,), generator=gen)] = float("nan")
    holes[torch.randint(0, vocab, (50,), generator=gen)] = float("-inf")
    return [(flat, 1.0, 1, 1.0), (flat, 1.0, 50, 1.0), (flat, 1.0, 128, 1.0), (flat, 1.0, 129, 1.0),
            (flat, 0.7, 50, 0.9), (flat, 1.0, 0, 0.9),
            (peaked, 1.0, 0, 0.9), (peaked, 1.0, 0, 0.5), (peaked, 0.8, 0, 0.95), (peaked, 1.0, 40, 0.9),
            (cluster, 1.0, 50, 1.0), (cluster, 1.0, 0, 0.9),
            (ties, 1.0, 20, 1.0), (ties, 1.0, 100, 0.8),
            (holes, 1.0, 50, 0.9), (holes, 1.3, 0, 0.7)]


@pytest.mark.parametrize("vocab,dtype", [(151936, torch.float32), (151936, torch.bfloat16), (300, torch.float32)])
def test_block_verify_threshold_search_equals_radix_passes(vocab, dtype, monkeypatch):
    """The sampled rows' top-k / top-p thresholds from gathered candidates (a bound from the chunk
    maxima or from probability levels) are the radix passes' exactly (DSPINE_VERIFY_RADIX=1: top-k's
    8-bit per-warp passes, top-p's 11-bit CTA-wide ones), on
    flat and peaked rows, rows whose gather overflows, ties at the threshold, NaN and -inf, and a
    vocabulary smaller than the gather. Each sequence probes one token at the edge of the kept set:
    its draft with q = 1 and u = 0 is accepted iff p(token) > 0. At T = 1 without top-p the kept
    set must also be the reference's exactly."""
    gen = torch.Generator().manual_seed(vocab)
    seqs = []  # (row, temperature, top_k, top_p, probed token, kept by the reference)
    for row, temp, top_k, top_p in _threshold_rows(vocab, gen):
        row = row.to(dtype)
        kept = ops.sampling_probs_ref(row, temp, top_k, top_p) > 0
        order = torch.argsort(torch.nan_to_num(row.float(), nan=-math.inf), descending=True)
        kept_ids = order[kept[order]]
        dropped_ids = order[~kept[order] & ~torch.isnan(row.float()[order])]
        for tok in kept_ids[-2:].tolist() + dropped_ids[:2].tolist():
            seqs.append((row, temp, top_k, top_p, tok, bool(kept[tok])))
    n = len(seqs)
    logits = torch.stack([s[0] for s in seqs])[:, None].expand(n, 2, vocab).contiguous()
    probe = torch.tensor([[s[4]] for s in seqs])
    args = (logits, probe, probe[..., None], torch.ones(n, 1, 1), torch.tensor([s[1] for s in seqs]),
            torch.tensor([s[2] for s in seqs], dtype=torch.int32), torch.tensor([s[3] for s in seqs]),
            torch.stack([torch.zeros(n), torch.rand(n, generator=gen)], 1))
    dev_args = [a.to(DEV) for a in args]
    got = {}
    for radix in ("1", "0"):
        monkeypatch.setenv("DSPINE_VERIFY_RADIX", radix)
        got[radix] = [t.cpu() for t in ops.block_verify(*dev_args)]
    assert torch.equal(got["0"][0], got["1"][0]) and torch.equal(got["0"][1], got["1"][1])
    check_verify_invariants(got["0"], probe)
    accepted = (got["0"][0] == 1).tolist()
    exact = [i for i, s in enumerate(seqs) if s[1] == 1.0 and s[3] == 1.0]
    assert exact and [accepted[i] for i in exact] == [seqs[i][5] for i in exact]


# --------------------------------------------------------------------------------------------
# CUDA graph capture
# --------------------------------------------------------------------------------------------

class _Pipeline:
    """Every op once, on static device buffers (what an engine captures per batch size)."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        bf = torch.bfloat16
        self.x = torch.randn(16, 4096, generator=g).to(bf).to(DEV)
        self.res = torch.randn(16, 4096, generator=g).to(bf).to(DEV)
        self.w = torch.randn(4096, generator=g).to(bf).to(DEV)
        self.cs = ops.rope_cos_sin(128, 8192, 1e6).to(DEV)
        self.pos = torch.arange(4000, 4016, dtype=torch.int32, device=DEV)
        self.slots = torch.arange(4000, 4016, dtype=torch.int32, device=DEV)
        self.kv_in = torch.randn(16, 2, 128, generator=g).to(bf).to(DEV)
        pages = 4096 // 16 * 2
        self.kc = torch.randn(pages, 16, 2, 128, generator=g).to(bf).to(DEV)
        self.vc = torch.randn(pages, 16, 2, 128, generator=g).to(bf).to(DEV)
        self.tables = torch.arange(pages, dtype=torch.int32, device=DEV).view(2, -1)
        self.kv_lens = torch.tensor([4016, 3000], dtype=torch.int32, device=DEV)
        self.cu_q = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
        self.q = torch.randn(2, 8, 128, generator=g).to(bf).to(DEV)
        self.h = torch.randn(1, 16, 4096, generator=g).to(bf).to(DEV)
        self.fproj = torch.randn(1, 16, 8192, generator=g).to(bf).to(DEV)
        walk = walk_case(4, 15, 5000, 64, 8, "cpu", seed, [0.0, 1.0, 0.0, 0.6], dtype=bf)
        self.walk = [a.to(DEV) if torch.is_tensor(a) else a for a in walk]
        self.verify = [a.to(DEV) for a in verify_case(4, 16, 5000, 8, "cpu", seed, [0.0, 1.0, 0.0, 0.6])]

    def buffers(self):
        fixed = [self.x, self.res, self.w, self.kv_in, self.kc, self.vc, self.q, self.h, self.fproj]
        return fixed + [a for a in self.walk + self.verify if torch.is_tensor(a)]

    def run(self):
        normed = ops.rms_norm(self.x, self.w, 1e-6)
        added, summed = ops.add_rms_norm(self.x, self.res, self.w, 1e-6)
        roped = ops.rope(self.kv_in, self.pos, self.cs)
        ops.write_kv(self.kv_in, self.kv_in, self.pos, self.cs, self.kc, self.vc, self.slots)
        attn = ops.paged_attention(self.q, self.kc, self.vc, self.tables, self.kv_lens, self.cu_q, 1,
                                   True, 0, 0.088)
        injected = ops.fused_injection(self.h, self.h, self.fproj)
        walked = ops.transition_walk(*self.walk)
        verified = ops.block_verify(*self.verify)
        return (normed, added, summed, roped, attn, injected) + tuple(walked) + tuple(verified)


def test_ops_under_cuda_graph_capture():
    static = _Pipeline(seed=0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static.run()  # warm-up outside the capture (allocator, kernel attributes)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = static.run()

    for seed in (1, 2):
        fresh = _Pipeline(seed)
        for dst, src in zip(static.buffers(), fresh.buffers()):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        eager = fresh.run()
        for got, want in zip(captured, eager):
            if want.is_floating_point():
                assert torch.allclose(got.float(), want.float(), rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(got, want)
        assert torch.equal(static.kc, fresh.kc) and torch.equal(static.vc, fresh.vc)
