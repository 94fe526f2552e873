"""Where a round's wall time goes between the host and the device.

Each engine call of a round (`ROUND_CALLS`) is wrapped to stamp the host clock and record a
timing event (a CUDA event; on the CPU the host clock, where the device is the host) as it
returns. From two consecutive marks: ``host`` is the host time to this call's return (a graph
launch returns before its graph ends; `read_back` returns after the round's sync) and ``device``
the device time between the two events (the draft and verify graphs, then the block verify and
its copy back; an interval is the host's when the device had nothing queued).

`step_table.py --timeline` times rounds one at a time from an idle device;
`engine_timeline.py` times an engine's rounds back to back, as they run on real prompts. A mark
costs an event record and a clock read (a few us of host time each, ~9 a round).
"""
from __future__ import annotations

import statistics
import time

import torch

from dspine_engine import ops

# The engine calls of one round, in order: (owner, method); "ops" is dspine_engine.ops, whose
# block_verify `accept_later` calls before it queues the copy back (`read_back` waits for it).
ROUND_CALLS = (("scheduler", "prepare_round"), ("runner", "prepare_round"), ("runner", "propose"),
               ("runner", "verify"), ("ops", "block_verify"), ("runner", "accept_later"),
               ("runner", "read_back"), ("scheduler", "verified"))


class HostEvent:
    """A CUDA event's three calls on the host clock: on the CPU the device is the host."""

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        pass


def timing_event(device):
    """A timing event on `device`'s clock: a CUDA event, or on the CPU the host clock."""
    return torch.cuda.Event(enable_timing=True) if device.type == "cuda" else HostEvent()


class CallStamps:
    """While entered, `ROUND_CALLS` of ``runner`` and ``scheduler`` (and `ops.block_verify`)
    append a mark ``(name, host seconds, event)`` to `marks` as they return; `mark` adds one
    by hand (a round's start and end). On exit the instances fall back to their classes'
    methods and `ops.block_verify` is the original again."""

    def __init__(self, runner, scheduler):
        self.device = runner.device
        self.marks: list[tuple[str, float, object]] = []
        self._owners = {"runner": runner, "scheduler": scheduler, "ops": ops}
        self._originals = {}

    def mark(self, name: str) -> None:
        event = timing_event(self.device)
        event.record()
        self.marks.append((name, time.perf_counter(), event))

    def _stamped(self, inner, name: str):
        def call(*args, **kwargs):
            out = inner(*args, **kwargs)
            self.mark(name)
            return out
        return call

    def __enter__(self) -> "CallStamps":
        for owner, method in ROUND_CALLS:
            inner = getattr(self._owners[owner], method)
            self._originals[(owner, method)] = inner
            setattr(self._owners[owner], method, self._stamped(inner, f"{owner}.{method}"))
        return self

    def __exit__(self, *exc) -> None:
        for (owner, method), inner in self._originals.items():
            if owner == "ops":
                setattr(ops, method, inner)
            else:
                delattr(self._owners[owner], method)  # the instance falls back to its class's
        self._originals.clear()


def intervals(marks) -> dict[str, tuple[float, float]]:
    """``{name: (host us, device us)}`` from each mark to the next (events synchronized); a
    name seen again in the same marks (a round of two groups) gets " (2)", " (3)", ..."""
    marks[-1][2].synchronize()
    out = {}
    for (_, t0, e0), (name, t1, e1) in zip(marks, marks[1:]):
        key, k = name, 1
        while key in out:
            k += 1
            key = f"{name} ({k})"
        out[key] = ((t1 - t0) * 1e6, e0.elapsed_time(e1) * 1e3)
    return out


def medians(rounds: list[dict[str, tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Per call, the median host and device us over the rounds that made that call (in the
    order of the first round's calls)."""
    names = list(dict.fromkeys(name for r in rounds for name in r))
    return {name: {"host_us": statistics.median(r[name][0] for r in rounds if name in r),
                   "device_us": statistics.median(r[name][1] for r in rounds if name in r)}
            for name in names}


def timeline_markdown(title: str, rows: dict[str, dict[str, float]]) -> str:
    head = f"{title} (us from the previous mark to each call's return; medians):\n\n" \
           "| call | host | device |\n|---|---|---|\n"
    return head + "".join(f"| {name} | {v['host_us']:.0f} | {v['device_us']:.0f} |\n"
                          for name, v in rows.items())
