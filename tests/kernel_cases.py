"""Random inputs for the kernel tests, shared by the CPU tests and the GPU tests.

Every case is drawn fresh (seeded per test for reproducibility of a failure, different across
parametrisations); outputs of the kernels are compared with the references in dspine_engine.ops.
"""
from __future__ import annotations

import math
import random

import torch


def paged_layout(kv_lens, page_size, num_pages_extra=3, gen=None, device="cpu", page_runs=1):
    """A shuffled page assignment for sequences of the given lengths (pages are not in order, so
    wrong page arithmetic shows). page_runs > 1 shuffles runs of 1..page_runs consecutive pages
    instead of single pages, as an allocator that hands out ascending runs leaves them (the sm90
    kernel loads a key tile on consecutive pages by TMA, any other by cp.async).
    Returns (block_tables [b, max_pages] int32, total_pages)."""
    max_pages = max(1, max(math.ceil(n / page_size) for n in kv_lens))
    need = sum(math.ceil(n / page_size) for n in kv_lens)
    total = need + num_pages_extra
    if page_runs > 1:
        cuts, start = [], 0
        while start < total:
            length = int(torch.randint(1, page_runs + 1, (1,), generator=gen))
            cuts.append(list(range(start, min(start + length, total))))
            start += length
        perm = [page for i in torch.randperm(len(cuts), generator=gen).tolist() for page in cuts[i]]
    else:
        perm = torch.randperm(total, generator=gen).tolist()
    tables = torch.full((len(kv_lens), max_pages + 1), -1, dtype=torch.int32)
    it = iter(perm)
    for b, n in enumerate(kv_lens):
        for i in range(math.ceil(n / page_size)):
            tables[b, i] = next(it)
    return tables.to(device), total


