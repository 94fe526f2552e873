#!/usr/bin/env python
"""Gated DeltaNet kernels and ReplaySSM rollback, on the linear-attention layer of a
Qwen3.8-27B-shaped hybrid target (16 key / 48 value heads of 128, conv over 10240 channels,
48 linear layers, verify block 16).

Two tables:
- kernels: our ops against the PyTorch reference of dspine_engine.ops and transformers' torch
  implementation (torch_recurrent/chunk_gated_delta_rule, causal_conv1d_fn) for decode, a verify
  block, the replay, prefill and the conv, with the state bytes each moves (transformers'
  outputs are checked against ours once before it is timed: the same math or no number);
- rollback per round: what keeping the round undoable costs, summed over the 48 layers:
  * replay (chosen): the verify records (k^, u, g) per token in a ring and leaves the checkpoint,
    then the accepted prefix is replayed onto it (gated_delta_replay, all layers in one call);
  * stored states: the verify writes the state after every token (B states per layer and
    sequence) and the accepted one is copied into the slot (SGLang's approach).
  Each is timed as the verify recurrence that keeps the round undoable + its rollback (beside
  the plain in-place recurrence, which cannot roll back, for scale), for a uniformly random
  accepted prefix; the memory each needs per sequence is reported too. The conv window's commit
  is the same shift for both and is left out.

Times: median of --iters runs (CUDA: L2 flushed before each run, benchmarks/kernel_bench.py's Timer;
CPU: perf_counter). CUDA runs in bf16 activations with the fp32 state; the CPU in fp32 on
smaller batches (--cpu-batches) and fewer layers (the per-layer cost is what scales).

    python benchmarks/gated_delta.py [--batches 1 8 32] [--iters N] [--tiny] [--out DIR]

--tiny runs a tiny GQA layer (TINY_LAYER) instead, a smoke run of the same code in seconds.

Writes DIR/gated_delta_<device>.json and prints markdown tables.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import RESULTS, markdown_table, run_info, save_json  # noqa: E402
from kernel_cases import rel_err  # noqa: E402

from dspine_engine import ops  # noqa: E402
from dspine_engine.engine.engine import resolve_device  # noqa: E402

# The linear-attention layer of Qwen3.8-27B (its config.json's text_config).
LAYER = dict(hk=16, hv=48, dk=128, dv=128, kernel=4, layers=48)
# --tiny: a CPU smoke run in seconds, still with 3 value heads per key head (GQA)
TINY_LAYER = dict(hk=2, hv=6, dk=16, dv=32, kernel=4, layers=3)
BLOCK = 16
EMPTY = torch.empty(0)


def layer_shape(cfg) -> dict:
    """LAYER's fields for another hybrid config (step_table.py's targets)."""
    return dict(hk=cfg.linear_num_key_heads, hv=cfg.linear_num_value_heads,
                dk=cfg.linear_key_head_dim, dv=cfg.linear_value_head_dim,
                kernel=cfg.conv_kernel, layers=cfg.num_linear_layers)


def make_timer(device, iters: int):
    """fn -> median microseconds."""
    if device.type == "cuda":
        import kernel_bench  # L2 flushed before each run

        return kernel_bench.Timer(iters=iters)

    def cpu_timer(fn, iters=iters):
        fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    return cpu_timer


class Layer:
    """Random inputs of one linear layer for `batch` sequences of `n` tokens each."""

    def __init__(self, batch: int, n: int, device, dtype, slots: int | None = None,
                 ring: int = 0, seed: int = 0, shape: dict = LAYER):
        g = torch.Generator(device).manual_seed(seed)
        hk, hv, dk, dv = shape["hk"], shape["hv"], shape["dk"], shape["dv"]
        rows = batch * n
        rnd = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
        self.q, self.k = rnd(rows, hk, dk).to(dtype), rnd(rows, hk, dk).to(dtype)
        self.v = rnd(rows, hv, dv).to(dtype)
        self.a, self.b = rnd(rows, hv).to(dtype), rnd(rows, hv).to(dtype)
        self.a_log = torch.empty(hv, device=device).uniform_(1, 16, generator=g).log()
        self.dt_bias = rnd(hv) * 0.5
        self.state = rnd(slots or batch, hv, dk, dv) * 0.05
        self.slots = torch.arange(batch, dtype=torch.int32, device=device)
        self.cu = torch.arange(0, rows + 1, n, dtype=torch.int32, device=device)
        self.n, self.batch = n, batch
        f32 = dict(dtype=torch.float32, device=device)
        self.ring = (torch.zeros(slots or batch, ring, hk, dk, **f32),
                     torch.zeros(slots or batch, ring, hv, dv, **f32),
                     torch.zeros(slots or batch, ring, hv, **f32)) if ring else (EMPTY,) * 3

    def inputs(self):
        return (self.q, self.k, self.v, self.a, self.b, self.a_log, self.dt_bias)

    def recurrent(self, states_out=EMPTY, ring=None, fn=ops.gated_delta_recurrent):
        return fn(*self.inputs(), self.state, self.slots, self.cu, self.n,
                  *(ring or (EMPTY,) * 3), states_out)

    def chunk(self, fn=ops.gated_delta_chunk):
        return fn(*self.inputs(), self.state, self.slots, self.cu, self.n)

    def hf_inputs(self):
        """transformers' layout: [batch, tokens, heads, dim], g and beta precomputed, q and k
        repeated to the value heads as the Qwen3-Next layer does before its call
        (repeat_interleave: value head h reads key head h // (Hv / Hk), as our kernels and
        ops._expand_k_heads do). Older transformers' functions require this; newer ones repeat
        only when the head counts differ, so both compute the same thing from these inputs."""
        shape = lambda t: t.view(self.batch, self.n, *t.shape[1:])  # noqa: E731
        per_key_head = self.v.shape[1] // self.k.shape[1]
        heads = lambda t: shape(t).repeat_interleave(per_key_head, dim=2)  # noqa: E731
        g = -self.a_log.exp() * torch.nn.functional.softplus(self.a.float() + self.dt_bias)
        return (heads(self.q), heads(self.k), shape(self.v), shape(g),
                shape(self.b.float().sigmoid()))

    def hf_check(self, ours, hf, state_written: bool, tol: float) -> float:
        """Runs ours and transformers' call once from the same state and returns the larger
        relative error of the outputs (and of the final states, where ours writes its state
        back); raises above `tol`, so that the transformers column never times other math.
        The state is put back as it was."""
        start = self.state.clone()
        hf_out, hf_state = hf()
        out = ours()
        err = rel_err(out, hf_out.reshape(out.shape))
        if state_written:
            err = max(err, rel_err(self.state, hf_state))
        self.state.copy_(start)
        return checked_against_transformers(err, tol, f"gated delta rule, batch {self.batch}, "
                                                      f"{self.n} tokens")


def checked_against_transformers(err: float, tol: float, what: str) -> float:
    if not err < tol:
        raise RuntimeError(f"transformers' {what} differs from ours: relative error {err:.2e} "
                           f"> {tol}, so its time would not be comparable")
    return err


def state_bytes(batch: int, shape: dict = LAYER) -> int:
    return batch * shape["hv"] * shape["dk"] * shape["dv"] * 4


def prefill_sizes(device, tiny: bool) -> tuple:
    """(batch, tokens) of the prefill rows (the tiny one crosses a 64-token chunk boundary)."""
    if tiny:
        return ((2, 70),)
    return ((1, 4096), (4, 1024)) if device.type == "cuda" else ((1, 256),)


def kernel_rows(device, dtype, batches, timer, with_reference: bool, shape: dict,
                prefills: tuple) -> list[dict]:
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        causal_conv1d_fn, torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)

    rows = []
    # ours vs transformers once per row, before timing (bf16: both round their outputs)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4

    def add(name, batch, tokens, moved, ours, ref=None, hf=None, hf_err=None):
        us = timer(ours)
        row = dict(op=name, batch=batch, tokens=tokens, ours_us=us,
                   ours_GBps=moved / us / 1e3 if moved else None,
                   reference_us=timer(ref, iters=3) if (ref and with_reference) else None,
                   transformers_us=timer(hf, iters=5) if hf else None,
                   transformers_rel_err=hf_err)
        rows.append(row)

    def hf_recurrent(layer):
        return lambda: torch_recurrent_gated_delta_rule(
            *layer.hf_inputs(), initial_state=layer.state, output_final_state=True,
            use_qk_l2norm_in_kernel=True)

    for batch in batches:
        one = Layer(batch, 1, device, dtype, shape=shape)
        add("decode (recurrent, in place)", batch, 1, 2 * state_bytes(batch, shape),
            one.recurrent,
            lambda: one.recurrent(fn=ops.gated_delta_recurrent_ref), hf_recurrent(one),
            one.hf_check(one.recurrent, hf_recurrent(one), True, tol))
        blk = Layer(batch, BLOCK, device, dtype, ring=BLOCK, shape=shape)
        add("verify block 16 (ring, checkpoint kept)", batch, BLOCK, state_bytes(batch, shape),
            lambda: blk.recurrent(ring=blk.ring),
            lambda: blk.recurrent(ring=blk.ring, fn=ops.gated_delta_recurrent_ref),
            hf_recurrent(blk),
            blk.hf_check(lambda: blk.recurrent(ring=blk.ring), hf_recurrent(blk), False, tol))
        accepted = torch.full((batch,), BLOCK // 2, dtype=torch.int32, device=device)
        add("replay 8 of 16 (one layer)", batch, BLOCK // 2, 2 * state_bytes(batch, shape),
            lambda: ops.gated_delta_replay(blk.state, *blk.ring, blk.slots, accepted),
            lambda: ops.gated_delta_replay_ref(blk.state, *blk.ring, blk.slots, accepted))
        conv_dim = 2 * shape["hk"] * shape["dk"] + shape["hv"] * shape["dv"]
        x = torch.randn(batch * BLOCK, conv_dim, device=device).to(dtype)
        w = torch.randn(conv_dim, shape["kernel"], device=device).to(dtype)
        window = torch.zeros(batch, shape["kernel"] - 1 + BLOCK, conv_dim, device=device,
                             dtype=dtype)
        cu = torch.arange(0, batch * BLOCK + 1, BLOCK, dtype=torch.int32, device=device)
        slots = torch.arange(batch, dtype=torch.int32, device=device)
        conv = lambda: ops.causal_conv1d(x, w, window, slots, cu, BLOCK, True)  # noqa: E731
        hf_conv = lambda: causal_conv1d_fn(  # noqa: E731
            x.view(batch, BLOCK, -1).transpose(1, 2), w, activation="silu")
        # the window starts at zeros and a checkpointed call keeps its first K-1 rows: the
        # same zero padding as transformers' whole-sequence conv
        conv_err = checked_against_transformers(
            rel_err(conv(), hf_conv().transpose(1, 2).reshape(x.shape)), tol,
            f"causal conv1d, batch {batch}")
        add("conv1d, verify block 16", batch, BLOCK, None, conv,
            lambda: ops.causal_conv1d_ref(x, w, window, slots, cu, BLOCK, True), hf_conv,
            conv_err)
    for batch, n in prefills:
        pre = Layer(batch, n, device, dtype, shape=shape)
        hf_chunk = lambda: torch_chunk_gated_delta_rule(  # noqa: E731
            *pre.hf_inputs(), initial_state=pre.state, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        add(f"prefill {n} tokens (chunked)", batch, n, 2 * state_bytes(batch, shape),
            pre.chunk,
            lambda: pre.chunk(fn=ops.gated_delta_chunk_ref), hf_chunk,
            pre.hf_check(pre.chunk, hf_chunk, True, tol))
    return rows


def rollback_rows(device, dtype, batches, timer, layers: int, shape: dict = LAYER,
                  block: int = BLOCK) -> list[dict]:
    """Per round, over `layers` linear layers: (ring verify + replay) vs (stored-states verify +
    copy of the accepted state), and the plain verify recurrence for scale (memory per sequence
    for all of the shape's layers)."""
    rows = []
    hv, dk, dv = shape["hv"], shape["dk"], shape["dv"]
    for batch in batches:
        blk = Layer(batch, block, device, dtype, ring=block, shape=shape)
        gen = torch.Generator().manual_seed(batch)
        accepted = torch.randint(1, block + 1, (batch,), generator=gen, dtype=torch.int32)
        accepted = accepted.to(device)
        # Every layer's state and ring stacked, as RecurrentState keeps them.
        stack_state = blk.state.expand(layers, *blk.state.shape).contiguous()
        stack_ring = [r.expand(layers, *r.shape).contiguous() for r in blk.ring]
        stored = torch.empty(batch * block, hv, dk, dv, device=device)
        pick = (torch.arange(batch, device=device) * block + accepted.long() - 1)

        verify_us = timer(lambda: blk.recurrent())  # no ring: the cost every variant pays
        ring_verify_us = timer(lambda: blk.recurrent(ring=blk.ring))
        replay_us = timer(lambda: ops.gated_delta_replay(stack_state, *stack_ring, blk.slots,
                                                         accepted))
        stored_verify_us = timer(lambda: blk.recurrent(states_out=stored))
        copy_us = timer(lambda: blk.state.index_copy_(0, blk.slots.long(), stored[pick]))
        ring_bytes = block * (shape["hk"] * dk + hv * dv + hv) * 4
        rows.append(dict(
            batch=batch, layers=layers, mean_accepted=float(accepted.float().mean()),
            verify_us_per_layer=verify_us, plain_round_us=layers * verify_us,
            replay_round_us=layers * ring_verify_us + replay_us, replay_us=replay_us,
            stored_round_us=layers * (stored_verify_us + copy_us), copy_us=layers * copy_us,
            replay_bytes_per_seq=shape["layers"] * ring_bytes,
            stored_bytes_per_seq=shape["layers"] * block * hv * dk * dv * 4))
    return rows


def markdown(result: dict) -> str:
    layer = result["layer"]
    kern = [[r["op"], r["batch"], f"{r['ours_us']:.1f}",
             "-" if r["ours_GBps"] is None else f"{r['ours_GBps']:.0f}",
             "-" if r["reference_us"] is None else f"{r['reference_us']:.0f}",
             "-" if r["transformers_us"] is None else f"{r['transformers_us']:.0f}",
             "-" if r["transformers_rel_err"] is None else f"{r['transformers_rel_err']:.1e}"]
            for r in result["kernels"]]
    roll = [[r["batch"], r["layers"], f"{r['mean_accepted']:.1f}", f"{r['plain_round_us']:.0f}",
             f"{r['replay_round_us']:.0f}", f"{r['stored_round_us']:.0f}",
             f"{r['replay_bytes_per_seq'] / 2**20:.1f}",
             f"{r['stored_bytes_per_seq'] / 2**20:.0f}"] for r in result["rollback"]]
    return "\n".join([
        f"## Gated DeltaNet kernels: {result['device']} ({result['date']}, commit "
        f"{result['commit']})", "", f"Command: `{result['command']}`", "",
        f"{'Tiny' if result.get('tiny') else 'Qwen3.8-27B'} linear layer ({layer['hk']}/"
        f"{layer['hv']} heads x {layer['dk']}/{layer['dv']}), {result['dtype']} activations, "
        "fp32 state; GB/s = state bytes read (+ written) / time. transformers' time includes "
        "what its layer does before the call (g, beta, q/k repeated to the value heads); its "
        "outputs (and final state) were checked against ours once before timing (rel. err).", "",
        markdown_table(["op", "batch", "ours us", "ours GB/s", "PyTorch reference us",
                        "transformers torch us", "transformers rel. err"], kern), "",
        "Rollback per round (verify block 16, random accepted prefix; the verify recurrence "
        "that keeps the round undoable + its rollback, summed over the layers timed; the plain "
        f"in-place recurrence for scale; memory for all {layer['layers']} layers):", "",
        markdown_table(["batch", "layers timed", "mean accepted", "plain verify us",
                        "ring verify + replay us", "stored-states verify + copy us",
                        "replay MiB / seq", "stored MiB / seq"], roll)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", help="default 1 8 32 (CPU: 1 2)")
    p.add_argument("--layers", type=int, help="layers in the rollback sum (default 48; CPU 4)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--no-reference", action="store_true", help="skip the (slow) references")
    p.add_argument("--tiny", action="store_true",
                   help=f"a tiny GQA layer {TINY_LAYER}: a CPU smoke run in seconds")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    device = resolve_device(None)
    cuda = device.type == "cuda"
    shape = TINY_LAYER if args.tiny else LAYER
    batches = args.batches or ([1, 8, 32] if cuda else [1, 2])
    layers = args.layers or (shape["layers"] if cuda or args.tiny else 4)
    dtype = torch.bfloat16 if cuda else torch.float32
    timer = make_timer(device, args.iters)
    info = run_info(str(device))
    result = dict(info, dtype=str(dtype).replace("torch.", ""), layer=shape, block=BLOCK,
                  iters=args.iters, tiny=args.tiny)
    # kernels first: their check against transformers fails before the long rollback timing
    result["kernels"] = kernel_rows(device, dtype, batches, timer, not args.no_reference, shape,
                                    prefill_sizes(device, args.tiny))
    result["rollback"] = rollback_rows(device, dtype, batches, timer, layers, shape)
    slug = "cpu" if not cuda else torch.cuda.get_device_name(device).split()[-1].lower()
    path = save_json(f"gated_delta_{slug}{'_tiny' if args.tiny else ''}", result, args.out)
    print(markdown(result))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
