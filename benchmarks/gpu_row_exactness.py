"""Is a row computed the same way wherever it is computed? On the GPU, at the default model's
shapes (SmolLM2-135M: 9 query heads, 3 KV heads, head dim 64, hidden 576), bitwise:

1. attention: each row of a 16-token causal verify block against the same row decoded alone
   (one query, its position's keys) and inside a decode batch (one row of every sequence),
   under the attention knobs: default; DSPINE_ATTN_SPLITS=1 (one key split); DSPINE_ATTN_KEY_SPLIT=0
   (decode rows on the row-tile variant, as verify rows); both; DSPINE_ATTN_EXACT=1 (the
   row-exact mode: row tiles split at absolute 256-key segments) and =2 (its key-split form:
   every block of <= 16 tokens on the key split, 16 rows a CTA);
2. GEMM (F.linear, cuBLAS): each row of a [16 b, K] verify input against the same row alone and
   inside the [b, K] decode batch, for the model's projection shapes.

Speculative output equals autoregressive output only where every piece of the target computes
a verify row as it computes the decoded row (docs/DECISIONS.md, "What lossless means on a GPU");
this says which pieces do. Writes gpu_row_exactness_<device>.json (--out) and prints a table.

    python benchmarks/gpu_row_exactness.py [--batches 1 8 32] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import env_knobs  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, BLOCK = 9, 3, 64, 16, 16
GEMM_SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576),
               "lm_head": (576, 49152)}
KNOBS = {"default": {}, "one_split": {"DSPINE_ATTN_SPLITS": "1"},
         "row_tiles": {"DSPINE_ATTN_KEY_SPLIT": "0"},
         "row_tiles_one_split": {"DSPINE_ATTN_KEY_SPLIT": "0", "DSPINE_ATTN_SPLITS": "1"},
         "exact": {"DSPINE_ATTN_EXACT": "1"}, "exact_key_split": {"DSPINE_ATTN_EXACT": "2"}}
KNOB_NAMES = sorted({name for env in KNOBS.values() for name in env})


class PagedContexts:
    """B sequences with random contexts in one paged bf16 cache (pages in order), each followed
    by a 16-token block whose keys are in the cache too."""

    def __init__(self, batch: int, lo: int, hi: int, seed: int, device):
        rng = random.Random(seed)
        self.prompt = [rng.randint(lo, hi) for _ in range(batch)]
        width = (max(self.prompt) + BLOCK + PAGE - 1) // PAGE
        g = torch.Generator(device="cpu").manual_seed(seed)
        shape = (batch * width, PAGE, KV_HEADS, HEAD_DIM)
        self.k = torch.randn(shape, generator=g).to(device, torch.bfloat16)
        self.v = torch.randn(shape, generator=g).to(device, torch.bfloat16)
        self.q = torch.randn(batch * BLOCK, Q_HEADS, HEAD_DIM, generator=g).to(device, torch.bfloat16)
        self.tables = torch.arange(batch * width, dtype=torch.int32, device=device).view(batch, width)
        self.device = device

    def attention(self, q, seqs: list[int], kv_lens: list[int], q_len: int) -> torch.Tensor:
        from dspine_engine import ops

        dev = self.device
        cu_q = torch.arange(0, (len(seqs) + 1) * q_len, q_len, dtype=torch.int32, device=dev)
        return ops.paged_attention(q, self.k, self.v, self.tables[seqs].contiguous(),
                                   torch.tensor(kv_lens, dtype=torch.int32, device=dev), cu_q, q_len,
                                   True, 0, HEAD_DIM ** -0.5, 0)

    def rows(self) -> dict[str, torch.Tensor]:
        """[B, 16, H, D] outputs of every block row: in the verify block, decoded alone, and
        decoded in a batch with the other sequences' row at the same index."""
        batch = len(self.prompt)
        seqs = list(range(batch))
        verify = self.attention(self.q, seqs, [n + BLOCK for n in self.prompt], BLOCK)
        q = self.q.view(batch, BLOCK, Q_HEADS, HEAD_DIM)
        alone = torch.stack([torch.cat([self.attention(q[b, i:i + 1], [b], [self.prompt[b] + i + 1], 1)
                                        for i in range(BLOCK)]) for b in seqs])
        batched = torch.stack([self.attention(q[:, i].contiguous(), seqs, [n + i + 1 for n in self.prompt], 1)
                               for i in range(BLOCK)], dim=1)
        return {"verify": verify.view(batch, BLOCK, Q_HEADS, HEAD_DIM), "alone": alone, "batched": batched}


def equal_rows(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of rows (all leading dims but the last two) that are bitwise equal."""
    a, b = a.flatten(0, -3), b.flatten(0, -3)
    same = (a.view(torch.int16) == b.view(torch.int16)).flatten(1).all(1)
    return round(same.float().mean().item(), 4)


def attention_table(batches, lo, hi, device) -> list[dict]:
    rows = []
    for batch in batches:
        ctx = PagedContexts(batch, lo, hi, seed=batch, device=device)
        for knob, env in KNOBS.items():
            with env_knobs(**{**dict.fromkeys(KNOB_NAMES), **env}):  # the other knobs unset
                out = ctx.rows()
                torch.cuda.synchronize()
            rows.append({"batch": batch, "knob": knob,
                         "verify_eq_alone": equal_rows(out["verify"], out["alone"]),
                         "verify_eq_batched": equal_rows(out["verify"], out["batched"]),
                         "batched_eq_alone": equal_rows(out["batched"], out["alone"])})
    return rows


def gemm_table(batches, device) -> list[dict]:
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for name, (k, n) in GEMM_SHAPES.items():
        w = (torch.randn(n, k, generator=g) * 0.02).to(device, torch.bfloat16)
        for batch in batches:
            x = torch.randn(batch * BLOCK, k, generator=g).to(device, torch.bfloat16)
            verify = F.linear(x, w)
            alone = torch.cat([F.linear(x[i:i + 1], w) for i in range(0, batch * BLOCK, BLOCK)])
            decode = F.linear(x[::BLOCK].contiguous(), w)
            rows.append({"shape": name, "k": k, "n": n, "batch": batch,
                         "verify_eq_alone": equal_rows(verify[::BLOCK, None, :], alone[:, None, :]),
                         "verify_eq_decode_batch": equal_rows(verify[::BLOCK, None, :], decode[:, None, :]),
                         "decode_batch_eq_alone": equal_rows(decode[:, None, :], alone[:, None, :])})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context", type=int, nargs=2, default=[100, 1500], metavar=("LO", "HI"),
                    help="range of the random prompt lengths before the block")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_row_exactness.py needs a CUDA device", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "attention": attention_table(args.batches, *args.context, device),
              "gemm": gemm_table(args.batches, device)}
    path = Path(args.out) / f"gpu_row_exactness_{device.type}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print("| batch | knob | verify = alone | verify = batched | batched = alone |")
    print("| --- | --- | --- | --- | --- |")
    for r in result["attention"]:
        print(f"| {r['batch']} | {r['knob']} | {r['verify_eq_alone']} | {r['verify_eq_batched']} | {r['batched_eq_alone']} |")
    print("\n| GEMM | batch | verify = alone | verify = decode batch | decode batch = alone |")
    print("| --- | --- | --- | --- | --- |")
    for r in result["gemm"]:
        print(f"| {r['shape']} {r['k']}x{r['n']} | {r['batch']} | {r['verify_eq_alone']} | "
              f"{r['verify_eq_decode_batch']} | {r['decode_batch_eq_alone']} |")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
