"""CPU kernels against the PyTorch references on fresh random inputs."""
import math

import pytest
import torch

from dspine_engine import ops
from kernel_cases import (attention_case, free_pages_outside_window, poison_unseen_keys, rel_err,
                          verify_case, walk_case)

DEV = "cpu"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows,d", [(1, 64), (7, 576), (33, 130)])
def test_rms_norm(rows, d, dtype, tol):
    x = torch.randn(rows, d).to(dtype)
    w = torch.randn(d).to(dtype)
    assert rel_err(ops.rms_norm(x, w, 1e-5), ops.rms_norm_ref(x, w, 1e-5)) < tol
    r = torch.randn(rows, d).to(dtype)
    out, s = ops.add_rms_norm(x, r, w, 1e-6)
    ref_out, ref_s = ops.add_rms_norm_ref(x, r, w, 1e-6)
    assert rel_err(s, ref_s) < tol and rel_err(out, ref_out) < tol


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows,inter", [(1, 1536), (7, 65), (33, 8), (2, 4000)])
def test_silu_mul(rows, inter, dtype, tol):
    """The gated MLP's activation against silu(gate) * up in fp32; far tails (exp overflowing
    to inf) give 0 or x, never NaN; a strided view (a column slice) reads its own values."""
    x = (4 * torch.randn(rows, 2 * inter)).to(dtype)
    x[0, :3] = torch.tensor([-120.0, 120.0, 0.0])
    got = ops.silu_mul(x)
    assert got.shape == (rows, inter) and got.dtype == dtype
    assert rel_err(got, ops.silu_mul_ref(x)) < tol
    assert got[0, 0] == 0 and got[0, 2] == 0
    wide = torch.randn(rows, 2 * inter + 3).to(dtype)[:, 3:]
    assert rel_err(ops.silu_mul(wide), ops.silu_mul_ref(wide)) < tol


def test_silu_mul_rejects_bad_shapes():
    with pytest.raises(RuntimeError, match=r"silu_mul: x must be \[rows, 2 \* inter\]"):
        ops.silu_mul(torch.randn(3, 7))
    with pytest.raises(RuntimeError, match=r"silu_mul: x must be \[rows, 2 \* inter\]"):
        ops.silu_mul(torch.randn(8))
    with pytest.raises(RuntimeError, match="silu_mul: x must be a floating tensor"):
        ops.silu_mul(torch.ones(2, 4, dtype=torch.int32))


@pytest.mark.parametrize("heads,d", [(9, 64), (3, 128), (2, 256)])
def test_rope_and_write_kv(heads, d):
    n, page_size, pages = 37, 16, 8
    cs = ops.rope_cos_sin(d, 4096, 10000.0)
    x = torch.randn(n, heads * 2, d)[:, :heads]  # a strided view, like a split projection
    pos = torch.randint(0, 4096, (n,), dtype=torch.int32)
    assert rel_err(ops.rope(x, pos, cs), ops.rope_ref(x, pos, cs)) < 1e-6

    k, v = torch.randn(n, heads, d), torch.randn(n, heads, d)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::5] = -1  # padding rows must not be written
    caches = [torch.full((pages, page_size, heads, d), float("nan")) for _ in range(4)]
    ops.write_kv(k, v, pos, cs, caches[0], caches[1], slots)
    ops.write_kv_ref(k, v, pos, cs, caches[2], caches[3], slots)
    written = slots[slots >= 0].long()
    for got, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        flat_g, flat_r = got.view(-1, heads, d), ref.view(-1, heads, d)
        assert rel_err(flat_g[written], flat_r[written]) < 1e-6
        untouched = torch.ones(pages * page_size, dtype=torch.bool)
        untouched[written] = False
        assert torch.isnan(flat_g[untouched]).all(), "write_kv wrote a slot it was not given"


