"""Rank 0's side of tensor parallelism: the worker processes and how every forward reaches them.

Driving rule (docs/DECISIONS.md): rank 0 alone schedules, samples, verifies and drafts; the
workers only run the sharded target forwards rank 0 announces, in the order it announces them,
from inputs it broadcasts. There is no second copy of any decision to drift.

Failure rule: a worker that dies, a collective that fails or times out, or an interruption inside
a forward leaves the ranks out of step, which cannot be repaired. The group then stops every
worker and raises `TensorParallelError` naming the cause, and so does every later forward
(through the driver the engine's requests end with that error). Nothing waits without a bound:
replies are polled with the workers' liveness, collectives carry the group's timeout.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from ..engine.driver import EngineDeadError
from ..models.target import TargetModel
from . import group
from .layout import available_ranks
from .protocol import pack_forward, send_forward
from .sharding import shard_target

# Loading a large target on every rank can take minutes; a dead worker is noticed at once.
START_TIMEOUT_S = float(os.environ.get("DSPINE_TP_START_TIMEOUT", "900"))
STOP_GRACE_S = 5.0


class TensorParallelError(EngineDeadError):
    """The tensor-parallel group broke (a worker died, a collective failed); the engine is shut
    down."""


class _Worker:
    """One worker process and its two pipe ends."""

    MODULE = "dspine_engine.distributed.worker"  # what runs in the process (a test swaps it)

    def __init__(self, rank: int):
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        self.rank = rank
        self.proc = subprocess.Popen([sys.executable, "-m", self.MODULE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.tx = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.rx = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.last_error: str | None = None

    def describe(self) -> str:
        rc = self.proc.poll()
        state = "is running" if rc is None else f"exited with code {rc}"
        text = f"tensor-parallel worker rank {self.rank} (pid {self.proc.pid}) {state}"
        return text + (f"; its error:\n{self.last_error}" if self.last_error else "")

    def receive(self, timeout: float):
        """The next message within ``timeout`` seconds, or None (also when the pipe closed);
        an error message is kept in ``last_error``."""
        try:
            if not self.rx.poll(timeout):
                return None
            msg = self.rx.recv()
        except (OSError, EOFError):
            return None
        if msg[0] == "error":
            self.last_error = msg[1].strip()
        return msg

    def drain(self) -> None:
        """Reads what the worker sent (keeping its error message, if any)."""
        while self.receive(0) is not None:
            pass


def _stop_workers(workers: list[_Worker], graceful: bool) -> None:
    for w in workers:
        if graceful and w.proc.poll() is None:
            with contextlib.suppress(OSError):
                w.tx.send(("stop",))
    deadline = time.monotonic() + (STOP_GRACE_S if graceful else 0.0)
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        for conn in (w.tx, w.rx):
            conn.close()


def _finalize(workers: list[_Worker], tmpdir: str, threads: int) -> None:
    _stop_workers(workers, graceful=True)
    group.leave()
    shutil.rmtree(tmpdir, ignore_errors=True)
    torch.set_num_threads(threads)


class WorkerGroup:
    """Ranks 1..world-1 of a tensor-parallel engine (rank 0 is this process)."""

    def __init__(self, world: int, target_dir, device: torch.device, dtype: torch.dtype):
        group.check_free()
        self.world, self.device = world, device
        self._failure: str | None = None
        self._graph_ids = itertools.count()
        self._dir = tempfile.mkdtemp(prefix="dspine-tp-")
        threads = max(1, available_ranks(device)[0] // world) if device.type == "cpu" else 1
        spec = dict(world=world, store=os.path.join(self._dir, "store"), dtype=dtype,
                    target_dir=str(target_dir), threads=threads,
                    timeout=group.COLLECTIVE_TIMEOUT_S)
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _finalize, self._workers, self._dir,
                                           torch.get_num_threads())
        try:
            for rank in range(1, world):
                self._workers.append(_Worker(rank))  # listed first: close() stops it
                self._workers[-1].tx.send(dict(spec, rank=rank,
                                               device=group.rank_device(device, rank)))
            self._await("hello", group.COLLECTIVE_TIMEOUT_S)
            if device.type == "cpu":  # the cores are shared out between the ranks
                torch.set_num_threads(threads)
            group.join(spec["store"], 0, world, group.rank_device(device, 0))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def drive(self, target: TargetModel) -> "DrivenTarget":
        """Shards rank 0's copy of the target and returns it as the engine's target."""
        return DrivenTarget(shard_target(target, 0, self.world), self)

    def setup(self, max_position: int, num_pages: int, page_size: int,
              exact_attention: bool, kv_dtype: torch.dtype) -> None:
        """Tells every worker the engine's reach, KV pool (rank 0's cache manager sized it and
        chose its dtype) and attention mode, then waits until each has loaded its shard and
        allocated its pages."""
        self._send(("setup", max_position, num_pages, page_size, exact_attention, kv_dtype))
        self._await("ready", START_TIMEOUT_S)

    # ------------------------------------------------------------------ forwards
    @contextlib.contextmanager
    def forward_guard(self):
        """Wraps one forward on rank 0: any failure inside it takes the group down."""
        if self._failure is not None:
            raise TensorParallelError(self._failure)
        try:
            yield
        except BaseException as e:
            self._fail(f"{type(e).__name__}: {e}")
            if isinstance(e, Exception):
                raise TensorParallelError(self._failure) from e
            raise

    def announce_forward(self, tokens, meta, logit_rows) -> None:
        header, flat = pack_forward(tokens, meta, logit_rows)
        self._send(("forward", header))
        send_forward(flat)

    def announce_capture(self, tokens, meta, logit_rows) -> int:
        """Inside rank 0's CUDA-graph capture: every worker captures its own graph of the same
        forward at the same time (its collectives are recorded in lockstep with ours, the input
        broadcast first), kept under the returned id for `announce_replay`."""
        header, flat = pack_forward(tokens, meta, logit_rows)
        graph_id = next(self._graph_ids)
        self._send(("capture", graph_id, header))
        send_forward(flat)  # recorded: at each replay the inputs travel inside both graphs
        return graph_id

    def announce_replay(self, graph_ids: list[int]) -> None:
        """Before rank 0 replays a graph holding these forwards: the workers replay theirs."""
        if self._failure is not None:
            raise TensorParallelError(self._failure)
        if graph_ids:
            self._send(("replay", graph_ids))

    # ------------------------------------------------------------------ messages
    def _send(self, msg: tuple) -> None:
        for w in self._workers:
            try:
                if w.proc.poll() is None:
                    w.tx.send(msg)
                    continue
            except OSError:  # it died between the check and the send
                pass
            w.drain()
            raise TensorParallelError(w.describe())

    def _await(self, kind: str, timeout_s: float) -> None:
        """Waits for ``kind`` from every worker, watching that each is alive."""
        deadline = time.monotonic() + timeout_s
        for w in self._workers:
            while True:
                msg = w.receive(0.1)
                if msg is not None and msg[0] == kind:
                    break
                if msg is not None or w.proc.poll() is not None:  # an error, or gone
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        w.proc.wait(timeout=1.0)
                    raise TensorParallelError(f"{w.describe()} (while starting)")
                if time.monotonic() > deadline:
                    raise TensorParallelError(f"{w.describe()} but did not answer {kind!r} "
                                              f"within {timeout_s:.0f} s")

    def _fail(self, cause: str) -> None:
        """Records why the group broke (a dead worker first), then stops every worker."""
        time.sleep(0.2)  # a killed worker's exit status lands just after its sockets close
        for w in self._workers:
            w.drain()
        dead = [w.describe() for w in self._workers if w.proc.poll() is not None]
        what = "; ".join(dead) if dead else f"a tensor-parallel forward failed ({cause})"
        self._failure = f"{what}; the tensor-parallel engine is shut down"
        self._stop(graceful=False)

    # ------------------------------------------------------------------ shutdown
    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _stop(self, graceful: bool) -> None:
        if self._finalizer.alive:
            _stop_workers(self._workers, graceful)
            self._finalizer()  # leaves the group, removes the store, restores the threads

    def close(self) -> None:
        """Stops the workers (asked first, killed after a grace period); idempotent. Later
        forwards raise TensorParallelError."""
        self._stop(graceful=True)
        if self._failure is None:
            self._failure = "the tensor-parallel engine was closed"


class DrivenTarget:
    """Rank 0's target under tensor parallelism: its own shard (attributes read through), whose
    every forward the workers run too, on their shards, from the inputs rank 0 broadcasts.

    CUDA graphs per rank: a forward captured into one of rank 0's graphs is captured by every
    worker at the same time (`announce_capture`); the engine's `GraphSet` takes this object as
    its partner, so that replaying a graph first tells the workers to replay theirs."""

    def __init__(self, shard: TargetModel, workers: WorkerGroup):
        self._shard, self._workers = shard, workers
        self._captured: list[int] = []  # forwards captured since the last graph_captured()

    def __getattr__(self, name):
        if name.startswith("_"):  # not the shard's (and no recursion before __init__)
            raise AttributeError(name)
        return getattr(self._shard, name)

    def forward(self, tokens, meta, k_caches, v_caches, logit_rows=None, tap_layers=()):
        with self._workers.forward_guard():
            if tokens.is_cuda and torch.cuda.is_current_stream_capturing():
                self._captured.append(self._workers.announce_capture(tokens, meta, logit_rows))
            else:
                self._workers.announce_forward(tokens, meta, logit_rows)
            return self._shard.forward(tokens, meta, k_caches, v_caches, logit_rows, tap_layers)

    # ----------------------------------------------------------------- graph partner
    @property
    def graph_partner(self) -> "DrivenTarget":
        return self

    def graph_captured(self) -> list[int]:
        """The workers' graphs the graph just captured holds (its target forwards)."""
        held, self._captured = self._captured, []
        return held

    def graph_replaying(self, held: list[int]) -> None:
        with self._workers.forward_guard():
            self._workers.announce_replay(held)
