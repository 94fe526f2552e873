#!/usr/bin/env python
"""Kernel benchmarks on one GPU, side by side in one process.

1. The card's ceilings: device-to-device copy bandwidth (read + write bytes) and bf16 matmul rate.
2. Paged attention (ours) vs torch SDPA (best of the cuDNN / flash / efficient backends) and
   FlexAttention (compiled, with the sliding-window / causal mask) on Qwen3-8B, Qwen3.8-27B and
   SmolLM2 attention shapes, every mode (decode, verify 16 causal, draft 16 bidirectional, causal
   prefill), contexts 1K-32K, window 8192 or none, batch 1/8/32. SDPA and Flex get contiguous
   (non-paged) K/V holding exactly the keys the queries can see: their natural input. Ours reads
   a paged cache (page size 16 unless --page-size says otherwise; pages shuffled, or in order with
   --page-order in-order, as a fresh prompt's pages come from the engine's pool).
3. The fused injection (5 layers, d=4096, block 16), alone and with its bf16 projections.
4. The transition walk and block verify at batch 32, V=151936, block 16 (every variant), and
   greedy at batch 1, V=49152 (the default model's c=1 round). --sampling-only: 3 and 4 alone.

Times are medians over CUDA-event timed runs with L2 flushed before each run (as in a real decode
step, where the other layers evict it). Writes benchmarks/results/kernels_<device>.json (or
--out DIR) and prints a markdown table.

    python benchmarks/kernel_bench.py [--quick] [--out DIR] [--sm90 auto|on|off|compare] [--exact]

--sm90 picks the paged attention kernel on Hopper (DSPINE_ATTN_SM90; the engine's default is off):
auto (the batch-dependent heuristic),
on / off (the wgmma kernel wherever it applies / never), or compare: every attention row also
times ours with it off and on (ours_mma_us, ours_sm90_us; ours_us stays the heuristic's), so one
run measures before and after. --exact adds ours in the row-exact mode per row, both forms
(ours_exact_us: row tiles, the engine's default; ours_exact_ks_us: the key split).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from dspine_engine import ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import env_knobs, git_commit  # noqa: E402

BF16 = torch.bfloat16
PAGE = 16  # the engine's default page size; --page-size changes it for one run
PAGES_IN_ORDER = False  # --page-order in-order: each sequence's pages consecutive in the pool
# name: (q_heads, kv_heads, head_dim)
SHAPES = {"Qwen3-8B": (32, 8, 128), "Qwen3.8-27B": (24, 4, 256), "SmolLM2": (9, 3, 64)}
# mode: (queries per sequence (None: the whole context), causal)
MODES = {"decode": (1, True), "verify": (16, True), "draft": (16, False), "prefill": (None, True)}


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

class Timer:
    """Median time of a CUDA callable with L2 flushed before every timed run."""

    def __init__(self, iters: int):
        self.iters = iters
        self.flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, iters: int | None = None) -> float:
        iters = iters or self.iters
        fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3  # us


def measure_ceilings(timer: Timer) -> dict:
    n = 512 * 1024 * 1024  # 1 GiB of bf16
    src, dst = torch.randn(n, dtype=BF16, device="cuda"), torch.empty(n, dtype=BF16, device="cuda")
    copy_us = timer(lambda: dst.copy_(src), iters=20)
    del src, dst
    m = 8192
    a, b = torch.randn(m, m, dtype=BF16, device="cuda"), torch.randn(m, m, dtype=BF16, device="cuda")
    mm_us = timer(lambda: torch.matmul(a, b), iters=30)
    return {"copy_GBps": 2 * n * 2 / copy_us / 1e3, "bf16_matmul_TFLOPs": 2 * m ** 3 / mm_us / 1e6,
            "copy_bytes": 2 * n * 2, "matmul_shape": [m, m, m]}


# --------------------------------------------------------------------------------------------
# Attention configurations
# --------------------------------------------------------------------------------------------

@dataclass
class AttnConfig:
    shape: str
    mode: str
    ctx: int
    window: int
    batch: int
    flex: bool = False

    @property
    def q_len(self) -> int:
        return MODES[self.mode][0] or self.ctx

    @property
    def causal(self) -> bool:
        return MODES[self.mode][1]

    @property
    def key_len(self) -> int:
        """Keys some query can see (the union): what SDPA/Flex get and what ours reads."""
        return min(self.ctx, self.window + self.q_len - 1) if self.window > 0 else self.ctx

    def visible_pairs(self) -> int:
        total = 0
        for i in range(self.q_len):
            pos = self.ctx - self.q_len + i
            hi = pos + 1 if self.causal else self.ctx
            lo = max(0, pos - self.window + 1) if self.window > 0 else 0
            total += hi - lo
        return total


def sweep(quick: bool) -> list[AttnConfig]:
    cfgs: list[AttnConfig] = []

    def add(shape, modes, ctxs, batches, windows=(0,), flex_at=()):
        for mode in modes:
            for ctx in ctxs:
                for batch in (batches(ctx) if callable(batches) else batches):
                    for window in windows:
                        if window and ctx <= window:
                            continue  # the window changes nothing
                        flex = (mode, ctx, window, batch) in flex_at
                        cfgs.append(AttnConfig(shape, mode, ctx, window, batch, flex))

    blocks = ("decode", "verify", "draft")
    if quick:
        add("Qwen3-8B", blocks, (8192, 32768), (1, 8), (0, 8192),
            flex_at={("verify", 32768, 8192, 1), ("draft", 32768, 8192, 1)})
        add("Qwen3-8B", ("prefill",), (8192,), (1,))
        return cfgs
    # Flex compiles once per shape and mask (seconds each): a few representative points.
    flex_8b = {(m, 32768, 8192, 1) for m in MODES} | {("verify", 8192, 0, 8)}
    add("Qwen3-8B", blocks, (1024, 4096, 8192, 16384, 32768), lambda c: (1, 8, 32) if c <= 16384 else (1, 8),
        (0, 8192), flex_at=flex_8b)
    add("Qwen3-8B", ("prefill",), (1024, 4096, 8192, 16384, 32768), (1,), (0, 8192), flex_at=flex_8b)
    flex_27b = {("draft", 32768, 8192, 1)}
    add("Qwen3.8-27B", blocks, (4096, 8192, 32768), (1, 8), (0, 8192), flex_at=flex_27b)
    add("Qwen3.8-27B", ("prefill",), (4096, 8192, 16384), (1,), (0, 8192), flex_at=flex_27b)
    add("SmolLM2", blocks, (1024, 8192, 32768), lambda c: (1, 32) if c <= 8192 else (1,))
    add("SmolLM2", ("prefill",), (4096, 8192), (1,))
    return cfgs


def attention_flops(cfg: AttnConfig) -> float:
    hq, _, d = SHAPES[cfg.shape]
    return 4.0 * cfg.batch * cfg.visible_pairs() * hq * d


def attention_bytes(cfg: AttnConfig) -> float:
    """K/V the queries can see (read once) + Q + out, in bf16."""
    hq, hkv, d = SHAPES[cfg.shape]
    kv = 2 * cfg.batch * cfg.key_len * hkv * d
    qo = 2 * cfg.batch * cfg.q_len * hq * d
    return 2.0 * (kv + qo)


def ours_inputs(cfg: AttnConfig):
    hq, hkv, d = SHAPES[cfg.shape]
    pages_per_seq = math.ceil(cfg.ctx / PAGE)
    pool = cfg.batch * pages_per_seq
    k_cache = torch.randn(pool, PAGE, hkv, d, dtype=BF16, device="cuda")
    v_cache = torch.randn(pool, PAGE, hkv, d, dtype=BF16, device="cuda")
    order = torch.arange(pool, device="cuda") if PAGES_IN_ORDER else torch.randperm(pool, device="cuda")
    tables = order.to(torch.int32).view(cfg.batch, pages_per_seq)
    if cfg.window > 0:  # pages no query can see are freed, as the draft's window does
        first_visible = (cfg.ctx - cfg.key_len) // PAGE
        tables[:, :first_visible] = -1
    q = torch.randn(cfg.batch * cfg.q_len, hq, d, dtype=BF16, device="cuda")
    kv_lens = torch.full((cfg.batch,), cfg.ctx, dtype=torch.int32, device="cuda")
    cu_q = torch.arange(0, cfg.batch + 1, dtype=torch.int32, device="cuda") * cfg.q_len
    scale = 1 / math.sqrt(d)
    return lambda: ops.paged_attention(q, k_cache, v_cache, tables, kv_lens, cu_q, cfg.q_len, cfg.causal,
                                       cfg.window, scale)


def dense_mask(cfg: AttnConfig) -> torch.Tensor:
    """[q_len, key_len] bool: True where the query sees the key (bottom-right aligned)."""
    qpos = torch.arange(cfg.ctx - cfg.q_len, cfg.ctx, device="cuda")[:, None]
    kpos = torch.arange(cfg.ctx - cfg.key_len, cfg.ctx, device="cuda")[None, :]
    vis = kpos <= qpos if cfg.causal else torch.ones_like(kpos - qpos, dtype=torch.bool)
    if cfg.window > 0:
        vis = vis & (qpos - kpos < cfg.window)
    return vis


def contiguous_qkv(cfg: AttnConfig):
    hq, hkv, d = SHAPES[cfg.shape]
    q = torch.randn(cfg.batch, hq, cfg.q_len, d, dtype=BF16, device="cuda")
    k = torch.randn(cfg.batch, hkv, cfg.key_len, d, dtype=BF16, device="cuda")
    v = torch.randn(cfg.batch, hkv, cfg.key_len, d, dtype=BF16, device="cuda")
    return q, k, v


def sdpa_candidates(cfg: AttnConfig):
    """(label, callable) for every SDPA backend with the mask expressed as it supports best."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    f = torch.nn.functional.scaled_dot_product_attention
    q, k, v = contiguous_qkv(cfg)
    _, _, d = SHAPES[cfg.shape]
    group = q.shape[1] // k.shape[1]
    kw = dict(scale=1 / math.sqrt(d))
    if cfg.window > 0 and cfg.q_len > 1:
        if cfg.q_len * cfg.key_len > 16384 * 16384:
            return []  # a dense mask this large is not a fair input
        kw["attn_mask"] = dense_mask(cfg)
    elif cfg.causal and cfg.q_len > 1:
        if cfg.q_len == cfg.key_len:
            kw["is_causal"] = True
        else:
            kw["attn_mask"] = causal_lower_right(cfg.q_len, cfg.key_len)
    ke, ve = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    cands = []
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(backend=backend, gqa=True):
            with sdpa_kernel([backend]):
                if gqa:
                    return f(q, k, v, enable_gqa=True, **kw)
                return f(q, ke, ve, **kw)
        cands.append((name, run))
        cands.append((name + "+expanded-kv", lambda run=run: run(gqa=False)))
    return cands


