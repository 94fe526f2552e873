#!/usr/bin/env python
"""CPU paged attention (ours) vs torch SDPA, side by side in one process, on SmolLM2-135M's
attention shape (9 query heads, 3 KV heads, head_dim 64): decode at batch 1 and 20, and a
16-token causal verify at batch 1, 4, 8 and 20, at one or more contexts. SDPA gets contiguous K/V
holding exactly the keys the queries see (its natural input); ours reads a paged cache (page
size 16, shuffled pages).

Ours and SDPA are timed in alternating blocks, --reps calls each in all (so a burst of load on
a shared machine hits both), and each reports its median; writes
benchmarks/results/cpu_attention.json (or --out DIR) and prints a markdown table. Run it twice,
alternating, to compare two builds (PYTHONPATH pointing at each).

    python benchmarks/cpu_attention.py [--threads 2] [--context 300 [1024 ...]] [--reps 30] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import markdown_table, paired_medians, run_info, save_json  # noqa: E402
from kernel_cases import attention_case  # noqa: E402

HQ, HKV, D, PAGE = 9, 3, 64, 16
CASES = [("decode", 1, 1), ("decode", 20, 1), ("verify 16", 1, 16), ("verify 16", 4, 16),
         ("verify 16", 8, 16), ("verify 16", 20, 16)]


def sdpa_inputs(q, kc, vc, tables, q_len: int, kv_len: int, batch: int):
    """Per sequence: [1, H, n, D] queries and [1, H, kv_len, D] keys/values gathered from the
    pages (GQA expanded), outside the timed call."""
    out = []
    for b in range(batch):
        pages = tables[b, : (kv_len + PAGE - 1) // PAGE].long()
        k = kc[pages].reshape(-1, HKV, D)[:kv_len].transpose(0, 1)
        v = vc[pages].reshape(-1, HKV, D)[:kv_len].transpose(0, 1)
        k, v = (t.repeat_interleave(HQ // HKV, 0).unsqueeze(0).contiguous() for t in (k, v))
        qb = q[b * q_len:(b + 1) * q_len].transpose(0, 1).unsqueeze(0).contiguous()
        out.append((qb, k, v))
    return out


def causal_mask(q_len: int, kv_len: int) -> torch.Tensor:
    pos = torch.arange(kv_len - q_len, kv_len)[:, None]
    return torch.arange(kv_len)[None, :] <= pos


def run_case(mode: str, batch: int, q_len: int, context: int, reps: int) -> dict:
    from dspine_engine import ops

    kv_len = context + q_len
    q, kc, vc, bt, kl, cu, mq = attention_case([q_len] * batch, [kv_len] * batch, HQ, HKV, D,
                                               PAGE, torch.float32, "cpu", seed=batch + q_len)
    scale = D ** -0.5
    per_seq, mask = sdpa_inputs(q, kc, vc, bt, q_len, kv_len, batch), causal_mask(q_len, kv_len)

    def run_ours():
        return ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, scale)

    def run_sdpa():
        return [F.scaled_dot_product_attention(a, k, v, attn_mask=mask, scale=scale)
                for a, k, v in per_seq]

    ours, sdpa = paired_medians([run_ours, run_sdpa], reps)
    # The same answer, or the timings compare different work.
    want = torch.cat([o[0].transpose(0, 1) for o in run_sdpa()])
    got = ops.paged_attention(q, kc, vc, bt, kl, cu, mq, True, 0, scale)
    err = ((got - want).norm() / want.norm()).item()
    return dict(mode=mode, batch=batch, q_len=q_len, context=context, ours_us=ours * 1e6,
                sdpa_us=sdpa * 1e6, ours_vs_sdpa=sdpa / ours, rel_err_vs_sdpa=err)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--context", type=int, nargs="+", default=[300],
                    help="keys before the queries (one or more)")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per case (median)")
    ap.add_argument("--out", default=None, help="results directory (benchmarks/results)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [run_case(m, b, n, c, args.reps) for c in args.context for m, b, n in CASES]
    print(markdown_table(["mode", "batch", "context", "ours (us)", "SDPA (us)", "SDPA / ours"],
                         [[r["mode"], r["batch"], r["context"], f"{r['ours_us']:.0f}",
                           f"{r['sdpa_us']:.0f}", f"{r['ours_vs_sdpa']:.2f}x"] for r in rows]))
    worst = max(r["rel_err_vs_sdpa"] for r in rows)
    if not worst < 1e-5:
        print(f"ours and SDPA disagree (relative error {worst:.2e})", file=sys.stderr)
        return 1
    save_json("cpu_attention", dict(run_info("cpu"), threads=args.threads, rows=rows),
              Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