def test_rope_write_kv_is_rope_then_write_kv():
    """The fused op returns rope(q) and writes what write_kv writes (padding rows skipped, no
    other slot touched); bad input is refused before any cache is written."""
    n, hq, hkv, d, page_size, pages = 23, 9, 3, 64, 16, 4
    cs = ops.rope_cos_sin(d, 512, 10000.0)
    qkv = torch.randn(n, hq + 2 * hkv, d)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]  # row views, as in a layer
    pos = torch.randint(0, 512, (n,), dtype=torch.int32)
    slots = torch.randperm(pages * page_size)[:n].to(torch.int32)
    slots[::4] = -1
    got_k, got_v, ref_k, ref_v = (torch.full((pages, page_size, hkv, d), float("nan")) for _ in range(4))
    out = ops.rope_write_kv(q, k, v, pos, cs, got_k, got_v, slots)
    ref = ops.rope_write_kv_ref(q, k, v, pos, cs, ref_k, ref_v, slots)
    assert out.shape == (n, hq, d) and rel_err(out, ref) < 1e-6
    for got, want in ((got_k, ref_k), (got_v, ref_v)):
        assert torch.equal(torch.isnan(got), torch.isnan(want)), "wrote a slot it was not given"
        assert rel_err(got.nan_to_num(), want.nan_to_num()) < 1e-6
    norms = torch.rand(2, d) + 0.5
    out = ops.rope_write_kv(q, k, v, pos, cs, got_k, got_v, slots, norms[0], norms[1], 1e-6)
    ref = ops.rope_write_kv_ref(q, k, v, pos, cs, ref_k, ref_v, slots, norms[0], norms[1], 1e-6)
    assert rel_err(out, ref) < 1e-6 and rel_err(got_k.nan_to_num(), ref_k.nan_to_num()) < 1e-6
    # rope and write_kv apart take the norms too: rms_norm first, exactly
    assert torch.equal(ops.rope(q, pos, cs, norms[0], 1e-6), ops.rope(ops.rms_norm(q, norms[0], 1e-6), pos, cs))
    apart_k, apart_v = torch.full_like(got_k, float("nan")), torch.full_like(got_v, float("nan"))
    ops.write_kv(k, v, pos, cs, apart_k, apart_v, slots, norms[1], 1e-6)
    assert torch.equal(apart_k.nan_to_num(), got_k.nan_to_num())
    with pytest.raises(RuntimeError, match="write_kv: a head norm"):
        ops.write_kv(k, v, pos, cs, apart_k, apart_v, slots, norms[1].double(), 1e-6)
    with pytest.raises(RuntimeError, match="head norm must be a contiguous"):
        ops.rope_write_kv(q, k, v, pos, cs, got_k, got_v, slots, norms[0, :-1])
    with pytest.raises(RuntimeError, match="needs a cos/sin table"):
        ops.rope_write_kv(q, k, v, pos, torch.empty(0), got_k, got_v, slots)
    with pytest.raises(RuntimeError, match="q must be"):
        ops.rope_write_kv(q[:-1], k, v, pos, cs, got_k, got_v, slots)
    before = got_k.clone()
    with pytest.raises(RuntimeError, match="cos/sin table"):
        ops.rope_write_kv(q, k, v, pos + 512, cs, got_k, got_v, slots)
    assert torch.equal(got_k.nan_to_num(), before.nan_to_num()), "a refused call wrote the cache"


@pytest.mark.parametrize("heads,d", [(3, 64), (2, 130)])
def test_rope_gradient_is_the_references(heads, d):
    """The draft's training forward backpropagates through the RoPE kernel: its gradient (the inverse
    rotation, by the same kernel) equals autograd's through the reference."""
    n = 29
    cs = ops.rope_cos_sin(d, 512, 10000.0)
    x = torch.randn(n, heads * 2, d)[:, :heads].clone().requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    pos = torch.randint(0, 512, (n,), dtype=torch.int32)
    weight = torch.randn(n, heads, d)  # a loss that weighs every output differently
    (ops.trainable_rope(x, pos, cs) * weight).sum().backward()
    (ops.rope_ref(x_ref, pos, cs) * weight).sum().backward()
    assert torch.isfinite(x.grad).all() and rel_err(x.grad, x_ref.grad) < 1e-6
    assert rel_err(x.grad, weight) > 1e-2  # the gradient is rotated, not passed through


def test_write_kv_rejects_slot_outside_cache():
    k = torch.randn(2, 1, 8)
    cache = torch.zeros(1, 4, 1, 8)
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.write_kv(k, k, torch.zeros(2, dtype=torch.int32), torch.empty(0), cache, cache.clone(),
                     torch.tensor([0, 9], dtype=torch.int32))