_FLEX = None


def flex_callable(cfg: AttnConfig):
    global _FLEX
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _FLEX is None:
        torch._dynamo.config.cache_size_limit = 1024
        torch._dynamo.config.accumulated_cache_size_limit = 4096
        _FLEX = torch.compile(flex_attention, dynamic=False)
    q, k, v = contiguous_qkv(cfg)
    _, _, d = SHAPES[cfg.shape]
    offset, causal, window = cfg.key_len - cfg.q_len, cfg.causal, cfg.window

    def mask_mod(b, h, q_idx, kv_idx):
        qpos = q_idx + offset
        vis = kv_idx >= 0
        if causal:
            vis = vis & (kv_idx <= qpos)
        if window > 0:
            vis = vis & (qpos - kv_idx < window)
        return vis

    block_mask = create_block_mask(mask_mod, None, None, cfg.q_len, cfg.key_len, device="cuda")
    return lambda: _FLEX(q, k, v, block_mask=block_mask, enable_gqa=True, scale=1 / math.sqrt(d))


def best_sdpa(cfg: AttnConfig, timer: Timer):
    """(backend, us) of the fastest SDPA backend that runs this case; (None, None) if none does."""
    best = (None, None)
    for name, fn in sdpa_candidates(cfg):
        try:
            fn()
            torch.cuda.synchronize()
        except Exception:  # the backend does not support this shape or mask
            continue
        t = timer(fn)
        if best[1] is None or t < best[1]:
            best = (name, t)
    return best


