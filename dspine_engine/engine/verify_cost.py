"""The verify-cost model of dynamic verification: seconds per round as a function of the tokens
verified per sequence and the number of sequences, measured once per device/model/dtype.

What is timed is the runner's own round, on padding rows (they read page 0 and write nothing):
staging, the draft forward (a one-token round of a drafted engine has none: it keeps its
position's draft context pending, and the batched catch-up once per block of such rounds is left
out), the verify forward over ``tokens`` positions, and block verify with its host sync;
through the CUDA graphs when the engine has them. So the table holds what a real
round costs at a short context, host work included (long contexts add attention time the probe
does not see; the policy's choice is a ratio of costs, which that shifts little).

Form: a table ``seconds[tokens][batch]`` at a few batch sizes (with CUDA graphs exactly the
captured sizes, since a batch runs padded to one); between them linear interpolation, above the
largest proportional growth. Cached as JSON under ``<dspine cache>/verify_cost/<key>.json``; the
key hashes what the cost depends on (device name, target/draft shapes, dtype, graphs), not the
paths, so drafts of one shape share a profile. ``EngineConfig(reprofile=True)`` (CLI
``--reprofile``) measures again; ``spec_cost_profile=PATH`` reads a given profile instead.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

# Batch sizes probed on the CPU (no graphs): geometric, interpolated in between.
CPU_PROBE_BATCHES = (1, 4, 16, 64)
# Part of the cache key: bumped when what a round does changes (2: plain rounds of a drafted
# engine no longer write the draft context every round; 3: CPU draft forwards over the
# verified drafts and the pending context rows only; 4: the CPU's points the fastest of up to 5
# runs, not of 2; 5: the points' runs in sweeps over the widths), so older profiles are
# measured again.
PROFILE_VERSION = 5
# The CPU's probes: the fastest of up to CPU_PROBE_REPS runs a point, but at least 2 and no more
# once a point's runs took CPU_PROBE_SECONDS (start-up time: a 64-sequence 16-token round is
# seconds). At batch 1 a round is 5-50 ms, and on a 2-core machine shared with other jobs the
# fastest of 2 read a 4-token round at 2.44 decode steps where its CPU time is 1.97, enough to
# keep the auto policy from drafting where it pays.
CPU_PROBE_REPS, CPU_PROBE_SECONDS = 5, 0.25


class CostProfileError(ValueError):
    """A cost profile file that cannot be used (missing widths, bad numbers)."""


@dataclass
class CostProfile:
    """``seconds[tokens][batch]``: one round at ``tokens`` positions verified per sequence."""

    seconds: dict[int, dict[int, float]] = field(default_factory=dict)
    padded_sizes: list[int] | None = None  # CUDA-graph sizes a batch is rounded up to

    def cost(self, tokens: int, batch: int) -> float:
        """Predicted seconds of one round of ``batch`` sequences at ``tokens`` each (0 rows
        cost nothing)."""
        if batch <= 0:
            return 0.0
        if self.padded_sizes and batch <= self.padded_sizes[-1]:
            batch = self.padded_sizes[bisect.bisect_left(self.padded_sizes, batch)]
        row = self.seconds[tokens]
        sizes = sorted(row)
        if batch >= sizes[-1]:
            return row[sizes[-1]] * batch / sizes[-1]
        k = bisect.bisect_left(sizes, batch)
        if sizes[k] == batch or k == 0:
            return row[sizes[k]]
        lo, hi = sizes[k - 1], sizes[k]
        return row[lo] + (row[hi] - row[lo]) * (batch - lo) / (hi - lo)

    def check(self, widths) -> None:
        """Raises CostProfileError unless every width has a positive cost at some batch."""
        for w in widths:
            row = self.seconds.get(w)
            if not row or any(not (isinstance(s, (int, float)) and s > 0) for s in row.values()):
                raise CostProfileError(f"the cost profile has no usable costs for {w} verified "
                                       f"token(s) per sequence (widths present: "
                                       f"{sorted(self.seconds)})")

    def to_json(self) -> dict:
        return {"version": PROFILE_VERSION, "padded_sizes": self.padded_sizes,
                "seconds": {str(w): {str(b): s for b, s in row.items()}
                            for w, row in self.seconds.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "CostProfile":
        try:
            seconds = {int(w): {int(b): float(s) for b, s in row.items()}
                       for w, row in data["seconds"].items()}
            sizes = data.get("padded_sizes")
            return cls(seconds, [int(b) for b in sizes] if sizes else None)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CostProfileError(f"not a verify-cost profile ({type(e).__name__}: {e})") \
                from None

    @classmethod
    def read(cls, path) -> "CostProfile":
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise CostProfileError(f"cannot read the cost profile {path}: {e}") from None


def profile_key(engine_identity: dict) -> str:
    """A file name for the profile of one device/model/dtype combination."""
    blob = json.dumps({**engine_identity, "profile_version": PROFILE_VERSION}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


PACKAGE_ROOT = Path(__file__).resolve().parents[1]
CODE_SUFFIXES = (".py", ".so", ".pyd")


@functools.lru_cache(maxsize=None)
def build_fingerprint(root: Path = PACKAGE_ROOT) -> str:
    """The engine's code as installed: the size and modification time of every module and
    compiled extension under ``root``. Part of a profile's key, so an upgrade or a rebuild
    measures its rounds again: on 2026-12-03 a profile cached before the CPU draft forward got
    ~25% cheaper kept the auto policy at 1.20x autoregressive where a fresh one reached 1.49x."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in CODE_SUFFIXES and path.is_file():
            st = path.stat()
            digest.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu:{platform.processor() or platform.machine()}:{torch.get_num_threads()}threads"


