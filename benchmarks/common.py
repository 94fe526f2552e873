"""Shared by the benchmarks: run metadata, JSON results and the tables in docs/BENCHMARKS.md."""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({torch.get_num_threads()} threads)"


def git_commit() -> str:
    """The commit measured: $DSPINE_COMMIT (set where the tree travels without .git, e.g. the
    H200 session script), else git's short HEAD, marked +dirty with uncommitted changes."""
    if os.environ.get("DSPINE_COMMIT"):
        return os.environ["DSPINE_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=ROOT, capture_output=True, text=True).stdout.strip())
    except OSError:
        return "unknown"
    return (commit or "unknown") + ("+dirty" if dirty else "")


@contextlib.contextmanager
def env_knobs(**env: str | None):
    """The kernels' environment knobs set for the block (None unsets one), each restored after it.
    The bindings read them at every call, and a CUDA graph keeps what it was captured with."""
    def apply(values: dict) -> None:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    saved = {key: os.environ.get(key) for key in env}
    try:
        apply(env)
        yield
    finally:
        apply(saved)


def timed_calls(fn, reps: int, warmup: int = 1) -> list[float]:
    """Wall times of ``reps`` calls of ``fn`` (host-timed) after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return runs


def median_seconds(fn, reps: int, warmup: int = 1) -> float:
    """The median wall time of ``reps`` calls of ``fn`` after ``warmup`` calls."""
    return statistics.median(timed_calls(fn, reps, warmup))


def paired_medians(fns, reps: int, warmup: int = 3, rounds: int = 3) -> list[float]:
    """Median seconds of each of ``fns`` over ``reps`` timed calls, taken in ``rounds`` blocks
    that alternate between the functions (so a burst of load on a shared machine hits both),
    each block after ``warmup`` calls. Blocks, not single calls in turn: after an OpenMP region
    (torch's) its threads spin for a while, taking the cores from the next call's threads."""
    runs = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, runs):
            times.extend(timed_calls(fn, max(1, reps // rounds), warmup))
    return [statistics.median(t) for t in runs]


def device_kernels(fn, reps: int, prep=None) -> dict:
    """Every device kernel, memset and copy of `reps` calls of `fn` (after `prep`, untimed but
    profiled) under torch.profiler, CUDA graphs' kernels included: by name, launches and us a
    call, largest first, with their sums (launches and busy us a call) and the us a call at least
    one of them ran (``covered_us``: the union of their intervals; less than busy_us where
    kernels overlap, as chained launches do, a chained kernel's wait counting as its own time)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    count, us = defaultdict(int), defaultdict(float)
    spans = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if prep:
                prep()
            fn()
        torch.cuda.synchronize()
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            count[e.name] += 1
            us[e.name] += e.time_range.elapsed_us()
            spans.append((e.time_range.start, e.time_range.end))
    rows = sorted(({"name": n, "launches": count[n] / reps, "us": us[n] / reps} for n in count),
                  key=lambda r: -r["us"])
    return {"launches": sum(r["launches"] for r in rows), "busy_us": sum(r["us"] for r in rows),
            "covered_us": covered_us(spans) / reps, "kernels": rows}


def covered_us(spans) -> float:
    """The length of the union of (start, end) intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


# What a kernel does, by the words in its name (torch.profiler's), first match first: the round's
# time by kind, to set against each kind's floor (the weights for the GEMMs, the KV cache for the
# attention; the elementwise kernels' bytes are negligible, so their time is launches and latency).
KERNEL_KINDS = (
    ("attention", ("paged_attention", "combine_splits")),
    ("walk / verify", ("walk_", "block_verify")),
    ("GEMM", ("nvjet", "gemm", "dense_sm90", "splitkreduce", "cutlass")),
    ("norm / RoPE / SiLU", ("rms_norm", "rope", "silu", "injection")),
)


def kernel_kinds(table: dict) -> dict[str, float]:
    """A device_kernels table's us a call by kind (KERNEL_KINDS; "other" for the rest), in the
    order of KERNEL_KINDS, kinds with no kernel left out."""
    us = dict.fromkeys([name for name, _ in KERNEL_KINDS] + ["other"], 0.0)
    for k in table["kernels"]:
        name = k["name"].lower()
        kind = next((kind for kind, words in KERNEL_KINDS if any(w in name for w in words)), "other")
        us[kind] += k["us"]
    return {kind: v for kind, v in us.items() if v > 0}


def kernel_rows_markdown(table: dict, top: int) -> str:
    """The `top` largest kernels of a device_kernels table, as a markdown table, after the time
    by kind (kernel_kinds)."""
    kinds = ", ".join(f"{kind} {us:,.0f}" for kind, us in kernel_kinds(table).items())
    lines = [f"{table['launches']:.0f} device launches and {table['busy_us'] / 1e3:.3f} ms of kernel "
             f"time a call (us by kind: {kinds}); the {top} largest of {len(table['kernels'])} kernels:", "",
             "| kernel | launches a call | us a call |", "|---|---|---|"]
    lines += [f"| {k['name'][:90]} | {k['launches']:.1f} | {k['us']:.1f} |" for k in table["kernels"][:top]]
    return "\n".join(lines)


def run_info(device: str) -> dict:
    return {"device": device_name(device), "date": _dt.date.today().isoformat(),
            "commit": git_commit(), "torch": torch.__version__,
            "command": "python " + " ".join(sys.argv)}


def engine_threads(engine) -> dict | None:
    """The engine's CPU thread counts (kernels, torch's ops inside its steps); None on CUDA."""
    threads = engine.runner.cpu_threads
    return None if threads is None else {"kernels": threads.kernels,
                                         "torch_ops": threads.torch_ops}


def save_json(name: str, payload: dict, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def markdown_table(header: list[str], rows: list[list]) -> str:
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def update_doc_section(section: str, body: str, info: dict) -> None:
    """Replaces (or appends) the block between <!-- BEGIN section --> and <!-- END section -->."""
    head = (f"Device: {info['device']} · date: {info['date']} · commit: {info['commit']} · "
            f"torch {info['torch']}\n\nCommand: `{info['command']}`\n\n")
    block = f"<!-- BEGIN {section} -->\n{head}{body}\n<!-- END {section} -->"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- BEGIN {re.escape(section)} -->.*?<!-- END {re.escape(section)} -->",
                         re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
