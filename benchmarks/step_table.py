#!/usr/bin/env python
"""End-to-end step table: how long one speculative round takes on a Qwen3-8B-shaped target (or,
with --target qwen3.8-27b, the Qwen3.8-27B-shaped hybrid: 48 Gated DeltaNet + 16 gated attention
layers) with a 5-layer DSpine draft, and how far that is from the time it takes just to read the
weights.

Both models get random weights built directly in device memory (bf16 on CUDA, fp32 on the CPU)
through the project's own loaders (`TargetModel.from_store` fed by a random weight store,
`DSpineDraft` materialised from the meta device), so no checkpoint is read and the forwards are
exactly the engine's. For each batch x context, `batch` sequences of `context` cached tokens
(random K/V, pages allocated by the engine's scheduler) with 16 pending context rows each are
timed through the engine's own calls, which replay its CUDA graphs on CUDA:

- prepare:      `ModelRunner.prepare_round` (stage the round's inputs: one copy per region);
- draft:        `prepare_round` + `ModelRunner.propose` (the 16 context rows + block + walk);
- verify:       `prepare_round` + `ModelRunner.verify` (target forward of 16 tokens per seq);
- block verify: `ModelRunner.accept` (the block_verify op and the round's host sync);
- commit:       hybrid target: the cache manager's ReplaySSM rollback of every linear layer
                (conv window shift + replay of the accepted prefix onto the checkpoint, random
                accepted lengths), and beside it the alternative of storing every per-token
                state in the verify and copying the accepted one (benchmarks/gated_delta.py's
                rollback rows, at the target's shape);
- round:        `speculative_round` (all of the above, the cache manager and the bookkeeping).
The "graph" numbers are the captured graphs replayed alone, without staging the inputs; draft
and verify each include the staging, as a round pays it once before both.

Times: warm-up, then the median of N runs, each starting from an idle device (a round starts
after the previous round's sync) and timed with CUDA events (perf_counter on the CPU).
Floor = (target + draft weight bytes) / copy bandwidth measured in the same run (read + write,
benchmarks/kernel_bench.py's measure_ceilings); the weights+KV floor adds the K/V the round reads and,
for a hybrid target, its recurrent state (the verify reads each layer's checkpoint, the commit
reads and writes it again).

    python benchmarks/step_table.py [--target qwen3-8b|qwen3.8-27b] [--batches 1 8 32]
                                    [--contexts 1024 8192] [--iters N] [--tiny] [--eager] [--kernels]
                                    [--timeline] [--out DIR]

Writes DIR/step_table_<device>[_<target>].json (`_tiny` appended with --tiny) and prints a
markdown table.
"""
from __future__ import annotations

import argparse
import logging
import math
import re
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (RESULTS, device_kernels, kernel_rows_markdown, markdown_table,  # noqa: E402
                    run_info, save_json)
from round_timeline import (CallStamps, intervals, medians, timeline_markdown,  # noqa: E402
                            timing_event)

from dspine_engine.engine.cache_manager import CacheManager, PagedKVSpec  # noqa: E402
from dspine_engine.engine.config import EngineConfig  # noqa: E402
from dspine_engine.engine.cuda_graphs import graph_sizes  # noqa: E402
from dspine_engine.engine.engine import EngineStats, resolve_device  # noqa: E402
from dspine_engine.engine.kv_cache import pages_for  # noqa: E402
from dspine_engine.engine.recurrent_cache import RecurrentCache  # noqa: E402
from dspine_engine.engine.runner import ModelRunner  # noqa: E402
from dspine_engine.engine.sampling import SamplingParams  # noqa: E402
from dspine_engine.engine.scheduler import Scheduler  # noqa: E402
from dspine_engine.engine.sequence import Sequence  # noqa: E402
from dspine_engine.engine.speculative import speculative_round  # noqa: E402
from dspine_engine.models.config import TargetConfig  # noqa: E402
from dspine_engine.models.draft_config import DraftConfig, evenly_spaced_layers  # noqa: E402
from dspine_engine.models.dspine import DSpineDraft  # noqa: E402
from dspine_engine.models.target import TargetModel, target_class  # noqa: E402