@pytest.mark.parametrize("bad", [8, 9, -1])
def test_rope_refuses_positions_outside_the_table(bad):
    """The kernels used to read past the cos/sin table silently; now it is an error (as in the
    reference), and only for rows that would read it: padding rows of write_kv never do."""
    cs = ops.rope_cos_sin(8, 8, 10000.0)  # positions 0..7
    x = torch.randn(3, 2, 8)
    pos = torch.tensor([0, bad, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="outside the cos/sin table"):
        ops.rope(x, pos, cs)
    with pytest.raises(IndexError):
        ops.rope_ref(x, pos, cs)
    cache = torch.zeros(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="outside the cos/sin table"):
        ops.write_kv(x, x, pos, cs, cache, cache.clone(), torch.tensor([0, 1, 2], dtype=torch.int32))
    padding = torch.tensor([0, -1, 2], dtype=torch.int32)
    got = [torch.zeros(1, 4, 2, 8) for _ in range(4)]
    ops.write_kv(x, x, pos, cs, got[0], got[1], padding)
    ops.write_kv_ref(x, x, pos, cs, got[2], got[3], padding)
    torch.testing.assert_close(got[0], got[2])
    assert torch.equal(got[1], got[3])


ATTN_SHAPES = [
    # (q_lens, kv_lens, q_heads, kv_heads, head_dim, page_size, causal, window)
    ([5, 1, 17], [5, 40, 17], 9, 3, 64, 16, True, 0),            # prefill-ish varlen, GQA 3
    ([1, 1, 1], [1, 33, 100], 4, 4, 64, 8, True, 0),             # decode, MHA
    ([16, 16], [16 + 50, 16 + 3], 8, 2, 128, 16, True, 0),       # verify
    ([16, 16], [16 + 50, 16 + 70], 8, 2, 128, 16, False, 0),     # draft (bidirectional)
    ([16, 16], [16 + 90, 16 + 7], 6, 1, 64, 16, False, 20),      # draft + window
    ([13, 1], [77, 64], 4, 2, 256, 32, True, 9),                 # sliding causal, odd sizes
    ([3], [3], 2, 1, 64, 1, True, 0),                            # page size 1
]


# The attention's SIMD step on its AVX-512 and its AVX2 kernels, and its portable step
# ("scalar"); a level the CPU lacks runs the best one it has.
ATTN_ISAS = ["avx512", "avx2", "scalar"]


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("case", range(len(ATTN_SHAPES)))
def test_paged_attention(case, dtype, tol, isa, monkeypatch):
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q_lens, kv_lens, hq, hkv, d, ps, causal, window = ATTN_SHAPES[case]
    q, kc, vc, bt, kl, cu, mq = attention_case(q_lens, kv_lens, hq, hkv, d, ps, dtype, DEV,
                                               seed=100 + case)
    if window > 0:
        bt = free_pages_outside_window(bt, kv_lens, q_lens, ps, window)
    scale = 1 / math.sqrt(d)
    out = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, causal, window, scale)
    ref = ops.paged_attention_ref(q, kc, vc, bt, kl, cu, mq, causal, window, scale)
    assert rel_err(out, ref) < tol


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,context,window", [(16, 70, 0), (5, 33, 0), (16, 1, 0), (16, 90, 20),
                                              (16, 200, 37), (7, 40, 5), (16, 300, 64)])
def test_block_rows_equal_decoding_them_one_by_one(dtype, n, context, window, isa, monkeypatch):
    """Greedy speculative == autoregressive on the CPU rests on this: query i of a causal block
    (the target's verify) gets bit for bit what decoding it alone with the keys up to it gets.
    With a sliding window the block sees keys its first row's window starts at, a row alone only
    its own: the softmax's chunks must not move with that (they start at absolute positions)."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q, kc, vc, bt, kl, cu, mq = attention_case([n], [context + n], 9, 3, 64, 16, dtype, DEV,
                                               seed=7 + n + window)
    if window > 0:
        bt = free_pages_outside_window(bt, [context + n], [n], 16, window)
    block = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, window, 0.125)
    one = torch.tensor([0, 1], dtype=torch.int32)
    for i in range(n):
        alone = ops.paged_attention(q[i:i + 1].clone(), kc, vc, bt,
                                    torch.tensor([context + i + 1], dtype=torch.int32), one, 1,
                                    True, window, 0.125)
        assert torch.equal(alone[0], block[i]), f"query {i} of {n}"


@pytest.fixture(autouse=True)
def _restore_threads():
    """Tests here set torch's thread count (the kernels split work by it): each gets it back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def assert_sequences_alone_equal_the_batch(q, kc, vc, bt, kl, cu, mq, q_lens, causal, window,
                                           thread_counts):
    """Each sequence's rows computed alone, on each of ``thread_counts`` threads, equal them
    computed in the whole batch on 2 threads, bit for bit."""
    torch.set_num_threads(2)
    together = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, causal, window, 0.125)
    for t in thread_counts:
        torch.set_num_threads(t)
        for b, n in enumerate(q_lens):
            rows = slice(int(cu[b]), int(cu[b + 1]))
            alone = ops.paged_attention(q[rows].clone(), kc, vc, bt[b:b + 1].clone(),
                                        kl[b:b + 1].clone(), torch.tensor([0, n], dtype=torch.int32),
                                        n, causal, window, 0.125)
            assert torch.equal(alone, together[rows]), f"sequence {b}, {t} threads"


