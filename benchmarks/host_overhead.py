#!/usr/bin/env python
"""Host work of one engine round, measured on the CPU: a proxy for what limits large batches on
a GPU, where the forwards are fast and the Python around them is not.

The engine runs a tiny target (and draft) with the model forwards and the block-verify kernel
replaced by stubs that return outputs of the right shapes at once, so a round's time is the
engine's own work: scheduling, cache bookkeeping, input preparation, the host sync, commits,
detokenisation, statistics and outputs. ``batch`` requests of ``prompt`` tokens are prefilled,
then ``rounds`` rounds are timed one by one through `Engine.step()` (median, microseconds).

Modes: ``ar`` (no draft, token ids only: the training-data generator), ``ar_text`` (no draft,
text), ``spec`` (a 16-token DSpine block, 2 drafts accepted per round, text).

    python benchmarks/host_overhead.py [--batches 1 32 128 512] [--rounds 30] [--out DIR]

Writes DIR/host_overhead_cpu.json and prints a markdown table. Runs against any commit of the
engine (it uses only the public API plus the four stubbed functions), so before/after numbers
come from the same script.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import RESULTS, markdown_table, run_info, save_json  # noqa: E402

from dspine_engine import Engine, SamplingParams, ops  # noqa: E402
from dspine_engine.models.dspine import DSpineDraft  # noqa: E402
from dspine_engine.models.target import TargetModel  # noqa: E402

ACCEPTED = 2  # drafts accepted per speculative round (tau 3, what trained drafters reach)
TOKEN = 1234  # every generated token: an ordinary word piece (low ids are special tokens)


@contextlib.contextmanager
def stubbed_forwards(accepted: int):
    """Model forwards and block verify that cost nothing (shapes right, values zero)."""
    saved = (TargetModel.forward, DSpineDraft.propose, DSpineDraft.ingest_context,
             ops.block_verify)

    zeros: dict[tuple, torch.Tensor] = {}

    def zeros_of(rows: int, cols: int, dtype) -> torch.Tensor:  # allocated once per shape
        key = (rows, cols, dtype)
        if key not in zeros:
            zeros[key] = torch.zeros(rows, cols, dtype=dtype)
        return zeros[key]

    def target_forward(self, tokens, meta, k, v, logit_rows=None, tap_layers=()):
        rows = tokens.shape[0] if logit_rows is None else logit_rows.shape[0]
        taps = (zeros_of(tokens.shape[0], len(tap_layers) * self.config.hidden_size, self.dtype)
                if tap_layers else None)
        return zeros_of(rows, self.config.vocab_size, self.dtype), taps

    def propose(self, anchors, *args, **kwargs):
        b, j, k = anchors.shape[0], self.config.block_size - 1, self.config.transition_top_k
        return (torch.zeros(b, j, dtype=torch.long), torch.zeros(b, j, k, dtype=torch.long),
                torch.ones(b, j, k))

    def block_verify(logits, drafts, cand_ids, cand_probs, temps, top_k, top_p, u, seq_lens):
        b, t = logits.shape[:2]
        n = min(accepted, t - 1)
        out = torch.full((b, t), -1, dtype=torch.long)
        out[:, :n + 1] = TOKEN  # accepted drafts + bonus
        acc = torch.full((b,), n, dtype=torch.int32)
        return acc, out, seq_lens + acc + 1

    TargetModel.forward, DSpineDraft.propose = target_forward, propose
    DSpineDraft.ingest_context = lambda self, *a, **k: None
    ops.block_verify = block_verify
    try:
        yield
    finally:
        (TargetModel.forward, DSpineDraft.propose, DSpineDraft.ingest_context,
         ops.block_verify) = saved


def params(max_tokens: int, text: bool) -> tuple[SamplingParams, str]:
    try:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=text), \
            ("text" if text else "ids")
    except TypeError:  # an engine from before detokenize=False: text always
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True), "text"


def time_rounds(model, draft, batch: int, prompt: int, rounds: int, text: bool) -> dict:
    block = 16 if draft else 1
    max_tokens = (rounds + 4) * (ACCEPTED + 1 if draft else 1) + 8
    eng = Engine(model, draft=draft, progress=False, max_num_seqs=batch,
                 kv_cache_tokens=batch * (prompt + max_tokens + 2 * block + 16),
                 max_prefill_tokens=batch * prompt)
    p, detok = params(max_tokens, text)
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        eng.add_request(torch.randint(10, 1000, (prompt,), generator=gen).tolist(), p)
    eng.step()  # the prefill
    for _ in range(3):  # warm-up rounds
        eng.step()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        outs = eng.step()
        times.append((time.perf_counter() - t0) * 1e6)
        assert len(outs) == batch and not any(o.finished for o in outs), "a request ended"
    for rid in [o.request_id for o in outs]:
        eng.abort(rid)
    eng.step()
    us = statistics.median(times)
    return {"batch": batch, "us_per_round": us, "us_per_seq": us / batch, "output": detok,
            "min_us": min(times)}


def build_models(tmp: Path) -> tuple[Path, Path]:
    from dspine_engine.models.default_model import default_model_dir
    from random_drafts import write_tiny_random_draft
    from tiny_models import write_tiny_model

    model = write_tiny_model(tmp / "tiny", "llama", default_model_dir(progress=False))
    return model, write_tiny_random_draft(tmp / "draft", seed=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per row (median)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--modes", nargs="+", default=["ar", "ar_text", "spec"])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--name", default="host_overhead_cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # host work is one thread; keep the proxy steady
    info = run_info("cpu")
    info["command"] = "python benchmarks/host_overhead.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model, draft = build_models(Path(tmp))
        with stubbed_forwards(ACCEPTED):
            for mode in args.modes:
                for b in args.batches:
                    row = time_rounds(model, draft if mode == "spec" else None, b, args.prompt,
                                      args.rounds, text=mode != "ar")
                    row["mode"] = mode
                    rows.append(row)
                    print(f"{mode:>8} batch {b:>4}: {row['us_per_round']:9.0f} us/round "
                          f"({row['us_per_seq']:.1f} us/seq)", file=sys.stderr)
    result = dict(info, accepted_per_round=ACCEPTED, prompt=args.prompt, rounds=args.rounds,
                  rows=rows)
    path = save_json(args.name, result, args.out)
    header = ["mode", "batch", "output", "us / round", "us / sequence"]
    print(markdown_table(header, [[r["mode"], r["batch"], r["output"],
                                   f"{r['us_per_round']:.0f}", f"{r['us_per_seq']:.1f}"]
                                  for r in rows]))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
