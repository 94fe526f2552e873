#!/usr/bin/env python
"""Host work of one engine round, measured on the CPU: a proxy for what limits large batches on
a GPU, where the forwards are fast and the Python around them is not.

The engine runs a tiny target (and draft) with the model forwards and the block-verify kernel
replaced by stubs that return outputs of the right shapes at once, so a round's time is the
engine's own work: scheduling, cache bookkeeping, input preparation, the host sync, commits,
detokenisation, statistics and outputs. ``batch`` requests of ``prompt`` tokens are prefilled,
then ``rounds`` rounds are timed one by one through `Engine.step()` (median, microseconds of
this thread's CPU time: robust to the other work sharing the cores).

Modes: ``ar`` (no draft, token ids only), ``ar_text`` (no draft, text), ``spec`` (a 16-token
DSpine block, 2 drafts accepted per round, text), ``spec_auto`` (the same under
``spec_policy="auto"`` with a flat cost profile, so it too verifies whole blocks: the difference
is the policy's own host work), ``pair`` (``spec`` and ``spec_auto`` stepped in turn, round by
round, with the median of the paired differences: the policy's cost without the machine's
drift between two runs), and ``data``: `dspine-train data`'s generator
itself (`DataGenerator`, the step API, 20% of the prompts sampled at T=1, records written) on
prompts of 40-200 random tokens, answers ending at a random length (EOS with probability 1/350
per token, capped at 512): host time per step of the whole loop, decode and prefill steps apart,
and response tokens/s over the steady part of the run (each admission setting of --admission).

    python benchmarks/host_overhead.py [--batches 1 32 128 512] [--rounds 30] [--out DIR]

Writes DIR/host_overhead_cpu.json and prints a markdown table. Runs against any commit of the
engine (it uses only the public API plus the four stubbed functions), so before/after numbers
come from the same script.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from common import RESULTS, markdown_table, run_info, save_json, update_doc_section  # noqa: E402

from dspine_engine import Engine, SamplingParams, ops  # noqa: E402
from dspine_engine.engine.config import EngineConfig  # noqa: E402
from dspine_engine.models.dspine import DSpineDraft  # noqa: E402
from dspine_engine.models.target import TargetModel  # noqa: E402
from test_spec_policy_lossless import write_linear_profile  # noqa: E402

ACCEPTED = 2  # drafts accepted per speculative round (tau 3, what trained drafters reach)
TOKEN = 1234  # every generated token: an ordinary word piece (low ids are special tokens)
# This thread's CPU time, not wall time: the 2 cores here are shared, and time spent preempted
# is not the engine's (torch runs on this one thread: set_num_threads(1) below).
CLOCK = time.thread_time
DATA_END = 1 / 350  # data mode: the chance an answer token is EOS (mean answer ~290 tokens)
DATA_MAX_NEW = 512  # data mode: the answer cap (dspine-train data --max-new-tokens 512)


@contextlib.contextmanager
def stubbed_forwards(accepted: int):
    """Model forwards and block verify that cost nothing (shapes right, values zero)."""
    saved = (TargetModel.forward, DSpineDraft.propose, DSpineDraft.ingest_context,
             ops.block_verify)

    zeros: dict[tuple, torch.Tensor] = {}

    def zeros_of(rows: int, cols: int, dtype) -> torch.Tensor:  # grown, never re-allocated
        key = (cols, dtype)
        if key not in zeros or zeros[key].shape[0] < rows:
            zeros[key] = torch.zeros(max(rows, 512), cols, dtype=dtype)
        return zeros[key][:rows]

    def target_forward(self, tokens, meta, k, v, logit_rows=None, tap_layers=()):
        rows = tokens.shape[0] if logit_rows is None else logit_rows.shape[0]
        taps = (zeros_of(tokens.shape[0], len(tap_layers) * self.config.hidden_size, self.dtype)
                if tap_layers else None)
        return zeros_of(rows, self.config.vocab_size, self.dtype), taps

    def propose(self, anchors, *args, **kwargs):
        b, j, k = anchors.shape[0], self.config.block_size - 1, self.config.transition_top_k
        return (torch.zeros(b, j, dtype=torch.long), torch.zeros(b, j, k, dtype=torch.long),
                torch.ones(b, j, k))

    def block_verify(logits, drafts, cand_ids, cand_probs, temps, top_k, top_p, u):
        b, t = logits.shape[:2]
        n = min(accepted, t - 1)
        out = torch.full((b, t), -1, dtype=torch.long)
        out[:, :n + 1] = TOKEN  # accepted drafts + bonus
        return torch.full((b,), n, dtype=torch.int32), out

    TargetModel.forward, DSpineDraft.propose = target_forward, propose
    DSpineDraft.ingest_context = lambda self, *a, **k: None
    ops.block_verify = block_verify
    try:
        yield
    finally:
        (TargetModel.forward, DSpineDraft.propose, DSpineDraft.ingest_context,
         ops.block_verify) = saved


@contextlib.contextmanager
def ending_answers(eos: int, seed: int = 0):
    """Data mode's block verify: one random ordinary token per row, EOS with chance DATA_END."""
    saved = ops.block_verify
    gen = torch.Generator().manual_seed(seed)

    def block_verify(logits, drafts, cand_ids, cand_probs, temps, top_k, top_p, u):
        b, t = logits.shape[:2]
        out = torch.full((b, t), -1, dtype=torch.long)
        ends = torch.rand(b, generator=gen) < DATA_END
        out[:, 0] = torch.where(ends, eos, torch.randint(10, 1000, (b,), generator=gen))
        return torch.zeros(b, dtype=torch.int32), out

    ops.block_verify = block_verify
    try:
        yield
    finally:
        ops.block_verify = saved