@pytest.mark.parametrize("isa", ATTN_ISAS)
def test_rows_do_not_depend_on_the_batch_or_the_threads(isa, monkeypatch):
    """A sequence's rows computed in a batch with others equal the sequence computed alone, on 1
    thread or 2 (alone on 2 threads a 16-query block is split into smaller query tiles)."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q_lens, kv_lens = [16, 1, 5, 16], [16 + 300, 200, 5, 16 + 40]
    q, kc, vc, bt, kl, cu, mq = attention_case(q_lens, kv_lens, 9, 3, 64, 16, torch.float32, DEV,
                                               seed=3)
    assert_sequences_alone_equal_the_batch(q, kc, vc, bt, kl, cu, mq, q_lens, True, 0, (1, 2))


# Long rows: keys cut into segments of 256 at absolute positions (csrc/cpu/attention_segments.h),
# folded in order; at batch 1 on 2 threads a row's segments run as separate work items.
# (q_lens, kv_lens, causal, window): odd lengths, many segments, windows across boundaries.
LONG_SHAPES = [
    ([1], [1037], True, 0),              # decode, 5 segments
    ([1], [2049], True, 0),              # decode, 9 segments, one key in the last
    ([1], [257], True, 0),               # one key past the first segment
    ([16], [16 + 1000], True, 0),        # verify
    ([1], [1500], True, 613),            # windowed decode: the window starts mid-segment
    ([16], [16 + 900], True, 300),       # windowed verify
    ([16, 1, 1], [16 + 777, 513, 1201], True, 0),  # a batch: few enough tiles to split
    ([16], [16 + 700], False, 260),      # draft block, bidirectional + window
]


def long_case(shape, dtype, seed):
    q_lens, kv_lens, causal, window = shape
    case = attention_case(q_lens, kv_lens, 9, 3, 64, 16, dtype, DEV, seed=seed)
    q, kc, vc, bt, kl, cu, mq = case
    if window > 0:
        bt = free_pages_outside_window(bt, kv_lens, q_lens, 16, window)
    return q, kc, vc, bt, kl, cu, mq, causal, window


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("case", range(len(LONG_SHAPES)))
def test_long_rows_match_the_reference_and_ignore_unseen_keys(case, dtype, tol, isa, monkeypatch):
    """Every slot no query sees holds NaN: none reaches the output."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q_lens, kv_lens = LONG_SHAPES[case][:2]
    q, kc, vc, bt, kl, cu, mq, causal, window = long_case(LONG_SHAPES[case], dtype, 40 + case)
    ref = ops.paged_attention_ref(q, kc, vc, bt, kl, cu, mq, causal, window, 0.125)
    kp, vp = poison_unseen_keys(kc, vc, bt, kv_lens, q_lens, 16, window)
    for t in (1, 2):
        torch.set_num_threads(t)
        out = ops.paged_attention(q, kp, vp, bt, kl, cu, mq, causal, window, 0.125)
        assert rel_err(out, ref) < tol, f"{t} threads"


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("case", range(len(LONG_SHAPES)))
def test_long_rows_do_not_depend_on_the_batch_or_the_threads(case, isa, monkeypatch):
    """1 thread folds a row's segments in one work item; 2 threads at batch 1 (from 455 keys of
    these heads) run them as separate items and fold afterwards; a batch has tiles enough not to
    split: the same arithmetic everywhere, so the same bits."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q_lens = LONG_SHAPES[case][0]
    q, kc, vc, bt, kl, cu, mq, causal, window = long_case(LONG_SHAPES[case], torch.float32, 60 + case)
    assert_sequences_alone_equal_the_batch(q, kc, vc, bt, kl, cu, mq, q_lens, causal, window,
                                           (1, 2, 1))


@pytest.mark.parametrize("isa", ATTN_ISAS)
def test_kernel_threads_split_rows_and_keep_the_bits(isa, monkeypatch):
    """ops.set_cpu_threads(2) with torch on one thread (an engine step on the GGUF path) splits
    long decode rows into segments as torch's 2 threads do: the bits of 1 thread either way."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    torch.set_num_threads(1)
    for case in (0, 1, 6):
        q, kc, vc, bt, kl, cu, mq, causal, window = long_case(LONG_SHAPES[case], torch.float32,
                                                              80 + case)
        one = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, causal, window, 0.125)
        try:
            ops.set_cpu_threads(2)
            split = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, causal, window, 0.125)
        finally:
            ops.set_cpu_threads(0)
        assert torch.equal(one, split), LONG_SHAPES[case]


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,context,window", [(16, 1000, 0), (16, 777, 300), (9, 1300, 513),
                                              (16, 2040, 0)])