log = logging.getLogger("step_table")
PAGE = 16  # the engine's default page size
WEIGHT_STD = 0.02  # keeps 36 random layers' activations finite in bf16

# An HF config.json of Qwen3-8B (read by the same parser as a real checkpoint's).
QWEN3_8B = dict(architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                max_position_embeddings=40960, tie_word_embeddings=False)
TINY_TARGET = dict(QWEN3_8B, vocab_size=1024, hidden_size=256, intermediate_size=512,
                   num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=64, max_position_embeddings=2048)
# Qwen3.8-27B's text_config (a Qwen3.5 hybrid: every 4th layer full attention with an output
# gate and RoPE on a quarter of each head; the others Gated DeltaNet). The context is capped at
# 32K here: the RoPE table and the graphs' block tables are sized by it, not the weights.
QWEN38_27B = dict(architectures=["Qwen3_5ForCausalLM"], vocab_size=248320, hidden_size=5120,
                  intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                  num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                  linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_conv_kernel_dim=4, full_attention_interval=4, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                   "partial_rotary_factor": 0.25},
                  max_position_embeddings=32768, tie_word_embeddings=False)
TINY_HYBRID = dict(QWEN38_27B, vocab_size=1024, hidden_size=256, intermediate_size=512,
                   num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=32, linear_value_head_dim=32,
                   max_position_embeddings=2048)
TARGETS = {"qwen3-8b": ("Qwen3-8B", QWEN3_8B, TINY_TARGET),
           "qwen3.8-27b": ("Qwen3.8-27B", QWEN38_27B, TINY_HYBRID)}
# The draft: DFlash's Qwen3-8B layout (5 layers tapping layers 1, 9, 17, 25, 33, block 16)
# with DSpine's injection and transition head; window 8192 as in the released drafter.
DSPINE_5L = dict(num_layers=5, num_taps=5, intermediate_size=12288, block_size=16,
                 sliding_window=8192, transition_rank=256)
TINY_DRAFT = dict(num_layers=2, num_taps=3, intermediate_size=512, block_size=16,
                  sliding_window=64, transition_rank=32)
DEFAULTS = {False: ([1, 8, 32], [1024, 8192]), True: ([1, 4], [32, 128])}
DEFINITIONS = {
    "prepare_ms": "ModelRunner.prepare_round: stage the round's inputs (one copy per region)",
    "draft_ms": "prepare_round + ModelRunner.propose: 16 context rows + block + transition walk",
    "verify_ms": "prepare_round + ModelRunner.verify: target forward of 16 tokens per sequence",
    "*_graph_ms": "the captured CUDA graph replayed alone (inputs already staged)",
    "block_verify_ms": "ModelRunner.accept: the block_verify op + the round's host sync, greedy",
    "commit_ms": "hybrid: the cache manager's ReplaySSM commit (conv shift + replay, all layers)",
    "rollback": "hybrid: replay vs stored per-token states, cost per round beyond a plain verify "
                "(benchmarks/gated_delta.py rollback_rows at the target's shape)",
    "round_ms": "speculative_round: cache manager + draft + verify + accept + bookkeeping",
    "floor_ms": "(target + draft weight bytes) / copy bandwidth (read + write)",
    "*_floor_ms": "the weight bytes that graph reads once (step_table.graph_read_bytes) / copy bandwidth",
    "floor_kv_ms": "(weight bytes + K/V bytes the round reads) / copy bandwidth",
    "timing": "median of iters; each run from an idle device; CUDA events (perf_counter on CPU)",
}


# --------------------------------------------------------------------------------------------
# Models with random weights, built where they run
# --------------------------------------------------------------------------------------------

class RandomWeights:
    """Stands in for a checkpoint's WeightStore in `TargetModel.from_store`: every tensor exists
    and is drawn on the device in its final dtype, so the 16 GB never touch the host."""

    def __init__(self, device, dtype, seed: int = 0):
        self.device, self.dtype = device, dtype
        self.gen = torch.Generator(device).manual_seed(seed)

    def has(self, name: str) -> bool:
        return not name.endswith(".bias")  # an untied lm_head; optional biases left out

    def get(self, name: str, shape: tuple) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shape, device=self.device, dtype=self.dtype)
        t = torch.empty(shape, device=self.device, dtype=self.dtype)
        return t.normal_(0.0, WEIGHT_STD, generator=self.gen)