SM90_ENV = {"auto": "auto", "on": "1", "off": "0"}  # unset = off (the default)


def set_sm90(mode: str | None) -> None:
    """DSPINE_ATTN_SM90 for the calls that follow (the binding reads it at every call)."""
    if mode is None:
        os.environ.pop("DSPINE_ATTN_SM90", None)
    else:
        os.environ["DSPINE_ATTN_SM90"] = mode


def sm90_launches() -> int:
    op = getattr(torch.ops.dspine, "attention_sm90_launches", None)
    return op() if op is not None else 0


# The row-exact mode's two forms (DSPINE_ATTN_EXACT): row tiles (the engine's default) and the
# key-split variant for every block of <= 16 tokens (attention.cuh, plan_exact_segments).
EXACT_FORMS = {"1": "ours_exact_us", "2": "ours_exact_ks_us"}


def timed_with_env(ours, timer: Timer, name: str, value: str) -> float:
    """Ours with the binding's knob ``name`` (read at every call) set to ``value``: a row-exact
    form (DSPINE_ATTN_EXACT: absolute key segments, what a row computed one way in every call
    costs against the default kernels) or a forced split count (DSPINE_ATTN_SPLITS)."""
    with env_knobs(**{name: value}):
        return timer(ours)


def bench_attention(cfg: AttnConfig, timer: Timer, ceilings: dict, sm90: str = "auto",
                    exact: bool = False, splits: list[int] | None = None) -> dict:
    row = asdict(cfg)
    row.update(q_len=cfg.q_len, key_len=cfg.key_len, flops=attention_flops(cfg), bytes=attention_bytes(cfg))
    ours = ours_inputs(cfg)
    before = sm90_launches()
    row["ours_us"] = timer(ours)
    row["ours_path"] = "sm90" if sm90_launches() > before else "mma"
    if sm90 == "compare":  # before/after in one run; the heuristic's choice stays in ours_us
        for mode, key in (("0", "ours_mma_us"), ("1", "ours_sm90_us")):
            set_sm90(mode)
            before = sm90_launches()
            t = timer(ours)
            row[key] = t if mode == "0" or sm90_launches() > before else None  # None: not applicable
        set_sm90("auto")
    if exact:
        for form, key in EXACT_FORMS.items():
            row[key] = timed_with_env(ours, timer, "DSPINE_ATTN_EXACT", form)
    if splits:  # the fast plan's split count against forced ones (issue 12: its floor of 8 keys a row)
        row["ours_forced_splits_us"] = {n: timed_with_env(ours, timer, "DSPINE_ATTN_SPLITS", str(n))
                                        for n in splits}
    torch.cuda.empty_cache()
    row["sdpa_backend"], row["sdpa_us"] = best_sdpa(cfg, timer)
    row["flex_us"] = None
    if cfg.flex:
        try:
            row["flex_us"] = timer(flex_callable(cfg))
        except Exception as exc:  # compile failures must not stop the sweep
            row["flex_error"] = f"{type(exc).__name__}: {exc}"[:200]
    torch.cuda.empty_cache()
    us = row["ours_us"]
    row["ours_TFLOPs"] = row["flops"] / us / 1e6
    row["ours_GBps"] = row["bytes"] / us / 1e3
    row["frac_bw"] = row["ours_GBps"] / ceilings["copy_GBps"]
    row["frac_mma"] = row["ours_TFLOPs"] / ceilings["bf16_matmul_TFLOPs"]
    alts = [t for t in (row["sdpa_us"], row["flex_us"]) if t is not None]
    row["speedup_vs_best_alt"] = min(alts) / us if alts else None
    return row