def params(max_tokens: int, text: bool) -> tuple[SamplingParams, str]:
    try:
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=text), \
            ("text" if text else "ids")
    except TypeError:  # an engine from before detokenize=False: text always
        return SamplingParams(max_tokens=max_tokens, ignore_eos=True), "text"


def started_engine(model, draft, batch: int, prompt: int, rounds: int, text: bool,
                   policy: dict | None = None):
    """An engine with ``batch`` requests prefilled and warmed up, room for ``rounds`` more
    rounds; and whether its output is text."""
    block = 16 if draft else 1
    max_tokens = (rounds + 4) * (ACCEPTED + 1 if draft else 1) + 8
    eng = Engine(model, draft=draft, progress=False, max_num_seqs=batch,
                 kv_cache_tokens=batch * (prompt + max_tokens + 2 * block + 16),
                 max_prefill_tokens=batch * prompt, **(policy or {}))
    p, detok = params(max_tokens, text)
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        eng.add_request(torch.randint(10, 1000, (prompt,), generator=gen).tolist(), p)
    eng.step()  # the prefill
    for _ in range(3):  # warm-up rounds
        eng.step()
    return eng, detok


def timed_round(eng, batch: int) -> float:
    """One round, microseconds of this thread's CPU time."""
    t0 = CLOCK()
    outs = eng.step()
    us = (CLOCK() - t0) * 1e6
    assert len(outs) == batch and not any(o.finished for o in outs), "a request ended"
    return us


def round_row(batch: int, times: list[float], detok: str) -> dict:
    us = statistics.median(times)
    return {"batch": batch, "us_per_round": us, "us_per_seq": us / batch, "output": detok,
            "min_us": min(times)}


def time_rounds(model, draft, batch: int, prompt: int, rounds: int, text: bool,
                policy: dict | None = None) -> dict:
    eng, detok = started_engine(model, draft, batch, prompt, rounds, text, policy)
    return round_row(batch, [timed_round(eng, batch) for _ in range(rounds)], detok)


def time_policy_pair(model, draft, batch: int, prompt: int, rounds: int, auto: dict) -> list:
    """``spec`` and ``spec_auto`` engines stepped in turn, round by round: the auto policy's
    cost is the difference of two close numbers, and pairs cancel the drift of a shared
    machine. Rows: each engine's median, and the median of the paired differences."""
    fixed, detok = started_engine(model, draft, batch, prompt, rounds, True)
    dynamic, _ = started_engine(model, draft, batch, prompt, rounds, True, auto)
    pairs = [(timed_round(fixed, batch), timed_round(dynamic, batch)) for _ in range(rounds)]
    diff = statistics.median(a - f for f, a in pairs)
    return [dict(round_row(batch, [f for f, _ in pairs], detok), mode="pair: spec"),
            dict(round_row(batch, [a for _, a in pairs], detok), mode="pair: spec_auto"),
            {"batch": batch, "us_per_round": diff, "us_per_seq": diff / batch,
             "output": detok, "mode": "pair: auto - spec"}]