def build_target(shape: dict, device, dtype) -> TargetModel:
    cfg = TargetConfig.from_dict(shape)
    return target_class(cfg).from_store(cfg, RandomWeights(device, dtype), device, dtype)


def draft_config(target: TargetConfig, spec: dict) -> DraftConfig:
    return DraftConfig(
        hidden_size=target.hidden_size, num_layers=spec["num_layers"],
        num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
        intermediate_size=spec["intermediate_size"], vocab_size=target.vocab_size,
        target_layer_ids=evenly_spaced_layers(target.num_layers, spec["num_taps"]),
        rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
        max_position_embeddings=target.max_position_embeddings, block_size=spec["block_size"],
        sliding_window=spec["sliding_window"], transition_rank=spec["transition_rank"])


def random_draft(cfg: DraftConfig, device, dtype, seed: int = 1) -> DSpineDraft:
    """A DSpine draft with random weights (norms at 1), unbound. Built on the meta device and
    materialised on `device`, so its parameters (~1.4B at Qwen3-8B's shape) skip the host-side
    fp32 init."""
    with torch.device("meta"):
        draft = DSpineDraft(cfg)
    draft = draft.to_empty(device=device).to(dtype).eval()
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, WEIGHT_STD, generator=gen)
    return draft


def build_draft(target: TargetModel, spec: dict, seed: int = 1) -> DSpineDraft:
    """A random DSpine draft bound to the target."""
    draft = random_draft(draft_config(target.config, spec), target.device, target.dtype, seed)
    draft.bind(target.embed, target.lm_head, target.config, target.lm_head_dense)
    return draft


def nbytes(tensors) -> int:
    """Bytes of distinct tensors (a tied lm_head counts once)."""
    seen = {}
    for t in tensors:
        if t is not None:
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
    return sum(seen.values())


def target_weight_bytes(target: TargetModel) -> int:
    """Every tensor a layer holds (attention or linear attention), embeddings and the norm."""
    ts = [target.embed, target.lm_head, target.norm]
    for layer in target.layers:
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor):
                ts.append(value)
            elif hasattr(value, "weight"):  # a Dense
                ts += [value.weight, getattr(value, "bias", None)]
    return nbytes(ts)


def recurrent_bytes(target: TargetModel, batch: int) -> int:
    """Recurrent state a round moves: each linear layer's checkpoint read by the verify, then
    read and written by the commit (0 for pure-attention targets)."""
    cfg = target.config
    if cfg.num_kv_layers == cfg.num_layers:
        return 0
    state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    return 3 * batch * cfg.num_linear_layers * state


def draft_weight_bytes(draft: DSpineDraft) -> int:
    """The draft's own parameters (its checkpoint); embeddings and lm_head are the target's."""
    return nbytes(draft.parameters())


def graph_read_bytes(target: TargetModel, draft: DSpineDraft) -> dict[str, int]:
    """Weight bytes each captured graph reads once: the verify every target weight but the
    embedding (it gathers a few rows of it; a tied one is read as the lm_head), the draft its own
    weights and the target's lm_head (the logits of its 15 positions)."""
    tied = target.embed.data_ptr() == target.lm_head.data_ptr()
    return {"verify": target_weight_bytes(target) - (0 if tied else nbytes([target.embed])),
            "draft": draft_weight_bytes(draft) + nbytes([target.lm_head])}


def kv_read_bytes(target: TargetModel, draft: DSpineDraft, batch: int, context: int) -> int:
    """K/V one round reads: the target's whole context, the draft's window, plus the block."""
    t, d = target.config, draft.config
    blk, window = d.block_size, d.sliding_window or 0
    draft_keys = min(context + blk, window + blk - 1) if window else context + blk
    elt = torch.finfo(target.dtype).bits // 8
    per_key = lambda layers, c: 2 * layers * c.num_kv_heads * c.head_dim * elt  # noqa: E731
    target_kv = (context + blk) * per_key(t.num_kv_layers, t)
    return batch * (target_kv + draft_keys * per_key(d.num_layers, d))