# --------------------------------------------------------------------------------------------
# Injection, transition walk, block verify
# --------------------------------------------------------------------------------------------

def bench_injection(timer: Timer) -> dict:
    hidden, block, layers = 4096, 16, 5
    dev = dict(dtype=BF16, device="cuda")
    h = torch.randn(1, block, hidden, **dev)
    f = torch.randn(1, block, hidden, **dev)
    gate_h, fproj = torch.randn(1, block, hidden, **dev), torch.randn(1, block, 2 * hidden, **dev)
    norm_w = torch.ones(hidden, **dev)
    w_gh = [torch.randn(hidden, hidden, **dev) * 0.02 for _ in range(layers)]
    w_fi = [torch.randn(2 * hidden, hidden, **dev) * 0.02 for _ in range(layers)]  # [W_gf; W_i]

    def full_round():
        x = h
        for layer in range(layers):
            g = torch.matmul(ops.rms_norm(x, norm_w, 1e-6), w_gh[layer].t())
            x = ops.fused_injection(x, g, torch.matmul(f, w_fi[layer].t()))
        return x

    fused_us = timer(lambda: ops.fused_injection(h, gate_h, fproj))
    full_us = timer(full_round)
    elem_bytes = 2 * (3 * block * hidden + 2 * block * hidden)  # h, gate_h, out + fproj
    return {"layers": layers, "hidden": hidden, "block": block, "fused_op_us": fused_us,
            "fused_op_GBps": elem_bytes / fused_us / 1e3, "fused_op_5_layers_us": layers * fused_us,
            "full_injection_5_layers_us": full_us, "paper_budget_us": 150.0,
            "weight_bytes_5_layers": layers * 3 * hidden * hidden * 2}


