"""The CPU kernels on an fp16 KV cache under fp32 activations (the GGUF path's cache), on fresh
random inputs: attention against the reference and, bit for bit, against the same kernel on the
cache widened to fp32 (the widening, F16C or scalar, is exact); the row property lossless
speculation rests on; KV writes rounded once, as torch's ``.half()``; the mixes refused."""
import math

import pytest
import torch

from dspine_engine import ops
from kernel_cases import attention_case, free_pages_outside_window, poison_unseen_keys, rel_err
from test_kernels_cpu import (ATTN_ISAS, ATTN_SHAPES, LONG_SHAPES,
                              assert_block_rows_equal_decoding_alone,
                              assert_sequences_alone_equal_the_batch, long_case)


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def half_caches(kc, vc):
    return kc.half(), vc.half()


def shaped_case(case, seed):
    """ATTN_SHAPES[case] with fp32 queries and an fp16 cache whose unseen slots hold NaN."""
    q_lens, kv_lens, hq, hkv, d, ps, causal, window = ATTN_SHAPES[case]
    q, kc, vc, bt, kl, cu, mq = attention_case(q_lens, kv_lens, hq, hkv, d, ps, torch.float32,
                                               "cpu", seed=seed)
    if window > 0:
        bt = free_pages_outside_window(bt, kv_lens, q_lens, ps, window)
    kh, vh = poison_unseen_keys(*half_caches(kc, vc), bt, kv_lens, q_lens, ps, window)
    return q, kh, vh, bt, kl, cu, mq, causal, window, 1 / math.sqrt(d)


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("case", range(len(ATTN_SHAPES)))
def test_fp16_cache_attention_matches_the_reference(case, isa, monkeypatch):
    """Odd head dims (the portable step), windows, page size 1; unseen slots are NaN."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q, kh, vh, bt, kl, cu, mq, causal, window, scale = shaped_case(case, 200 + case)
    out = ops.paged_attention(q, kh, vh, bt, kl, cu, mq, causal, window, scale)
    clean = (kh.nan_to_num(), vh.nan_to_num())  # the reference gathers whole pages
    ref = ops.paged_attention_ref(q, *clean, bt, kl, cu, mq, causal, window, scale)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("case", range(len(ATTN_SHAPES)))
def test_fp16_cache_is_the_widened_cache_bitwise(case, isa, monkeypatch):
    """Widening a chunk's fp16 rows (F16C under the SIMD steps) is exact and the rest of the
    step is the fp32 kernel's: the output equals the fp32 kernel on ``cache.float()``."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q, kh, vh, bt, kl, cu, mq, causal, window, scale = shaped_case(case, 300 + case)
    out = ops.paged_attention(q, kh, vh, bt, kl, cu, mq, causal, window, scale)
    wide = ops.paged_attention(q, kh.float(), vh.float(), bt, kl, cu, mq, causal, window, scale)
    assert torch.equal(out, wide)


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("case", range(len(LONG_SHAPES)))
def test_fp16_cache_long_rows_match_and_do_not_depend_on_the_threads(case, isa, monkeypatch):
    """Segments split over threads or folded in one item, batched or alone: the same bits, and
    the reference's values; NaN in every unseen slot reaches nothing."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q_lens, kv_lens = LONG_SHAPES[case][:2]
    q, kc, vc, bt, kl, cu, mq, causal, window = long_case(LONG_SHAPES[case], torch.float32,
                                                          500 + case)
    kh, vh = half_caches(kc, vc)
    ref = ops.paged_attention_ref(q, kh, vh, bt, kl, cu, mq, causal, window, 0.125)
    kp, vp = poison_unseen_keys(kh, vh, bt, kv_lens, q_lens, 16, window)
    for t in (1, 2):
        torch.set_num_threads(t)
        out = ops.paged_attention(q, kp, vp, bt, kl, cu, mq, causal, window, 0.125)
        assert rel_err(out, ref) < 1e-5, f"{t} threads"
    assert_sequences_alone_equal_the_batch(q, kp, vp, bt, kl, cu, mq, q_lens, causal, window,
                                           (1, 2))


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("n,context,window", [(16, 70, 0), (5, 33, 0), (16, 90, 20),
                                              (7, 40, 5), (16, 1000, 0), (9, 1300, 513)])
def test_fp16_cache_block_rows_equal_decoding_them_one_by_one(n, context, window, isa,
                                                              monkeypatch):
    """Greedy speculative == autoregressive with an fp16 cache: a verify block's row is bit for
    bit the row decoded alone (on 1 and 2 threads, long rows split into segments)."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q, kc, vc, bt, kl, cu, mq = attention_case([n], [context + n], 9, 3, 64, 16, torch.float32,
                                               "cpu", seed=17 + n + window)
    if window > 0:
        bt = free_pages_outside_window(bt, [context + n], [n], 16, window)
    assert_block_rows_equal_decoding_alone(q, *half_caches(kc, vc), bt, n, context, window)