def time_data(model, batch: int, admission: int, samples: int) -> dict | None:
    """The training-data generator's loop at ``batch`` sequences (see the module docstring)."""
    import random

    from dspine_engine.train.data import DataGenerator, GenerationConfig, Prompt

    extra = {} if admission == 1 else {"admission_batch": admission}
    try:
        eng = Engine(model, progress=False, max_num_seqs=batch,
                     kv_cache_tokens=batch * (200 + DATA_MAX_NEW + 48), **extra)
    except TypeError:  # an engine from before admission_batch
        return None
    r = random.Random(batch)
    prompts = [Prompt(ids=[r.randrange(10, 1000) for _ in range(r.randrange(40, 200))])
               for _ in range(samples)]
    marks = []  # per step: start, end, running before, decode rounds, new tokens
    step = eng.step

    def timed_step():
        before = (len(eng.scheduler.running), eng.stats.rounds, eng.stats.new_tokens)
        t0 = CLOCK()
        outs = step()
        marks.append((t0, CLOCK(), before[0], eng.stats.rounds - before[1],
                      eng.stats.new_tokens - before[2]))
        return outs

    eng.step = timed_step
    cfg = GenerationConfig(max_new_tokens=DATA_MAX_NEW, sampled_share=0.2, seed=0)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr), \
            ending_answers(min(eng.eos_ids)):
        DataGenerator(eng, Path(tmp) / "data.jsonl", cfg).run(samples, prompts)
    # Steady state: past the first steps, while the batch is (nearly) full; an iteration is one
    # step plus the generator's own work until the next step.
    its = [(m, nxt[0] - m[0]) for m, nxt in zip(marks[10:], marks[11:]) if m[2] >= 0.75 * batch]
    decode = [(m[1] - m[0]) * 1e6 for m, _ in its if m[3]]
    prefill = [(m[1] - m[0]) * 1e6 for m, _ in its if not m[3]]
    outside = [(it - (m[1] - m[0])) * 1e6 for m, it in its]
    tokens, secs = sum(m[4] for m, _ in its), sum(it for _, it in its)
    med = {"decode_step_us": statistics.median(decode),
           "prefill_step_us": statistics.median(prefill) if prefill else 0.0,
           "generator_us_per_step": statistics.median(outside)}
    # Per decode step, from medians (the 2 shared cores preempt us; sums would count that):
    # the decode step, its share of prefill steps and the generator's work around each step.
    n = max(1, len(decode))
    all_in = (med["decode_step_us"] + len(prefill) / n * med["prefill_step_us"]
              + len(its) / n * med["generator_us_per_step"])
    return dict(med, batch=batch, admission_batch=admission, steps=len(its),
                prefill_share=len(prefill) / max(1, len(its)), tokens_per_decode_step=tokens / n,
                us_per_decode_step_all_in=all_in, tokens_per_s=tokens / n / all_in * 1e6,
                cpu_tokens_per_s=tokens / secs)


def build_models(tmp: Path) -> tuple[Path, Path]:
    from dspine_engine.models.default_model import default_model_dir
    from random_drafts import write_tiny_random_draft
    from tiny_models import write_tiny_model

    model = write_tiny_model(tmp / "tiny", "llama", default_model_dir(progress=False),
                             max_position_embeddings=1024)
    return model, write_tiny_random_draft(tmp / "draft", seed=1, max_position_embeddings=1024)


DOC_NOTE = ("Host CPU time of the engine with the model forwards stubbed out (median per step, "
            "this thread's CPU time: the 2 cores are shared). Data mode = `dspine-train data`'s "
            "generator loop, greedy + 20% sampled at T=1, answers ending at random (mean ~290 "
            "tokens, cap 512), over the steady part of the run; all-in = the loop's time per "
            "decode step (its share of prefill steps and the generator's work included), from "
            "medians; tokens/s = response tokens per decode step / all-in.")