def bench_sampling(timer: Timer, ceilings: dict) -> list[dict]:
    """Issue 12's rows (batch 32, Qwen3's V = 151936, every variant) and the default model's
    batch-1 round (SmolLM2's V = 49152, greedy), where the launch's latency is what counts."""
    return (sampling_rows(timer, ceilings, 32, 151936, greedy_only=False)
            + sampling_rows(timer, ceilings, 1, 49152, greedy_only=True))


def sampling_rows(timer: Timer, ceilings: dict, batch: int, vocab: int, greedy_only: bool) -> list[dict]:
    block, rank, k = 16, 256, 8
    dev = dict(device="cuda")
    rows = []
    logits_w = torch.randn(batch, block - 1, vocab, dtype=BF16, **dev) * 3
    g = torch.randn(batch, block - 1, rank, dtype=BF16, **dev)
    pred = torch.randn(vocab, rank, dtype=BF16, **dev) * 0.3
    succ = torch.randn(vocab, rank, dtype=BF16, **dev) * 0.3
    anchor = torch.randint(0, vocab, (batch,), **dev)
    u_w = torch.rand(batch, block - 1, **dev)
    walk_bytes = logits_w.numel() * 2
    for name, temp in (("greedy", 0.0), ("sampled T=1", 1.0))[:1 if greedy_only else 2]:
        t = torch.full((batch,), temp, **dev)
        us = timer(lambda: ops.transition_walk(logits_w, g, pred, succ, anchor, k, t, u_w))
        rows.append({"op": "transition_walk", "variant": name, "us": us, "GBps": walk_bytes / us / 1e3,
                     "frac_bw": walk_bytes / us / 1e3 / ceilings["copy_GBps"], "goal_us": 50.0})
    rows.append({"op": "torch.topk (reference point)", "variant": f"k={k}",
                 "us": timer(lambda: torch.topk(logits_w, k, dim=-1)), "goal_us": None})

    logits_v = torch.randn(batch, block, vocab, dtype=BF16, **dev) * 2
    draft = torch.randint(0, vocab, (batch, block - 1), **dev)
    cand_ids = torch.randint(0, vocab, (batch, block - 1, k), **dev)
    cand_ids[..., 0] = draft
    cand_probs = torch.softmax(torch.randn(batch, block - 1, k, **dev), -1)
    u_v = torch.rand(batch, block, **dev)
    verify_bytes = logits_v.numel() * 2
    # A language model's row at T = 1 is peaked, not flat: p ~ 1 / rank^2 (top token ~0.6, ten
    # tokens ~0.94), ranks shuffled over the vocabulary, with noise.
    ranks = torch.argsort(torch.rand(batch, block, vocab, **dev), dim=-1).float() + 1
    peaked = (-2.0 * torch.log(ranks) + 0.5 * torch.randn(batch, block, vocab, **dev)).to(BF16)
    del ranks
    mixed = peaked.clone()  # a batch's high-entropy positions: one row in eight flat
    mixed[:, ::8] = logits_v[:, ::8]
    variants = (("greedy", 0.0, 0, 1.0, logits_v), ("sampled T=1", 1.0, 0, 1.0, logits_v),
                ("sampled top-k 50", 1.0, 50, 1.0, logits_v), ("sampled top-p 0.9", 1.0, 0, 0.9, logits_v),
                ("sampled top-k 50 + top-p 0.9", 1.0, 50, 0.9, logits_v),
                ("sampled top-p 0.9, peaked rows", 1.0, 0, 0.9, peaked),
                ("sampled top-k 50 + top-p 0.9, peaked rows", 1.0, 50, 0.9, peaked),
                ("sampled top-p 0.9, peaked rows, 1 in 8 flat", 1.0, 0, 0.9, mixed))
    for name, temp, top_k, top_p, rows_in in variants[:1 if greedy_only else len(variants)]:
        t = torch.full((batch,), temp, **dev)
        tk = torch.full((batch,), top_k, dtype=torch.int32, **dev)
        tp = torch.full((batch,), top_p, **dev)
        # Filtered rows also by the radix passes alone (DSPINE_VERIFY_RADIX=1), the candidate
        # search's baseline: the same thresholds, side by side.
        for radix in ("0", "1") if top_k or top_p < 1 else ("0",):
            with env_knobs(DSPINE_VERIFY_RADIX=radix):
                us = timer(lambda: ops.block_verify(rows_in, draft, cand_ids, cand_probs, t, tk, tp, u_v))
            rows.append({"op": "block_verify", "variant": name + (" (radix passes)" if radix == "1" else ""),
                         "us": us, "GBps": verify_bytes / us / 1e3,
                         "frac_bw": verify_bytes / us / 1e3 / ceilings["copy_GBps"], "goal_us": 50.0})
    rows.append({"op": "torch.argmax (reference point)", "variant": "",
                 "us": timer(lambda: logits_v.argmax(-1)), "goal_us": None})
    for r in rows:
        r.update(batch=batch, block=block, vocab=vocab, top_k=k, dtype="bf16")
    return rows


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def fmt(x, spec=".1f"):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def markdown(result: dict) -> str:
    c = result["ceilings"]
    lines = [f"## Kernel benchmarks: {result['device']} ({result['date']}, commit {result['commit']})", "",
             f"Ceilings: copy {c['copy_GBps']:.0f} GB/s (read + write), bf16 matmul "
             f"{c['bf16_matmul_TFLOPs']:.0f} TFLOP/s.", "",
             "Attention (bf16; ours: paged cache, page 16; SDPA/Flex: contiguous K/V of the visible keys):", "",
             "| shape | mode | ctx | window | batch | ours us | TFLOP/s | GB/s | %BW | %MMA | SDPA us (backend) "
             "| Flex us | speedup | path | mma us | sm90 us | exact us | exact key-split us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["attention"]:
        lines.append(
            f"| {r['shape']} | {r['mode']} | {r['ctx']} | {r['window'] or '-'} | {r['batch']} | {fmt(r['ours_us'])} "
            f"| {fmt(r['ours_TFLOPs'])} | {fmt(r['ours_GBps'], '.0f')} | {fmt(100 * r['frac_bw'], '.0f')} "
            f"| {fmt(100 * r['frac_mma'], '.0f')} | {fmt(r['sdpa_us'])} ({r['sdpa_backend'] or '-'}) "
            f"| {fmt(r['flex_us'])} | {fmt(r['speedup_vs_best_alt'], '.2f')} | {r.get('ours_path', '-')} "
            f"| {fmt(r.get('ours_mma_us'))} | {fmt(r.get('ours_sm90_us'))} | {fmt(r.get('ours_exact_us'))} "
            f"| {fmt(r.get('ours_exact_ks_us'))} |")
    forced = [r for r in result["attention"] if r.get("ours_forced_splits_us")]
    if forced:
        counts = list(forced[0]["ours_forced_splits_us"])
        lines += ["", "Ours with the split count forced (DSPINE_ATTN_SPLITS; 'plan' is the heuristic's):", "",
                  "| shape | mode | ctx | window | batch | plan us | " + " | ".join(f"{n} splits us" for n in counts) + " |",
                  "|---|---|---|---|---|---|" + "---|" * len(counts)]
        for r in forced:
            lines.append(f"| {r['shape']} | {r['mode']} | {r['ctx']} | {r['window'] or '-'} | {r['batch']} "
                         f"| {fmt(r['ours_us'])} | "
                         + " | ".join(fmt(r["ours_forced_splits_us"][n]) for n in counts) + " |")
    if "injection" not in result:  # --attention-only
        return "\n".join(lines)
    inj = result["injection"]
    lines += ["", f"Injection (d={inj['hidden']}, block {inj['block']}, batch 1): fused op "
              f"{inj['fused_op_us']:.1f} us/layer ({inj['fused_op_GBps']:.0f} GB/s), "
              f"{inj['fused_op_5_layers_us']:.1f} us for 5 layers; full injection with bf16 projections "
              f"{inj['full_injection_5_layers_us']:.1f} us per round (paper: <= 150 us).", "",
              "| op | variant | batch | V | us | GB/s | %BW | goal us |", "|---|---|---|---|---|---|---|---|"]
    for r in result["sampling"]:
        lines.append(f"| {r['op']} | {r['variant']} | {r['batch']} | {r['vocab']} | {fmt(r['us'])} "
                     f"| {fmt(r.get('GBps'), '.0f')} "
                     f"| {fmt(100 * r['frac_bw'] if r.get('frac_bw') else None, '.0f')} | {fmt(r['goal_us'], '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    global PAGE, PAGES_IN_ORDER
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~1 minute subset")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="stop the attention sweep after this long (the JSON says so)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=None,
                        help="only these attention modes (e.g. decode verify: issue 12's rows)")
    parser.add_argument("--shapes", nargs="+", default=None, help="only these model shapes")
    parser.add_argument("--ctxs", nargs="+", type=int, default=None, help="only these contexts")
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="only these batch sizes")
    parser.add_argument("--splits", nargs="+", type=int, default=None,
                        help="also time ours with each of these split counts forced "
                             "(DSPINE_ATTN_SPLITS, 1-128) per row")
    parser.add_argument("--attention-only", action="store_true",
                        help="skip the injection, walk and verify rows")
    parser.add_argument("--sampling-only", action="store_true",
                        help="only the injection, walk and verify rows (no attention sweep)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                        help="directory for kernels_<device>.json")
    parser.add_argument("--sm90", choices=["auto", "on", "off", "compare"], default="auto",
                        help="Hopper attention kernel: heuristic, forced on/off, or both timed per row")
    parser.add_argument("--exact", action="store_true",
                        help="also time ours in the row-exact mode per row, both forms "
                             "(DSPINE_ATTN_EXACT=1 row tiles, =2 key split)")
    parser.add_argument("--page-size", type=int, default=PAGE,
                        help="tokens per KV page of our kernels' paged cache (the engine's default: 16); "
                             "the sm90 kernel offers TMA loads at powers of two of at least 8")
    parser.add_argument("--page-order", choices=["shuffled", "in-order"], default="shuffled",
                        help="our paged cache's page tables: shuffled pages (every tile on scattered "
                             "pages), or each sequence's pages consecutive, as the engine's pool hands "
                             "out a fresh prompt's (the sm90 kernel then loads whole tiles by TMA)")
    args = parser.parse_args(argv)
    PAGE, PAGES_IN_ORDER = args.page_size, args.page_order == "in-order"
    set_sm90(SM90_ENV["auto" if args.sm90 == "compare" else args.sm90])
    if not torch.cuda.is_available():
        print("benchmarks/kernel_bench.py needs a CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    timer = Timer(iters=10 if args.quick else 20)
    device = torch.cuda.get_device_name()
    result = {"device": device, "date": datetime.date.today().isoformat(), "commit": git_commit(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "quick": args.quick, "sm90": args.sm90,
              "page_size": PAGE, "page_order": args.page_order,
              "command": " ".join(["python benchmarks/kernel_bench.py"] + (argv if argv is not None else sys.argv[1:]))}
    result["ceilings"] = measure_ceilings(timer)
    result["attention"] = []
    start, cfgs = time.monotonic(), sweep(args.quick)
    cfgs = [c for c in cfgs if (args.modes is None or c.mode in args.modes)
            and (args.shapes is None or c.shape in args.shapes)
            and (args.ctxs is None or c.ctx in args.ctxs)
            and (args.batches is None or c.batch in args.batches) and not args.sampling_only]
    for cfg in tqdm(cfgs, desc="attention", unit="cfg"):
        if args.max_minutes and time.monotonic() - start > 60 * args.max_minutes:
            result["truncated"] = f"{len(result['attention'])} of {len(cfgs)} configurations"
            break
        result["attention"].append(bench_attention(cfg, timer, result["ceilings"], args.sm90, args.exact,
                                                   args.splits))
    if not args.attention_only:
        result["injection"] = bench_injection(timer)
        result["sampling"] = bench_sampling(timer, result["ceilings"])
    os.makedirs(args.out, exist_ok=True)
    slug = "".join(ch if ch.isalnum() else "_" for ch in device).strip("_")
    path = os.path.join(args.out, f"kernels_{slug}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(markdown(result))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