def test_long_block_rows_equal_decoding_them_one_by_one(dtype, n, context, window, isa, monkeypatch):
    """A 16-query verify block is tiled (unsplit items); each row alone is a batch-1 decode
    (split into segments on 2 threads): bit for bit the same."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q, kc, vc, bt, kl, cu, mq = attention_case([n], [context + n], 9, 3, 64, 16, dtype, DEV,
                                               seed=11 + n + window)
    if window > 0:
        bt = free_pages_outside_window(bt, [context + n], [n], 16, window)
    assert_block_rows_equal_decoding_alone(q, kc, vc, bt, n, context, window)


def assert_block_rows_equal_decoding_alone(q, kc, vc, bt, n, context, window):
    """The causal block of ``n`` queries after ``context`` keys, on 2 threads; each of its rows
    decoded alone on 1 and on 2 threads: bit for bit the same."""
    torch.set_num_threads(2)
    block = ops.paged_attention(q, kc, vc, bt, torch.tensor([context + n], dtype=torch.int32),
                                torch.tensor([0, n], dtype=torch.int32), n, True, window, 0.125)
    one = torch.tensor([0, 1], dtype=torch.int32)
    for t in (1, 2):
        torch.set_num_threads(t)
        for i in range(n):
            alone = ops.paged_attention(q[i:i + 1].clone(), kc, vc, bt,
                                        torch.tensor([context + i + 1], dtype=torch.int32), one,
                                        1, True, window, 0.125)
            assert torch.equal(alone[0], block[i]), f"query {i} of {n}, {t} threads"


@pytest.mark.parametrize("isa", ATTN_ISAS)
@pytest.mark.parametrize("poisoned", ["value", "key"])
def test_a_seen_nan_reaches_the_output(poisoned, isa, monkeypatch):
    """A NaN in a key or value a row sees, in a middle segment, makes that row NaN however the
    segments are run (the fold never drops it); rows whose window ends before it stay finite."""
    monkeypatch.setenv("DSPINE_CPU_ISA", isa)
    q, kc, vc, bt, kl, cu, mq = attention_case([4], [1100], 9, 3, 64, 16, torch.float32, DEV, seed=5)
    bad = 600  # segment 2; a window of 498 starts at 599, 600, 601, 602 for the 4 queries
    cache = kc if poisoned == "key" else vc
    cache[int(bt[0, bad // 16]), bad % 16] = float("nan")
    for t in (1, 2):
        torch.set_num_threads(t)
        full = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.125)
        assert torch.isnan(full).all(), f"{t} threads"
        decode = ops.paged_attention(q[:1].clone(), kc, vc, bt, kl - 3,
                                     torch.tensor([0, 1], dtype=torch.int32), 1, True, 0, 0.125)
        assert torch.isnan(decode).all(), f"{t} threads, decode"
        windowed = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 498, 0.125)
        assert torch.isnan(windowed[:2]).all() and torch.isfinite(windowed[2:]).all()


def test_paged_attention_exact_and_prefill_flags_on_the_cpu():
    """The CPU sums every row one way already: exact=True and prefill=True are the same
    computation, bit for bit; the flags reach the op through its schema (keyword and position)
    and its fake."""
    q, kc, vc, bt, kl, cu, mq = attention_case([5, 1], [40, 23], 4, 2, 64, 16, torch.float32, DEV, 3)
    fast = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.125)
    assert torch.equal(ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.125, exact=True), fast)
    assert torch.equal(ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.125, exact=True, prefill=True),
                       fast)
    assert torch.equal(torch.ops.dspine.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.125, 0, True), fast)
    assert torch.equal(torch.ops.dspine.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.125, 0, True, True),
                       fast)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fq, fk, fv, fb, fl, fc = (mode.from_tensor(t) for t in (q, kc, vc, bt, kl, cu))
        assert ops.paged_attention(fq, fk, fv, fb, fl, fc, mq, True, 0, 0.125, exact=True,
                                   prefill=True).shape == q.shape


def test_paged_attention_rejects_bad_metadata():
    q, kc, vc, bt, kl, cu, mq = attention_case([4], [4], 2, 1, 64, 16, torch.float32, DEV, 0)
    with pytest.raises(RuntimeError, match="int32"):
        ops.paged_attention(q, kc, vc, bt.long(), kl, cu, mq, True, 0, 0.1)
    with pytest.raises(RuntimeError, match="more queries than keys"):
        ops.paged_attention(q, kc, vc, bt, kl - 2, cu, mq, True, 0, 0.1)


def test_paged_attention_refuses_a_too_narrow_block_table():
    """Issue 12 item 5: every table entry the kernel would index with is checked on the CPU (its
    lengths and table are on the host); a stated max_kv_len the table cannot hold is refused on
    both backends (the check CUDA can make without reading kv_lens)."""
    q, kc, vc, bt, kl, cu, mq = attention_case([1, 3], [40, 37], 4, 2, 64, 16, torch.float32, DEV, 0)
    want = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.1)
    assert torch.equal(ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.1, 40), want)
    narrow = bt[:, :2].contiguous()  # 32 keys of table for 40 and 37
    with pytest.raises(RuntimeError, match="too narrow: kv_len 40 of sequence 0"):
        ops.paged_attention(q, kc, vc, narrow, kl, cu, mq, True, 0, 0.1)
    with pytest.raises(RuntimeError, match="too narrow: 4 pages of 16 keys cannot hold max_kv_len = 65"):
        ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.1, 65)
    with pytest.raises(RuntimeError, match="exceeds max_kv_len = 39"):
        ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.1, 39)
    with pytest.raises(RuntimeError, match="max_kv_len must be >= 0"):
        ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, 0.1, -1)
    for bad in (-1, kc.shape[0]):  # freed, and past the pool, on a page the queries see
        holed = bt.clone()
        holed[1, 1] = bad
        with pytest.raises(RuntimeError, match=rf"block_tables\[1, 1\] = {bad} is not a page"):
            ops.paged_attention(q, kc, vc, holed, kl, cu, mq, True, 0, 0.1)
    # Below the window of every query a page may be freed: sequence 1's queries (positions
    # 34..36) see keys from 34 - 4 + 1 = 31 on, so its page 0 (keys 0..15) is never read.
    freed = bt.clone()
    freed[1, 0] = -1
    windowed = ops.paged_attention(q, kc, vc, freed, kl, cu, mq, True, 4, 0.1)
    assert torch.equal(windowed, ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 4, 0.1))
    freed[1, 1] = -1  # keys 16..31: 31 is visible
    with pytest.raises(RuntimeError, match=r"block_tables\[1, 1\] = -1 is not a page"):
        ops.paged_attention(q, kc, vc, freed, kl, cu, mq, True, 4, 0.1)


@pytest.mark.parametrize("shape", [(1, 16, 64), (3, 5, 576), (2, 16, 130)])
def test_fused_injection(shape):
    n, b, h = shape
    x, g, f = torch.randn(n, b, h), torch.randn(n, b, h), torch.randn(n, b, 2 * h)
    assert rel_err(ops.fused_injection(x, g, f), ops.fused_injection_ref(x, g, f)) < 1e-6


def _same_up_to_boundary(fn_kernel, fn_ref, args, u_index, compare, delta=1e-4):
    """Sampling decisions may flip where a uniform sits within float rounding of a boundary.
    Accept a mismatch only if nudging that sequence's uniforms reproduces the kernel's choice."""
    got, ref = fn_kernel(*args), fn_ref(*args)
    bad = [b for b in range(args[0].shape[0]) if not compare(got, ref, b)]
    for b in bad:
        ok = False
        for sign in (-1, 1):
            nudged = list(args)
            u = nudged[u_index].clone()
            u[b] = (u[b] + sign * delta).clamp(0, 1 - 1e-7)
            nudged[u_index] = u
            if compare(got, fn_ref(*nudged), b):
                ok = True
        assert ok, f"sequence {b} differs from the reference beyond a rounding boundary"
    return got, ref, len(bad)


def _verify_equal(got, ref, b):
    return int(got[0][b]) == int(ref[0][b]) and torch.equal(got[1][b].cpu(), ref[1][b].cpu())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("t_len,vocab,cand", [(16, 1000, 1), (16, 257, 8), (1, 500, 1), (5, 64, 4)])
def test_block_verify(seed, t_len, vocab, cand):
    temps = [0.0, 1.0, 0.7, 0.0, 1.3]
    args = verify_case(len(temps), t_len, vocab, cand, DEV, seed, temps)
    got, ref, flips = _same_up_to_boundary(ops.block_verify, ops.block_verify_ref, args, 7,
                                           _verify_equal)
    assert flips <= 1
    accept, out = got
    for b in range(len(temps)):  # structural invariants independent of the reference
        n = int(accept[b])
        assert 0 <= n <= t_len - 1
        assert (out[b, :n] == args[1][b, :n]).all()
        assert out[b, n] >= 0 and (out[b, n + 1:] == -1).all()


def test_block_verify_greedy_accepts_exact_prefix():
    logits = torch.full((1, 4, 10), -5.0)
    for j, tok in enumerate([3, 7, 2, 9]):
        logits[0, j, tok] = 5.0
    draft = torch.tensor([[3, 7, 5]])
    cid, cp = draft[..., None], torch.ones(1, 3, 1)
    accept, out = ops.block_verify(
        logits, draft, cid, cp, torch.zeros(1), torch.zeros(1, dtype=torch.int32),
        torch.ones(1), torch.rand(1, 4))
    assert int(accept[0]) == 2 and out[0].tolist() == [3, 7, 2, -1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_walk_reference_top_k_is_the_stable_sort(dtype):
    """The walk reference's top-k (which sorts only the entries at or above the k-th largest) gives
    the first k ids and values of a stable sort of the whole row on -x, on rows full of ties, NaN,
    +-inf and -0.0, k from 1 to past the row's length."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(400):
        vocab = int(torch.randint(1, 200, (1,), generator=gen))
        k = int(torch.randint(1, 40, (1,), generator=gen))
        x = torch.randint(-3, 4, (vocab,), generator=gen).float()
        kind = torch.rand(vocab, generator=gen)
        x[kind < 0.1] = math.nan
        x[(kind >= 0.1) & (kind < 0.15)] = -math.inf
        x[(kind >= 0.15) & (kind < 0.2)] = math.inf
        x[(kind >= 0.2) & (kind < 0.25)] = -0.0
        x = x.to(dtype)
        want = torch.sort(-x.float(), stable=True).indices[:k]
        values, ids = ops._topk_sorted(x, k)
        assert torch.equal(ids, want), (x, k)
        assert torch.equal(values.nan_to_num(99.0), x.float()[want].nan_to_num(99.0))


