"""Inputs and comparison helpers for the GPU kernel tests (extends kernel_cases.py).

The CUDA kernels run on device tensors; the references of dspine_engine.ops run on CPU copies of
the same inputs (in fp32 internally), so a kernel is never compared with itself.
"""
from __future__ import annotations

import torch

from kernel_cases import free_pages_outside_window, paged_layout


def to_cpu(args):
    return tuple(a.cpu() if torch.is_tensor(a) else a for a in args)


def visible_key_range(kv_len, n_q, causal, window):
    """Keys some query of the sequence can see: [lo, kv_len)."""
    first_pos = kv_len - n_q
    lo = max(0, first_pos - window + 1) if window > 0 else 0
    return lo, kv_len


def attention_inputs(q_lens, kv_lens, q_heads, kv_heads, head_dim, page_size, dtype, device, seed,
                     causal=True, window=0, q_row_pad=0, page_runs=1):
    """A paged attention case whose caches hold NaN at every key no query can see.

    Pages are shuffled (in runs of 1..page_runs consecutive pages: paged_layout); pages wholly
    outside the window are marked -1 in the block table (the kernel must never read them); slots past kv_len, below the window and in unused pages are NaN,
    so a kernel that reads one produces NaN. ``q_row_pad`` > 0 makes q a row view of a wider
    projection (stride(0) = q_heads * head_dim + q_row_pad elements), as a fused QKV output is.
    Returns (kernel_args, reference_args): device tensors, and CPU tensors with NaN replaced by 0
    (the reference gathers page 0 for masked keys and would otherwise multiply NaN by zero)."""
    gen = torch.Generator().manual_seed(seed)
    tables, pages = paged_layout(kv_lens, page_size, gen=gen, page_runs=page_runs)
    shape = (pages, page_size, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    for b, (n, kv) in enumerate(zip(q_lens, kv_lens)):
        lo, hi = visible_key_range(kv, n, causal, window)
        pos = torch.arange(lo, hi)
        pg = tables[b, pos // page_size].long()
        k_cache[pg, pos % page_size] = torch.randn(len(pos), kv_heads, head_dim, generator=gen)
        v_cache[pg, pos % page_size] = torch.randn(len(pos), kv_heads, head_dim, generator=gen)
    if window > 0:
        tables = free_pages_outside_window(tables, kv_lens, q_lens, page_size, window)
    n_tok = sum(q_lens)
    wide = torch.randn(n_tok, q_heads * head_dim + q_row_pad, generator=gen)
    q = wide[:, : q_heads * head_dim].view(n_tok, q_heads, head_dim)
    cu_q = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    kv = torch.tensor(kv_lens, dtype=torch.int32)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    q_dev = wide.to(dtype).to(device)[:, : q_heads * head_dim].view(n_tok, q_heads, head_dim)
    kernel_args = (q_dev, k_cache.to(device), v_cache.to(device), tables.to(device), kv.to(device),
                   cu_q.to(device), max(q_lens))
    ref_args = (q.to(dtype), k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0), tables, kv, cu_q,
                max(q_lens))
    return kernel_args, ref_args


def graph_table_width(kv_lens, page_size):
    """Pages per block-table row as the engine's graphs capture them: the model's context plus a
    block (SmolLM2's 8192 positions; a 32k model's for cases longer than that)."""
    context = 8192 if max(kv_lens) <= 8192 else 32768
    return (context + 16) // page_size + 1


def with_table_width(kernel_args, ref_args, width):
    """Both argument tuples of attention_inputs with block tables exactly ``width`` pages wide.

    Added columns point at a page that is all NaN, so a kernel reading past kv_len fails. Only
    unused (-1) columns may be cut: a table narrower than its sequences' pages is a different
    input, not a wider one (the kernel reads keys without a page as zeros), which is how a
    negative F.pad once cut a 12000-key case to 8224 keys without a word (issue 12)."""
    tables, k_cache = ref_args[3], kernel_args[1]
    if width < tables.shape[1]:
        if (tables[:, width:] >= 0).any():
            raise ValueError(f"a table {width} pages wide cannot hold these sequences' pages")
        tables = tables[:, :width]
    used = set(tables.flatten().tolist())
    nan_page = next(p for p in range(k_cache.shape[0]) if p not in used)
    assert torch.isnan(k_cache[nan_page].float()).all()
    tables = torch.nn.functional.pad(tables, (0, width - tables.shape[1]), value=nan_page)
    dev_tables = tables.to(kernel_args[3].device)
    return (kernel_args[:3] + (dev_tables,) + kernel_args[4:],
            ref_args[:3] + (tables,) + ref_args[4:])


def rel_err_fp32(got, ref):
    """Relative error of a device result against an fp32 reference; NaN/inf never pass."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(got).all(), "output has NaN/inf"
    return float((got - ref).norm() / ref.norm().clamp_min(1e-12))


def same_up_to_boundary(kernel, reference, dev_args, cpu_args, u_index, compare, delta=1e-4):
    """Sampling decisions may flip where a uniform sits within float rounding of a boundary.

    Runs the kernel on the device arguments and the reference on their CPU copies; a sequence
    that differs is accepted only if nudging its uniforms by +-delta makes the reference agree.
    Returns the kernel's outputs (on the CPU) and the number of accepted flips."""
    got = tuple(t.cpu() for t in kernel(*dev_args))
    ref = reference(*cpu_args)
    bad = [b for b in range(cpu_args[0].shape[0]) if not compare(got, ref, b)]
    for b in bad:
        ok = False
        for sign in (-1, 1):
            nudged = list(cpu_args)
            u = nudged[u_index].clone()
            u[b] = (u[b] + sign * delta).clamp(0, 1 - 1e-7)
            nudged[u_index] = u
            ok = ok or compare(got, reference(*nudged), b)
        assert ok, f"sequence {b} differs from the reference beyond a rounding boundary"
    return got, len(bad)


def walk_equal(got, ref, b):
    return (torch.equal(got[0][b], ref[0][b]) and torch.equal(got[1][b], ref[1][b])
            and torch.allclose(got[2][b], ref[2][b], atol=1e-5))


def verify_equal(got, ref, b):
    return int(got[0][b]) == int(ref[0][b]) and torch.equal(got[1][b], ref[1][b])


def check_verify_invariants(got, draft):
    """Structure of block_verify outputs, independent of the reference."""
    accept, out = got
    t_len = out.shape[1]
    for b in range(out.shape[0]):
        n = int(accept[b])
        assert 0 <= n <= t_len - 1
        assert torch.equal(out[b, :n], draft[b, :n].cpu())
        assert out[b, n] >= 0 and (out[b, n + 1:] == -1).all()