def _admissions(batch: int, names: list[str]) -> list[int]:
    return sorted({max(1, batch // 8) if a == "auto" else int(a) for a in names})


def run_rows(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model, draft = build_models(Path(tmp))
        # A flat cost: every width costs a decode step, so the policy verifies whole blocks
        # (uncalibrated where calibration exists: it steers some rounds to plain and
        # neighbouring widths; older commits have no such setting).
        auto = dict(spec_policy="auto", spec_cost_profile=str(
            write_linear_profile(Path(tmp) / "flat_cost.json", per_token=0.0)))
        if "spec_calibration" in {f.name for f in dataclasses.fields(EngineConfig)}:
            auto["spec_calibration"] = False
        with stubbed_forwards(ACCEPTED):
            for mode in args.modes:
                for b in args.batches:
                    if mode == "data":
                        for adm in _admissions(b, args.admission):
                            row = time_data(model, b, adm, args.samples_per_seat * b)
                            if row is None:
                                print(f"    data batch {b:>4}: admission {adm}: not in this "
                                      "engine", file=sys.stderr)
                                continue
                            rows.append(dict(row, mode=mode))
                            print(f"    data batch {b:>4} admission {adm:>3}: "
                                  f"{row['tokens_per_s']:8.0f} tokens/s, decode step "
                                  f"{row['decode_step_us']:.0f} us", file=sys.stderr)
                        continue
                    if mode == "pair":
                        rows += time_policy_pair(model, draft, b, args.prompt, args.rounds, auto)
                        print(f"    pair batch {b:>4}: auto - spec "
                              f"{rows[-1]['us_per_round']:.0f} us/round", file=sys.stderr)
                        continue
                    row = time_rounds(model, draft if mode.startswith("spec") else None, b,
                                      args.prompt, args.rounds, text=mode != "ar",
                                      policy=auto if mode == "spec_auto" else None)
                    row["mode"] = mode
                    rows.append(row)
                    print(f"{mode:>8} batch {b:>4}: {row['us_per_round']:9.0f} us/round "
                          f"({row['us_per_seq']:.1f} us/seq)", file=sys.stderr)
    return rows


def rows_of_tree(tree: str, argv: list[str]) -> list[dict]:
    """The same measurement with the engine of another checkout (``tree``, e.g. main before a
    change), in a subprocess whose PYTHONPATH puts that tree's dspine_engine first."""
    with tempfile.TemporaryDirectory() as tmp:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), DSPINE_COMMIT=commit)
        subprocess.run([sys.executable, __file__, *argv, "--out", tmp, "--name", "before",
                        "--no-doc"], env=env, check=True, stdout=subprocess.DEVNULL)
        before = json.loads((Path(tmp) / "before.json").read_text())
    return [dict(r, engine=f"before ({before['commit']})") for r in before["rows"]]


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per engine/mode/batch/admission: the median of each number over the repeats."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        key = (r["engine"], r["mode"], r["batch"], r.get("admission_batch"))
        groups.setdefault(key, []).append(r)
    rows = []
    for group in groups.values():
        row = dict(group[0], repeats=len(group))
        for k, v in group[0].items():
            if isinstance(v, float):
                row[k] = statistics.median(g[k] for g in group)
        rows.append(row)
    return rows


def tables(rows: list[dict]) -> str:
    out = []
    rounds = [r for r in rows if r["mode"] != "data"]
    if rounds:
        header = ["engine", "mode", "batch", "output", "us / round", "us / sequence"]
        out.append(markdown_table(header, [[r["engine"], r["mode"], r["batch"], r["output"],
                                            f"{r['us_per_round']:.0f}", f"{r['us_per_seq']:.1f}"]
                                           for r in rounds]))
    data = [r for r in rows if r["mode"] == "data"]
    if data:
        header = ["engine", "batch", "admission", "tokens/s", "decode step (us)",
                  "prefill steps", "prefill step (us)", "generator (us/step)",
                  "all-in per decode step (us)"]
        out.append(markdown_table(header, [
            [r["engine"], r["batch"], r["admission_batch"], f"{r['tokens_per_s']:.0f}",
             f"{r['decode_step_us']:.0f}", f"{100 * r['prefill_share']:.0f}%",
             f"{r['prefill_step_us']:.0f}", f"{r['generator_us_per_step']:.0f}",
             f"{r['us_per_decode_step_all_in']:.0f}"] for r in data]))
    return "\n\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per row (median)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--modes", nargs="+", default=["ar", "ar_text", "spec"],
                    choices=["ar", "ar_text", "spec", "spec_auto", "pair", "data"])
    ap.add_argument("--admission", nargs="+", default=["1", "auto"],
                    help="data mode: admission_batch values (auto: batch / 8, the data CLI's)")
    ap.add_argument("--samples-per-seat", type=int, default=4,
                    help="data mode: samples generated per sequence of the batch")
    ap.add_argument("--before", metavar="TREE", default=None,
                    help="also measure the engine of this checkout (e.g. /work/main before a "
                         "change) in a subprocess, rows marked 'before'")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of everything (before and after in turn); each number is the "
                         "median over them")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--name", default="host_overhead_cpu")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    torch.set_num_threads(1)  # host work is one thread; keep the proxy steady
    os.environ["TQDM_DISABLE"] = "1"  # the data generator's progress bar
    info = run_info("cpu")
    info["command"] = "python benchmarks/host_overhead.py " + " ".join(argv)
    import dspine_engine

    info["engine_path"] = str(Path(dspine_engine.__file__).parent)
    keep = [a for i, a in enumerate(argv) if a not in ("--before", "--repeats")
            and (i == 0 or argv[i - 1] not in ("--before", "--repeats"))]
    runs = []
    for _ in range(args.repeats):  # before and after in turn, so both see the same load
        if args.before:
            runs += rows_of_tree(args.before, keep)
        runs += [dict(r, engine=info["commit"]) for r in run_rows(args)]
    rows = median_rows(runs)
    result = dict(info, accepted_per_round=ACCEPTED, prompt=args.prompt, rounds=args.rounds,
                  data_end_chance=DATA_END, data_max_new=DATA_MAX_NEW, rows=rows)
    path = save_json(args.name, result, args.out)
    table = tables(rows)
    print(table + f"\n\nwrote {path}")
    if not args.no_doc:
        update_doc_section(args.name, DOC_NOTE + "\n\n" + table, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