# --------------------------------------------------------------------------------------------
# Sequences in the engine's own bookkeeping
# --------------------------------------------------------------------------------------------

class Batch:
    """`batch` running sequences of `context` cached tokens, as the engine holds them after a
    round: admitted by its scheduler (pages from its cache manager), anchor at position
    `context`, 16 verified positions whose draft context is pending (random taps)."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, batch: int, context: int):
        self.runner, self.scheduler = runner, scheduler
        self.batch, self.context = batch, context
        vocab = runner.target.config.vocab_size
        self.anchors = torch.randint(0, vocab, (batch,)).numpy()
        self.seqs: list[Sequence] = []
        self.seats = None
        self.place()

    def place(self) -> None:
        """(Re)admits the sequences from scratch: a round moves them on, the next starts over.
        The state a prefill and a round would leave is set directly (no 8K-token prefill)."""
        self.clear()
        blk, ctx = self.runner.block, self.context
        for i in range(self.batch):
            params = SamplingParams(max_tokens=2 * blk, seed=i)  # greedy, the paper's setting
            self.scheduler.add(Sequence(f"s{i}", None, [0] * ctx, params, None, set()))
        self.seqs = self.scheduler.admit()  # pages for the context, in both caches
        assert len(self.seqs) == self.batch, "KV pool too small for the batch"
        self.scheduler.prefilled(self.seqs)
        cache, runner = self.scheduler.cache, self.runner
        self.seats = cache.seats_of(self.seqs)
        cache.draft_len[self.seats] = ctx - blk  # the last block's context is pending
        cache.pending[self.seats] = blk
        runner._bind(self.seqs, self.seats)
        runner._anchors[self.seats] = self.anchors
        runner._taps[self.seats] = torch.randn_like(runner._taps[self.seats])
        for s, anchor in zip(self.seqs, self.anchors.tolist()):
            s.output_ids = [anchor]

    def clear(self) -> None:
        for s in self.seqs:
            self.scheduler.finish(s, "abort")
        self.seqs = []


def cache_manager(target: TargetModel, draft: DSpineDraft, batch: int, context: int):
    """A cache manager holding `batch` sequences of `context` tokens + a round; K/V are noise."""
    blk = draft.config.block_size
    pages = batch * pages_for(context + 4 * blk, PAGE)
    t, d = target.config, draft.config
    recurrent = (RecurrentCache(target, batch, batch, blk) if t.num_kv_layers != t.num_layers
                 else None)
    cache = CacheManager(PagedKVSpec("target", t.num_kv_layers, t.num_kv_heads, t.head_dim),
                         PagedKVSpec("draft", d.num_layers, d.num_kv_heads, d.head_dim,
                                     window=d.sliding_window or 0),
                         pages, PAGE, batch, context + 2 * blk, blk, target.dtype, target.device,
                         recurrent)
    for c in cache.caches:
        for tensor in c.kv.k + c.kv.v:
            tensor.normal_()
    return cache


def attach_graphs(runner: ModelRunner, max_batch: int) -> bool:
    """Captures the engine's CUDA graphs; like the engine, falls back to eager on failure."""
    try:
        runner.capture_graphs(graph_sizes(max_batch), progress=True)
        return True
    except Exception:
        log.warning("CUDA graph capture failed; timing the eager forwards", exc_info=True)
        runner.graphs = None
        torch.cuda.synchronize()
        return False


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device, iters: int, warmup: int, prep=None) -> float:
    """Median ms of `fn`, each run started from an idle device after `prep` (untimed)."""
    for _ in range(warmup):
        if prep:
            prep()
        fn()
    times = []
    for _ in range(iters):
        if prep:
            prep()
        sync(device)
        start, end = timing_event(device), timing_event(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


GRAPHS = ("draft", "verify")  # the runner's captured graphs, timed and profiled alone


def graph_replay(runner: ModelRunner, kind: str, batch: int):
    """The captured graph of `kind` ("verify" / "draft") at this batch, to replay without
    staging its inputs; None when running eagerly."""
    g = runner.graphs
    if g is None or not g.fits(batch):
        return None
    return g.graph(kind, g.padded(batch)).replay


def measure_bandwidth(device) -> dict:
    """Copy bandwidth (read + write bytes / s): benchmarks/kernel_bench.py's ceilings on CUDA (the
    numbers its kernel table uses); a plain timed copy where those are not available."""
    if device.type == "cuda":
        try:
            import kernel_bench as kernels  # beside this file

            ceilings = kernels.measure_ceilings(kernels.Timer(iters=20))
            torch.cuda.empty_cache()
            return ceilings
        except (ImportError, AttributeError):
            log.warning("benchmarks/kernel_bench.py's measure_ceilings is unavailable; timing a copy")
    # 1 GiB of bf16 on a GPU, 64 MiB of fp32 on the CPU: both well past the caches.
    n, dtype = (512 << 20, torch.bfloat16) if device.type == "cuda" else (16 << 20, torch.float32)
    src = torch.randn(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, iters=10, warmup=2)
    moved = 2 * n * src.element_size()
    return {"copy_GBps": moved / ms / 1e6, "copy_bytes": moved}


# --------------------------------------------------------------------------------------------
# One configuration
# --------------------------------------------------------------------------------------------

def bench_config(runner: ModelRunner, scheduler: Scheduler, batch: int, context: int,
                 iters: int, warmup: int, kernels: bool = False, timeline: bool = False) -> dict:
    dev = runner.device
    b = Batch(runner, scheduler, batch, context)
    timed = lambda fn, prep=None: time_ms(fn, dev, iters, warmup, prep)  # noqa: E731
    row = {"batch": batch, "context": context}
    scheduler.prepare_round(b.seqs)  # pages for the block (a round does this first)

    def stage():
        runner.prepare_round(b.seqs, b.seats)

    replays = {kind: graph_replay(runner, kind, batch) for kind in GRAPHS}
    row["prepare_ms"] = timed(stage)
    row["draft_ms"] = timed(lambda: (stage(), runner.propose()))
    row["verify_ms"] = timed(lambda: (stage(), runner.verify()))
    for kind, replay in replays.items():
        row[f"{kind}_graph_ms"] = timed(replay) if replay else None
    row["block_verify_ms"] = timed(runner.accept)
    row["commit_ms"] = None
    recurrent = scheduler.cache.recurrent
    if recurrent is not None:  # random accepted lengths, like a real round's
        accepted = torch.randint(0, runner.block, (batch,)).numpy()
        row["commit_ms"] = timed(lambda: recurrent.commit(b.seats, accepted))

    stats = EngineStats(accepted_by_position=[0] * (runner.block - 1))
    row["round_ms"] = timed(lambda: speculative_round(runner, scheduler, b.seqs, stats),
                            b.place)
    if timeline:  # host and device time per engine call (--timeline)
        row["round_timeline"] = round_timeline(
            runner, scheduler, lambda: speculative_round(runner, scheduler, b.seqs, stats),
            iters, b.place)
    if kernels and dev.type == "cuda":  # the round's kernels, by name (--kernels)
        row["round_kernels"] = device_kernels(
            lambda: speculative_round(runner, scheduler, b.seqs, stats), iters, b.place)
        for kind, replay in replays.items():  # each graph alone: where its time over the floor goes
            if replay:
                row[f"{kind}_kernels"] = device_kernels(replay, iters)
    b.clear()
    return row


def round_timeline(runner: ModelRunner, scheduler: Scheduler, round_fn, iters: int, prep) -> dict:
    """Where a round's wall time goes between the host and the device (--timeline,
    round_timeline.py): medians per engine call of `iters` rounds, each from an idle device.
    ``end`` covers the rest of the round (the per-sequence bookkeeping)."""
    rounds = []
    with CallStamps(runner, scheduler) as stamps:
        for _ in range(iters):
            prep()
            sync(runner.device)
            stamps.marks.clear()
            stamps.mark("start")
            round_fn()
            stamps.mark("end")
            rounds.append(intervals(stamps.marks))
    return medians(rounds)


def graph_kernels_markdown(row: dict, kind: str, top: int = 15) -> str:
    """The `kind` graph's kernel table, after a line saying how much of its replay time no kernel
    ran (the replay less the union of the kernels' intervals, which chained kernels overlap): the
    launch gaps chaining (DSPINE_PDL) hides, and what it leaves."""
    table, graph_ms = row[f"{kind}_kernels"], row[f"{kind}_graph_ms"]
    idle_us = graph_ms * 1e3 - table["covered_us"]
    floor = row.get(f"{kind}_floor_ms")
    floor_text = f" (its weights read once: {floor:.3f} ms)" if floor else ""
    return (f"{kind.capitalize()} graph alone at batch {row['batch']}, context {row['context']}: "
            f"{graph_ms:.3f} ms a replay{floor_text}, {idle_us:.0f} us of it with no kernel running "
            f"({idle_us / (graph_ms * 1e3):.0%}); " + kernel_rows_markdown(table, top))


def rollback_costs(runner: ModelRunner, args) -> list[dict]:
    """Replay vs stored per-token states at the target's linear-layer shape, per batch."""
    import gated_delta  # benchmarks/gated_delta.py, beside this file

    cfg, dev = runner.target.config, runner.device
    print("timing the rollback alternatives", file=sys.stderr, flush=True)
    timer = gated_delta.make_timer(dev, args.iters)
    return gated_delta.rollback_rows(dev, runner.target.dtype, args.batches, timer,
                                     cfg.num_linear_layers, gated_delta.layer_shape(cfg),
                                     runner.block)


def add_floors(row: dict, weight_bytes: int, kv_bytes: int, gbps: float,
               graph_bytes: dict[str, int]) -> dict:
    floor = weight_bytes / gbps / 1e6  # bytes / (GB/s) -> ms
    floor_kv = (weight_bytes + kv_bytes) / gbps / 1e6
    row.update(kv_bytes=kv_bytes, floor_ms=floor, round_over_floor=row["round_ms"] / floor,
               floor_kv_ms=floor_kv, round_over_floor_kv=row["round_ms"] / floor_kv,
               verify_share=row["verify_ms"] / row["round_ms"])
    row.update({f"{kind}_floor_ms": graph_bytes[kind] / gbps / 1e6 for kind in GRAPHS})
    return row


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _ms(x, graph=None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.2f}" + (f" ({graph:.2f})" if graph is not None else "")


def markdown(result: dict) -> str:
    t, d = result["target"], result["draft"]
    head = [f"## End-to-end step table: {result['device']} ({result['date']}, commit "
            f"{result['commit']})", "",
            f"Command: `{result['command']}`", "",
            f"Target: {t['name']} ({t['layers']} layers{t.get('hybrid', '')}, hidden "
            f"{t['hidden']}, {t['q_heads']}/"
            f"{t['kv_heads']} heads x {t['head_dim']}, vocab {t['vocab']}), "
            f"{t['weight_bytes'] / 1e9:.2f} GB; draft: DSpine {d['layers']} layers tapping "
            f"{d['taps']}, block {d['block']}, window {d['window']}, "
            f"{d['weight_bytes'] / 1e9:.2f} GB. Random {result['dtype']} weights; CUDA graphs "
            f"{'on' if result['cuda_graphs'] else 'off'}; target attention "
            f"{result.get('attention', 'fast')}; median of {result['iters']}.",
            f"Copy bandwidth {result['ceilings']['copy_GBps']:.0f} GB/s (read + write); floor = "
            f"(target + draft weight bytes) / bandwidth; +KV adds the K/V a round reads. "
            f"Draft / verify: the engine's runner calls (graph replay alone in parentheses).", ""]
    header = ["batch", "context", "prepare ms", "draft ms (graph)", "verify ms (graph)",
              "block verify ms", "commit ms",
              "round ms", "verify % of round", "floor ms", "round / floor", "floor+KV ms",
              "round / floor+KV"]
    rows = [[r["batch"], r["context"], _ms(r.get("prepare_ms")),
             _ms(r["draft_ms"], r["draft_graph_ms"]),
             _ms(r["verify_ms"], r["verify_graph_ms"]), _ms(r["block_verify_ms"]),
             _ms(r.get("commit_ms")), _ms(r["round_ms"]), f"{100 * r['verify_share']:.0f}", _ms(r["floor_ms"]),
             f"{r['round_over_floor']:.2f}", _ms(r["floor_kv_ms"]),
             f"{r['round_over_floor_kv']:.2f}"] for r in result["rows"]]
    table = "\n".join(head + [markdown_table(header, rows)])
    return table + rollback_markdown(result.get("rollback"))


def rollback_markdown(rows) -> str:
    if not rows:
        return ""
    ms = lambda us: f"{us / 1e3:.3f}"  # noqa: E731
    body = [[r["batch"], f"{r['mean_accepted']:.1f}", ms(r["plain_round_us"]),
             ms(r["replay_round_us"]), ms(r["replay_us"]), ms(r["stored_round_us"]),
             ms(r["copy_us"]), f"{r['replay_bytes_per_seq'] / 2**20:.1f}",
             f"{r['stored_bytes_per_seq'] / 2**20:.0f}"] for r in rows]
    return "\n\n" + "\n".join([
        f"Rollback per round, all {rows[0]['layers']} linear layers: the verify recurrence that "
        "keeps the round undoable + its rollback (random accepted prefix), beside the plain "
        "in-place recurrence; memory per sequence (benchmarks/gated_delta.py):", "",
        markdown_table(["batch", "mean accepted", "plain verify ms", "ring verify + replay ms",
                        "of which replay ms", "stored verify + copy ms", "of which copy ms",
                        "ring MiB / seq", "stored MiB / seq"], body)])


def device_slug(device: torch.device, tiny: bool) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower().replace("nvidia", "")).strip("_")
    return slug + ("_tiny" if tiny else "")