def attention_case(q_lens, kv_lens, q_heads, kv_heads, head_dim, page_size, dtype, device,
                   seed):
    gen = torch.Generator().manual_seed(seed)
    tables, pages = paged_layout(kv_lens, page_size, gen=gen)
    k_cache = torch.randn(pages, page_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(pages, page_size, kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(sum(q_lens), q_heads, head_dim, generator=gen).to(dtype)
    cu_q = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    kv = torch.tensor(kv_lens, dtype=torch.int32)
    to = dict(device=device)
    return (q.to(**to), k_cache.to(**to), v_cache.to(**to), tables.to(**to), kv.to(**to),
            cu_q.to(**to), max(q_lens))


def free_pages_outside_window(tables, kv_lens, q_lens, page_size, window):
    """Marks pages no query can see as freed (-1), as the draft's sliding window does."""
    tables = tables.clone()
    for b, (n, q) in enumerate(zip(kv_lens, q_lens)):
        first_pos = n - q
        lo = max(0, first_pos - window + 1)
        for i in range(lo // page_size):
            tables[b, i] = -1
    return tables


def poison_unseen_keys(k_cache, v_cache, tables, kv_lens, q_lens, page_size, window):
    """Copies of the caches with NaN in every slot no query sees (other sequences' free pages,
    the tail of a last page, keys before the window): a kernel that reads one, even at zero
    weight, shows NaN."""
    seen = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for b, (n, q) in enumerate(zip(kv_lens, q_lens)):
        lo = max(0, n - q - window + 1) if window > 0 else 0
        for k in range(lo, n):
            seen[int(tables[b, k // page_size]), k % page_size] = True
    return tuple(c.masked_fill(~seen[:, :, None, None], float("nan")) for c in (k_cache, v_cache))


def verify_case(batch, t_len, vocab, cand, device, seed, temperatures, dtype=torch.float32,
                peaked=True):
    """Logits where drafts agree with the target often enough to exercise long accepts."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, t_len, vocab, generator=gen) * 2
    if peaked:
        logits[..., : vocab // 8] += 3.0  # concentrate mass so draws of drafts are accepted
    draft = torch.randint(0, vocab // 8, (batch, max(t_len - 1, 0)), generator=gen)
    # Greedy rows: make a random prefix of the drafts equal to the argmax.
    for b in range(batch):
        keep = random.Random(seed + b).randint(0, t_len - 1)
        for j in range(keep):
            logits[b, j, draft[b, j]] = logits[b, j].max() + 1.0
    cand_ids = torch.randint(0, vocab, (batch, max(t_len - 1, 0), cand), generator=gen)
    cand_ids[..., 0] = draft
    cand_probs = torch.rand(batch, max(t_len - 1, 0), cand, generator=gen)
    cand_probs = cand_probs / cand_probs.sum(-1, keepdim=True)
    temp = torch.tensor(temperatures, dtype=torch.float32)
    top_k = torch.tensor([random.Random(seed * 7 + b).choice([0, 0, 5, 50]) for b in range(batch)],
                         dtype=torch.int32)
    top_p = torch.tensor([random.Random(seed * 11 + b).choice([1.0, 1.0, 0.9, 0.5])
                          for b in range(batch)], dtype=torch.float32)
    uniforms = torch.rand(batch, t_len, generator=gen)
    args = (logits.to(dtype), draft, cand_ids, cand_probs, temp, top_k, top_p, uniforms)
    return tuple(a.to(device) for a in args)


def walk_case(batch, j_len, vocab, rank, top_k, device, seed, temperatures, dtype=torch.float32,
              use_transition=True):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, j_len, vocab, generator=gen) * 3).to(dtype)
    if use_transition:
        g = torch.randn(batch, j_len, rank, generator=gen).to(dtype)
        pred = (torch.randn(vocab, rank, generator=gen) * 0.3).to(dtype)
        succ = (torch.randn(vocab, rank, generator=gen) * 0.3).to(dtype)
    else:
        g = pred = succ = torch.empty(0, dtype=dtype)
    anchor = torch.randint(0, vocab, (batch,), generator=gen)
    temp = torch.tensor(temperatures, dtype=torch.float32)
    uniforms = torch.rand(batch, j_len, generator=gen)
    args = (logits, g, pred, succ, anchor, top_k, temp, uniforms)
    return tuple(a.to(device) if torch.is_tensor(a) else a for a in args)


def rel_err(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "output has NaN/inf"
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def cu_seqlens(lens, device="cpu"):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32,
                        device=device)


def gdn_case(lens, hk, hv, dk, dv, num_slots, dtype, device, seed, ring_len=0):
    """Inputs of the gated delta rule for sequences of `lens` tokens. q, k, v, a, b are strided
    row views of one fused projection (as the model slices them); every sequence gets a distinct
    random slot, and the last sequence is padding (slot -1) when there are several. Rings start
    poisoned with NaN."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    cols = [hk * dk, hk * dk, hv * dv, hv, hv]
    edges = [0] + torch.tensor(cols).cumsum(0).tolist()
    proj = torch.randn(n, edges[-1] + 3, generator=gen).to(dtype=dtype, device=device)  # +3: padded rows
    q, k, v, a, b = (proj[:, lo:hi] for lo, hi in zip(edges[:-1], edges[1:]))
    slots = torch.randperm(num_slots, generator=gen)[:len(lens)].to(torch.int32)
    if len(lens) > 1:
        slots[-1] = -1
    case = dict(q=q.view(n, hk, dk), k=k.view(n, hk, dk), v=v.view(n, hv, dv), a=a, b=b,
                A_log=torch.empty(hv).uniform_(1, 16, generator=gen).log().to(device),
                dt_bias=(torch.randn(hv, generator=gen) * 0.5).to(device),
                state=(torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.1).to(device),
                state_slots=slots.to(device), cu_q=cu_seqlens(lens, device), max_q_len=max(lens))
    if ring_len:
        f32 = dict(dtype=torch.float32, device=device)
        case.update(ring_k=torch.full((num_slots, ring_len, hk, dk), float("nan"), **f32),
                    ring_u=torch.full((num_slots, ring_len, hv, dv), float("nan"), **f32),
                    ring_g=torch.full((num_slots, ring_len, hv), float("nan"), **f32))
    return case


GDN_INPUTS = ("q", "k", "v", "a", "b", "A_log", "dt_bias")


def gdn_args(case, *names):
    return tuple(case[n] for n in names)


def conv_case(lens, channels, kernel, width, num_slots, dtype, device, seed):
    """Inputs of causal_conv1d: a strided x (a column slice of a wider projection), windows of
    random past inputs, shuffled slots and a padding sequence (slot -1) when there are several."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(lens)
    x = torch.randn(n, channels + 5, generator=gen).to(dtype=dtype, device=device)[:, 2:2 + channels]
    weight = (torch.randn(channels, kernel, generator=gen) * 0.5).to(dtype=dtype, device=device)
    state = torch.randn(num_slots, width, channels, generator=gen).to(dtype=dtype, device=device)
    slots = torch.randperm(num_slots, generator=gen)[:len(lens)].to(torch.int32)
    if len(lens) > 1:
        slots[-1] = -1
    return x, weight, state, slots.to(device), cu_seqlens(lens, device), max(lens)


def decode_one_by_one(case, state, accepted, blk, step):
    """Plain decode of the first accepted[b] tokens of each block of `case` (sequence b owns
    rows b*blk..): one token per sequence and call, ``step(step_case, state)``."""
    device = case["q"].device
    for t in range(blk):
        live = [b for b in range(len(accepted)) if t < int(accepted[b])]
        if not live:
            break
        rows = torch.tensor([b * blk + t for b in live], dtype=torch.long, device=device)
        one = {name: case[name][rows] for name in ("q", "k", "v", "a", "b")}
        one.update(A_log=case["A_log"], dt_bias=case["dt_bias"], max_q_len=1,
                   state_slots=case["state_slots"][live],
                   cu_q=cu_seqlens([1] * len(live), device))
        step(one, state)