def _walk_equal(got, ref, b):
    return (torch.equal(got[0][b].cpu(), ref[0][b].cpu())
            and torch.equal(got[1][b].cpu(), ref[1][b].cpu())
            and torch.allclose(got[2][b].cpu(), ref[2][b].cpu(), atol=1e-5))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_transition", [True, False])
@pytest.mark.parametrize("j_len,vocab,rank,top_k", [(15, 1000, 32, 8), (3, 100, 7, 1), (15, 300, 16, 5)])
def test_transition_walk(seed, use_transition, j_len, vocab, rank, top_k):
    temps = [0.0, 1.0, 0.5]
    args = walk_case(len(temps), j_len, vocab, rank, top_k, DEV, seed, temps,
                     use_transition=use_transition)
    _same_up_to_boundary(ops.transition_walk, ops.transition_walk_ref, args, 7, _walk_equal)


@pytest.mark.parametrize("seed", range(3))
def test_transition_walk_with_bf16_tables_beside_fp32_logits(seed):
    """A quantised CPU draft keeps P and Q in bf16: the walk reads them beside fp32 logits and g
    and matches the reference computed from the same bf16 tables."""
    temps = [0.0, 1.0, 0.5]
    logits, g, pred, succ, *rest = walk_case(len(temps), 15, 1000, 32, 8, DEV, seed, temps)
    args = (logits, g, pred.bfloat16(), succ.bfloat16(), *rest)
    assert args[0].dtype == torch.float32
    _same_up_to_boundary(ops.transition_walk, ops.transition_walk_ref, args, 7, _walk_equal)