def describe(target: TargetModel, draft: DSpineDraft, name: str,
             tiny: bool) -> tuple[dict, dict]:
    t, d = target.config, draft.config
    hybrid = ""
    if t.num_kv_layers != t.num_layers:
        hybrid = (f": {t.num_linear_layers} Gated DeltaNet ({t.linear_num_key_heads}/"
                  f"{t.linear_num_value_heads} heads x {t.linear_key_head_dim}) + "
                  f"{t.num_kv_layers} gated attention")
    return ({"name": f"tiny {name}-shaped" if tiny else f"{name}-shaped", "hybrid": hybrid,
             "layers": t.num_layers,
             "hidden": t.hidden_size, "q_heads": t.num_heads, "kv_heads": t.num_kv_heads,
             "head_dim": t.head_dim, "intermediate": t.intermediate_size, "vocab": t.vocab_size,
             "qk_norm": t.qk_norm, "tied": t.tie_word_embeddings,
             "weight_bytes": target_weight_bytes(target)},
            {"layers": d.num_layers, "hidden": d.hidden_size, "taps": d.target_layer_ids,
             "block": d.block_size, "window": d.sliding_window, "intermediate": d.intermediate_size,
             "injection": d.injection, "transition_rank": d.transition_rank,
             "weight_bytes": draft_weight_bytes(draft)})


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", choices=sorted(TARGETS), default="qwen3-8b",
                   help="target shape (qwen3.8-27b: the hybrid Gated DeltaNet target)")
    p.add_argument("--batches", type=int, nargs="+", help="default 1 8 32 (--tiny: 1 4)")
    p.add_argument("--contexts", type=int, nargs="+", help="default 1024 8192 (--tiny: 32 128)")
    p.add_argument("--iters", type=int, default=20, help="timed runs per number (median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="tiny models: a CPU smoke run in seconds")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--kernels", action="store_true",
                   help="CUDA: also profile each configuration's round kernel by kernel, then "
                        "its draft and verify graphs alone (torch.profiler; launches and us a "
                        "call, and each graph's time with no kernel running; printed after the "
                        "table)")
    p.add_argument("--timeline", action="store_true",
                   help="also time each engine call of the round on the host clock and "
                        "with a CUDA event at its return (where the round's time outside the "
                        "graphs goes; printed after the table)")
    p.add_argument("--attention", choices=("exact", "fast"), default=EngineConfig.attention,
                   help="the target's paged attention, as EngineConfig.attention (default: the "
                        "engine's, %(default)s; before 2026-12-05 this table always ran fast)")
    p.add_argument("--out", default=str(RESULTS), help="directory for step_table_<device>.json")
    args = p.parse_args(argv)
    batches, contexts = DEFAULTS[args.tiny]
    args.batches, args.contexts = args.batches or batches, args.contexts or contexts
    if min(args.contexts) < 16:
        p.error("contexts must be >= 16 (each sequence carries 16 pending context rows)")
    return args