@pytest.mark.parametrize("poisoned", ["value", "key"])
def test_a_seen_nan_in_an_fp16_cache_reaches_the_output(poisoned):
    q, kc, vc, bt, kl, cu, mq = attention_case([4], [1100], 9, 3, 64, 16, torch.float32, "cpu",
                                               seed=6)
    kh, vh = half_caches(kc, vc)
    bad = 600
    (kh if poisoned == "key" else vh)[int(bt[0, bad // 16]), bad % 16] = float("nan")
    full = ops.paged_attention(q, kh, vh, bt, kl, cu, mq, True, 0, 0.125)
    assert torch.isnan(full).all()
    windowed = ops.paged_attention(q, kh, vh, bt, kl, cu, mq, True, 498, 0.125)
    assert torch.isnan(windowed[:2]).all() and torch.isfinite(windowed[2:]).all()


# Values whose fp16 rounding is a case of its own: the largest half, one that rounds to inf,
# overflow, a tie rounding to even (2049 -> 2048, 2051 -> 2052), a subnormal, an underflow to 0,
# -0, infinities and NaN.
SPECIAL = [65504.0, 65520.0, 1e5, -1e5, 2049.0, 2051.0, 6e-8, 1e-9, -0.0, float("inf"),
           float("-inf"), float("nan")]


def kv_rows(n, heads, d, seed):
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(n, heads, d, generator=gen), torch.randn(n, heads, d, generator=gen) * 100
    v.view(-1)[:len(SPECIAL)] = torch.tensor(SPECIAL)
    return k, v


def same_bits(a, b) -> bool:
    """Equal bit patterns (NaN included), for fp16 tensors."""
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def nan_caches(count, pages, page_size, heads, d, dtype):
    return [torch.full((pages, page_size, heads, d), float("nan"), dtype=dtype)
            for _ in range(count)]


@pytest.mark.parametrize("rotate", [True, False])
@pytest.mark.parametrize("heads,d", [(3, 64), (2, 130), (1, 6)])
def test_write_kv_into_an_fp16_cache_rounds_once(heads, d, rotate):
    """Values (and unrotated keys) are the reference's bits: fp32 rows rounded to nearest even,
    as torch's ``.half()``. Rotated keys are the fp32 kernel's rotation rounded once (the
    kernel and the reference rotate in fp32 with different operation fusing, so the reference's
    keys can differ in the fp32 ulp that rounding to fp16 keeps one time in thousands: they
    stay within one fp16 ulp of it). Padding rows write nothing."""
    n, page_size, pages = 41, 16, 6
    cs = ops.rope_cos_sin(d, 4096, 10000.0) if rotate else torch.empty(0)
    k, v = kv_rows(n, heads, d, seed=d + heads)
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::6] = -1
    got_k, got_v, ref_k, ref_v = nan_caches(4, pages, page_size, heads, d, torch.float16)
    wide_k, wide_v = nan_caches(2, pages, page_size, heads, d, torch.float32)
    ops.write_kv(k, v, pos, cs, got_k, got_v, slots)
    ops.write_kv_ref(k, v, pos, cs, ref_k, ref_v, slots)
    ops.write_kv(k, v, pos, cs, wide_k, wide_v, slots)
    assert same_bits(got_v, ref_v) and same_bits(got_v, wide_v.half())
    assert same_bits(got_k, wide_k.half())
    if not rotate:
        assert same_bits(got_k, ref_k)
    ulp = torch.finfo(torch.float16).eps * ref_k.float().abs().nan_to_num(0).clamp(min=1e-4)
    assert ((got_k.float() - ref_k.float()).nan_to_num(0).abs() <= ulp).all()
    assert torch.equal(torch.isnan(got_k), torch.isnan(ref_k)), "wrote a slot it was not given"


def test_rope_write_kv_into_an_fp16_cache_is_rope_then_write_kv():
    """The fused op on an fp16 cache: rope(q) in fp32, bitwise the fp32-cache call's, and the
    cache write_kv's bits; refused input writes nothing."""
    n, hq, hkv, d, page_size, pages = 23, 9, 3, 64, 16, 4
    cs = ops.rope_cos_sin(d, 512, 10000.0)
    qkv = torch.randn(n, hq + 2 * hkv, d)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    pos = torch.randint(0, 512, (n,), dtype=torch.int32)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::4] = -1
    got_k, got_v, want_k, want_v = nan_caches(4, pages, page_size, hkv, d, torch.float16)
    wide_k, wide_v = nan_caches(2, pages, page_size, hkv, d, torch.float32)
    out = ops.rope_write_kv(q, k, v, pos, cs, got_k, got_v, slots)
    assert out.dtype == torch.float32
    assert torch.equal(out, ops.rope_write_kv(q, k, v, pos, cs, wide_k, wide_v, slots))
    ops.write_kv(k, v, pos, cs, want_k, want_v, slots)
    assert same_bits(got_k, want_k) and same_bits(got_v, want_v)
    before = got_k.clone()
    with pytest.raises(RuntimeError, match="cos/sin table"):
        ops.rope_write_kv(q, k, v, pos + 512, cs, got_k, got_v, slots)
    assert same_bits(got_k, before), "a refused call wrote the cache"


def test_mixed_dtypes_other_than_fp16_under_fp32_are_refused():
    q, kc, vc, bt, kl, cu, mq = attention_case([3], [20], 4, 2, 64, 16, torch.float32, "cpu", 1)
    kh, vh = half_caches(kc, vc)
    attend = ops.paged_attention
    with pytest.raises(RuntimeError, match="cache dtype BFloat16 does not fit q dtype Float"):
        attend(q, kc.bfloat16(), vc.bfloat16(), bt, kl, cu, mq, True, 0, 0.125)
    with pytest.raises(RuntimeError, match="cache dtype Half does not fit q dtype BFloat16"):
        attend(q.bfloat16(), kh, vh, bt, kl, cu, mq, True, 0, 0.125)
    with pytest.raises(RuntimeError, match="cache dtype Float does not fit q dtype Half"):
        attend(q.half(), kc, vc, bt, kl, cu, mq, True, 0, 0.125)
    with pytest.raises(RuntimeError, match="k and v cache dtypes differ"):
        attend(q, kh, vc, bt, kl, cu, mq, True, 0, 0.125)
    k = torch.randn(2, 2, 64)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="write_kv: cache dtype Half does not fit k/v dtype"):
        ops.write_kv(k.bfloat16(), k.bfloat16(), slots, torch.empty(0), kh, vh, slots)
    with pytest.raises(RuntimeError, match="write_kv: k and v cache dtypes differ"):
        ops.write_kv(k, k, slots, torch.empty(0), kh, vc, slots)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_refuses_an_fp16_cache_under_fp32():
    """The CUDA kernels have one element type per call: the mix the CPU runs is an error there,
    before any launch, for the attention and both KV writes."""
    q, kc, vc, bt, kl, cu, mq = attention_case([3], [20], 4, 2, 64, 16, torch.float32, "cuda", 1)
    kh, vh = half_caches(kc, vc)
    with pytest.raises(RuntimeError, match="fp16 cache under fp32 q runs on the CPU only"):
        ops.paged_attention(q, kh, vh, bt, kl, cu, mq, True, 0, 0.125)
    k, pos = q[:, :2].contiguous(), torch.arange(3, dtype=torch.int32, device="cuda")
    cs = ops.rope_cos_sin(64, 64, 10000.0, device="cuda")
    with pytest.raises(RuntimeError, match="fp16 cache under fp32 k/v runs on the CPU only"):
        ops.write_kv(k, k, pos, cs, kh, vh, pos)
    with pytest.raises(RuntimeError, match="fp16 cache under fp32 k/v runs on the CPU only"):
        ops.rope_write_kv(q, k, k, pos, cs, kh, vh, pos)