@pytest.mark.parametrize("logits_dtype,table_dtype", [
    (torch.float32, torch.float16),  # only bf16 tables beside fp32 logits
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.bfloat16),
])
def test_transition_walk_refuses_other_table_dtypes(logits_dtype, table_dtype):
    logits, g, pred, succ, *rest = walk_case(1, 3, 100, 8, 4, DEV, 0, [0.0])
    with pytest.raises(RuntimeError, match="tables must have the logits dtype"):
        ops.transition_walk(logits.to(logits_dtype), g.to(logits_dtype), pred.to(table_dtype),
                            succ.to(table_dtype), *rest)
    with pytest.raises(RuntimeError, match="tables must have the logits dtype"):  # P and Q differ
        ops.transition_walk(logits, g, pred.bfloat16(), succ, *rest)


def test_transition_changes_the_walk():
    """The pair term must matter: with strong tables the greedy chain differs from argmax U."""
    args = walk_case(1, 15, 200, 16, 8, DEV, 5, [0.0])
    logits, g, pred, succ = args[:4]
    strong = (logits * 0.01, g * 10, pred, succ) + args[4:]
    tokens = ops.transition_walk(*strong)[0]
    assert not torch.equal(tokens[0], strong[0][0].argmax(-1))


def _draft_layers_case(injection: bool, blocks: int, blk: int, ctx_rows: int, seed: int):
    """Random inputs of `ops.draft_layers` (2 layers of odd small sizes, Q4_1 tables) on a paged
    cache whose older keys hold random K/V and whose unused slots hold NaN."""
    from dspine_engine.models.quant_dense import quantize_weight

    gen = torch.Generator().manual_seed(seed)
    h, heads, kv_heads, hd, inter, page, layers = 96, 3, 1, 32, 160, 16, 2
    outs = [(heads * hd, h), (2 * kv_heads * hd, h), (h, heads * hd), (2 * inter, h), (h, inter),
            (2 * h, h), (2 * h, h)][:7 if injection else 5]
    weights = [quantize_weight(torch.randn(o, i, generator=gen) * 0.1, "q4_1").data
               for _ in range(layers) for o, i in outs]
    norms = [torch.rand(d, generator=gen) + 0.5 for _ in range(layers)
             for d in [h, hd, hd, h] + [h] * injection]
    base = torch.randint(ctx_rows, 40, (blocks,), generator=gen, dtype=torch.int32)
    pages = 8 * blocks
    tables = torch.randperm(pages, generator=gen).view(blocks, 8).to(torch.int32)

    def slots(pos):  # [blocks, n] positions -> slots
        return (tables.gather(1, (pos // page).long()) * page + pos % page).to(torch.int32)

    offs = torch.arange(blk, dtype=torch.int32)
    positions = base[:, None] + offs
    ctx_pos = base[:, None] - ctx_rows + torch.arange(ctx_rows, dtype=torch.int32)
    ctx_slots = slots(ctx_pos)
    ctx_slots[0, 0] = -1  # a padding row: written nowhere (the cache keeps its random K/V)
    caches = [torch.full((pages, page, kv_heads, hd), float("nan")) for _ in range(2 * layers)]
    old = torch.arange(int(base.max()), dtype=torch.int32)
    for b in range(blocks):  # keys before the context rows, and the padding row's
        s = slots(old[None].expand(blocks, -1))[b, :int(base[b]) - ctx_rows + 1]
        for c in caches:
            c.view(-1, kv_heads, hd)[s.long()] = torch.randn(len(s), kv_heads, hd, generator=gen)
    cos_sin = ops.rope_cos_sin(hd, 128, 10000.0)
    cu_q = torch.arange(0, blocks * blk + 1, blk, dtype=torch.int32)
    hidden, ctx = (torch.randn(rows, h, generator=gen) for rows in (blocks * blk, blocks * ctx_rows))
    return [hidden, ctx, torch.randn(blocks, h, generator=gen) if injection else torch.empty(0),
            weights, norms, "q4_1", heads, kv_heads, hd, inter, 1e-6, positions.view(-1),
            torch.cat([ctx_pos.view(-1), positions.view(-1)]),
            torch.cat([ctx_slots.view(-1), slots(positions).view(-1)]), cos_sin,
            caches[:layers], caches[layers:], tables, base + blk, cu_q, blk, 0, hd ** -0.5, 0]


def _with_caches(args):
    """``args`` with copies of its caches (each call writes its own)."""
    out = list(args)
    out[15], out[16] = [c.clone() for c in args[15]], [c.clone() for c in args[16]]
    return out


def _layers_of(args):
    """`draft_layers_loop`'s arguments from `draft_layers`' (the same Q4_1 tables as kernels)."""
    from functools import partial

    (hidden, ctx, anchor_f, weights, norms, fmt, heads, kv_heads, hd, inter, *rest) = args
    h = hidden.shape[1]
    outs = [heads * hd, 2 * kv_heads * hd, h, 2 * inter, h, 2 * h, 2 * h]
    nw, nn = (7, 5) if anchor_f.numel() else (5, 4)  # tables and norms a layer
    layers = [(tuple(partial(ops.quant_matmul, weight=w, format=fmt, out_features=o)
                     for w, o in zip(weights[i * nw:(i + 1) * nw], outs)),
               norms[i * nn:(i + 1) * nn]) for i in range(len(weights) // nw)]
    return [hidden, ctx, anchor_f, layers, heads, kv_heads, hd, inter, *rest]


@pytest.mark.parametrize("injection", [True, False])
@pytest.mark.parametrize("blocks,blk,ctx_rows", [(1, 4, 4), (2, 3, 5), (3, 7, 1)])
def test_draft_layers(injection, blocks, blk, ctx_rows):
    """One op for the draft's layer loop: bitwise the loop of kernels (states and caches), close
    to the references' loop, and a NaN in a key every query sees reaches every output."""
    args = _draft_layers_case(injection, blocks, blk, ctx_rows, seed=blocks * 10 + blk)
    fused, loop, ref = _with_caches(args), _layers_of(_with_caches(args)), _with_caches(args)
    got = ops.draft_layers(*fused)
    assert torch.equal(got, ops.draft_layers_loop(*loop))
    for a, b in zip(fused[15] + fused[16], loop[13] + loop[14]):  # (the loop has no lists)
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), "caches differ from the loop's"
    assert rel_err(got, ops.draft_layers_ref(*ref)) < 2e-2
    poisoned = _with_caches(args)
    poisoned[1] = poisoned[1].clone()
    poisoned[1][-1, 0] = float("nan")  # the last context row: a key of the last block
    out = ops.draft_layers(*poisoned).view(blocks, blk, -1)
    assert torch.isnan(out[-1]).all() and torch.isfinite(out[:-1]).all()