def setup(args, device):
    """Models, KV pools, the engine's runner and scheduler, and its CUDA graphs."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print("building the models (random weights)", file=sys.stderr, flush=True)
    _, full, tiny = TARGETS[args.target]
    target = build_target(tiny if args.tiny else full, device, dtype)
    target.exact_attention = args.attention == "exact"  # as Engine sets it
    draft = build_draft(target, TINY_DRAFT if args.tiny else DSPINE_5L)
    max_b, max_ctx = max(args.batches), max(args.contexts)
    cache = cache_manager(target, draft, max_b, max_ctx)
    sizes = graph_sizes(max_b) if device.type == "cuda" and not args.eager else []
    runner = ModelRunner(target, draft, cache, max([max_b] + sizes))
    scheduler = Scheduler(cache, max_b, max_b * max_ctx)
    graphs = bool(sizes) and attach_graphs(runner, max_b)
    return runner, scheduler, graphs


def main(argv=None) -> int:
    args = parse_args(argv)
    device = resolve_device(None)
    torch.manual_seed(0)
    info = run_info(str(device))
    cmd = sys.argv[1:] if argv is None else list(argv)
    info["command"] = "python benchmarks/step_table.py " + " ".join(cmd)
    ceilings = measure_bandwidth(device)  # first, while the card's memory is free
    runner, scheduler, graphs = setup(args, device)
    label = TARGETS[args.target][0]
    target_info, draft_info = describe(runner.target, runner.draft, label, args.tiny)
    weight_bytes = target_info["weight_bytes"] + draft_info["weight_bytes"]
    result = dict(info, cuda=torch.version.cuda, tiny=args.tiny, dtype=str(runner.target.dtype)
                  .replace("torch.", ""), cuda_graphs=bool(graphs), iters=args.iters,
                  warmup=args.warmup, attention=args.attention, ceilings=ceilings,
                  target=target_info, draft=draft_info,
                  weight_bytes=weight_bytes, definitions=DEFINITIONS, rows=[], complete=False)
    suffix = "" if args.target == "qwen3-8b" else "_" + args.target.replace(".", "")
    name = f"step_table_{device_slug(device, args.tiny)}{suffix}"
    configs = [(b, c) for c in args.contexts for b in args.batches]
    graph_bytes = graph_read_bytes(runner.target, runner.draft)
    for batch, context in (bar := tqdm(configs, desc="step table", unit="cfg")):
        bar.set_postfix(batch=batch, context=context)
        row = bench_config(runner, scheduler, batch, context, args.iters, args.warmup, args.kernels,
                           args.timeline)
        kv = (kv_read_bytes(runner.target, runner.draft, batch, context)
              + recurrent_bytes(runner.target, batch))
        result["rows"].append(add_floors(row, weight_bytes, kv, ceilings["copy_GBps"], graph_bytes))
        save_json(name, result, args.out)  # a killed run keeps the rows it finished
    if scheduler.cache.recurrent is not None:
        result["rollback"] = rollback_costs(runner, args)
    result["complete"] = True
    path = save_json(name, result, args.out)
    print(markdown(result))
    for row in result["rows"]:
        if "round_timeline" in row:
            print("\n" + timeline_markdown(f"Round timeline at batch {row['batch']}, context "
                                            f"{row['context']}", row["round_timeline"]))
        if "round_kernels" in row:
            print(f"\nRound at batch {row['batch']}, context {row['context']}: "
                  + kernel_rows_markdown(row["round_kernels"], 25))
        for kind in GRAPHS:
            if f"{kind}_kernels" in row:
                print("\n" + graph_kernels_markdown(row, kind))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