def probe_batches(max_batch: int, graph_sizes: list[int] | None) -> list[int]:
    """The batch sizes to time: every captured graph size, else a geometric grid up to the
    engine's largest batch."""
    if graph_sizes:
        return sorted(graph_sizes)
    sizes = [b for b in CPU_PROBE_BATCHES if b < max_batch]
    return sizes + [max_batch]


def probe_settings(device: torch.device) -> tuple[int, float]:
    """(runs a point, seconds after which a point stops at 2 runs) for ``measure`` on ``device``:
    the fastest of 5 on CUDA; on the CPU the budgeted CPU_PROBE_REPS / CPU_PROBE_SECONDS."""
    return (5, float("inf")) if device.type == "cuda" else (CPU_PROBE_REPS, CPU_PROBE_SECONDS)


def measure(runner, widths, batches, reps: int, budget_s: float = float("inf"),
            progress: bool = False, sweep: bool = True) -> CostProfile:
    """Times one round per (width, batch) on padding rows: after one warm-up of each width, up to
    ``reps`` sweeps over the widths (a width stops at 2 runs once its runs took ``budget_s``),
    and the fastest run of each point (the machine may be busy: the minimum is the round's
    cost). Sweeps, not each point's runs back to back, because a profile's use is the ratio of
    widths and a busy spell that falls on one point skews it (benchmarks/cost_profile_spread.py
    measures both orders; ``sweep=False`` is the old one, kept for it)."""
    seconds: dict[int, dict[int, float]] = {w: {} for w in widths}
    bar = tqdm(total=len(widths) * len(batches), desc="measuring verify cost (once, cached)",
               unit="point", disable=not progress, leave=False)
    for b in batches:
        for w in widths:
            runner.padding_round(b, w)  # warm-up
        runs: dict[int, list[float]] = {w: [] for w in widths}
        order = [w for _ in range(reps) for w in widths] if sweep else \
            [w for w in widths for _ in range(reps)]
        for w in order:
            if len(runs[w]) >= 2 and sum(runs[w]) >= budget_s:
                continue
            t0 = time.perf_counter()
            runner.padding_round(b, w)
            runs[w].append(time.perf_counter() - t0)
        for w in widths:
            seconds[w][b] = min(runs[w])
        bar.update(len(widths))
    bar.close()
    return CostProfile(seconds)


def load_or_measure(runner, widths, max_batch: int, identity: dict, cache_root: Path,
                    remeasure: bool, progress: bool) -> CostProfile:
    """The cached profile for ``identity`` when it covers ``widths`` and ``max_batch``; else a
    fresh measurement, written back (missing batch sizes only are added to a cached one)."""
    sizes = runner.graphs.sizes if runner.graphs is not None else None
    batches = probe_batches(max_batch, sizes)
    path = cache_root / "verify_cost" / f"{profile_key(identity)}.json"
    cached = None
    if path.is_file() and not remeasure:
        try:
            cached = CostProfile.read(path)
        except CostProfileError:
            cached = None  # a damaged cache file is measured again, never trusted
    if cached is not None:
        missing_w = [w for w in widths if w not in cached.seconds]
        have = set.intersection(*(set(cached.seconds[w]) for w in widths)) if not missing_w \
            else set()
        missing_b = [b for b in batches if b not in have]
        if not missing_w and not missing_b:
            cached.padded_sizes = sizes
            return cached
        batches = missing_b if not missing_w else batches
    fresh = measure(runner, widths, batches, *probe_settings(runner.device), progress=progress)
    if cached is not None:
        for w, row in fresh.seconds.items():
            cached.seconds.setdefault(w, {}).update(row)
        fresh = cached
    fresh.padded_sizes = sizes
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**fresh.to_json(), "identity": identity}, indent=1,
                                  default=str))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache costs a re-measurement next time, nothing else
    return fresh
