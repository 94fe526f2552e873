"""The engine loop: one background thread owns the Engine and drives its `step()`.

A step is a long blocking torch call (tens of milliseconds on the CPU); run on the event loop
it would stall every connection, so it runs here, and every engine call (add, abort, step)
happens on this one thread: the engine needs no locks. The event loop talks to the thread
through a FIFO command queue, and the thread hands outputs back with `call_soon_threadsafe`,
one batch per step. Requests join and leave between steps (continuous batching is the
engine's: each step admits what fits and runs one round over everything running).

Output routing: today's step API returns every request's deltas from `step()`, and `_route`
sends each to its `RequestStream` by request id. When the engine's own loop driver lands
(issue 10, per-request handles), `_route` reads the handles instead and this id routing goes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from ..engine.engine import Engine, EngineStats
from ..engine.outputs import RequestOutput
from ..engine.sampling import SamplingParams

log = logging.getLogger("dspine_engine.serve")


class QueueFullError(RuntimeError):
    """More requests in flight than the server accepts (running seats + queue)."""


class ShuttingDownError(RuntimeError):
    """The server is stopping and takes no new requests."""


@dataclass
class PoolUse:
    total: int  # pages in the pool
    used: int  # pages holding K/V of a live sequence
    reserved: int  # pages promised to admitted sequences but not yet taken


@dataclass
class LoopSnapshot:
    """The engine's state after the latest step, copied on the engine thread (what /metrics and
    /health read, so no other thread ever touches engine internals)."""

    in_flight: int = 0  # requests accepted and not finished
    running: int = 0
    waiting: int = 0
    steps: int = 0
    pools: dict[str, PoolUse] = dataclasses.field(default_factory=dict)
    engine: EngineStats = dataclasses.field(default_factory=EngineStats)


class RequestStream:
    """One request's outputs, on the event loop, in order; the last has ``finished=True``."""

    def __init__(self, owner: "EngineLoop", request_id: str,
                 on_finished: Callable[[RequestOutput], None] | None = None):
        self._owner = owner
        self.request_id = request_id
        self._on_finished = on_finished  # called once with the finished output, read or not
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.final: RequestOutput | None = None  # set once the finished output has arrived

    @property
    def finished(self) -> bool:
        return self.final is not None

    def _push(self, out: RequestOutput) -> None:
        if out.finished:
            self.final = out
            if self._on_finished is not None:
                self._on_finished(out)
        self._queue.put_nowait(out)

    async def __aiter__(self):
        while True:
            out = await self._queue.get()
            yield out
            if out.finished:
                return

    def abort(self) -> None:
        """Stops the request (its pages go back before the next step); idempotent."""
        if not self.finished:
            self._owner.abort(self.request_id)


@dataclass
class _Add:
    request_id: str
    prompt: object
    params: SamplingParams
    chat: bool | None
    stream: RequestStream
    done: concurrent.futures.Future


class EngineLoop:
    def __init__(self, engine: Engine, max_queue: int):
        self.engine = engine
        self.capacity = engine.scheduler.max_num_seqs + max_queue
        self.snapshot = LoopSnapshot()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}  # unfinished requests (engine thread only)
        self._stopping = False
        self._failed: str | None = None
        self._aio: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ event-loop side
    def start(self) -> None:
        self._aio = asyncio.get_running_loop()
        self._take_snapshot()
        self._thread = threading.Thread(target=self._run, name="dspine-engine-loop", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._failed is None

    async def submit(self, request_id: str, prompt, params: SamplingParams,
                     chat: bool | None,
                     on_finished: Callable[[RequestOutput], None] | None = None
                     ) -> RequestStream:
        """Queues a request. Raises what `Engine.add_request` raises (ValueError,
        KVCacheFullError), QueueFullError or ShuttingDownError; nothing else is affected.
        ``on_finished`` runs on the event loop with the request's finished output, whether
        anyone reads the stream or not (metrics count aborted requests too)."""
        stream = RequestStream(self, request_id, on_finished)
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_Add(request_id, prompt, params, chat, stream, done))
        try:
            await asyncio.wrap_future(done)
        except asyncio.CancelledError:  # the client left while the request was being queued
            self.abort(request_id)  # a no-op unless the add went through after all
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def stop(self, timeout: float | None = None) -> None:
        """Aborts whatever is still in flight, lets the engine report it, ends the thread."""
        self._send(("stop", None))
        if self._thread is not None:
            self._thread.join(timeout)

    def _send(self, command) -> None:
        self._commands.put(command)
        self._wake.set()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            while True:
                self._wake.clear()  # before draining, so a command sent later wakes the wait
                self._drain_commands()
                if self.engine.has_unfinished():
                    self._step()
                elif self._stopping:
                    return
                else:
                    self._wake.wait()
        except BaseException as e:  # a bug here must not leave requests waiting forever
            self._failed = f"{type(e).__name__}: {e}"
            log.exception("the engine loop failed; failing every request in flight")
            self._fail_all(self._failed)
            raise

    def _drain_commands(self) -> None:
        handled = False
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            handled = True
            if isinstance(command, _Add):
                self._add(command)
            elif command[0] == "abort":
                self.engine.abort(command[1])
            elif command[0] == "stop":
                self._stopping = True
                for rid in list(self._streams):
                    self.engine.abort(rid)
        if handled:
            self._take_snapshot()

    def _add(self, c: _Add) -> None:
        if not c.done.set_running_or_notify_cancel():
            return  # the client left before the request reached the engine
        try:
            if self._stopping:
                raise ShuttingDownError("the server is shutting down and takes no new requests")
            if len(self._streams) >= self.capacity:
                raise QueueFullError(
                    f"the server is at capacity ({len(self._streams)} requests in flight: "
                    f"{self.engine.scheduler.max_num_seqs} running seats + "
                    f"{self.capacity - self.engine.scheduler.max_num_seqs} queued); retry later")
            self.engine.add_request(c.prompt, c.params, request_id=c.request_id, chat=c.chat)
        except Exception as e:
            c.done.set_exception(e)
            return
        self._streams[c.request_id] = c.stream
        c.done.set_result(None)

    def _step(self) -> None:
        outputs = self.engine.step()
        self.snapshot.steps += 1
        self._route(outputs)
        self._take_snapshot()

    def _route(self, outputs: list[RequestOutput]) -> None:
        batch = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            batch.append((stream, out))
        if batch:
            self._deliver(batch)

    def _deliver(self, batch: list[tuple[RequestStream, RequestOutput]]) -> None:
        def push_all():
            for stream, out in batch:
                stream._push(out)

        try:
            self._aio.call_soon_threadsafe(push_all)
        except RuntimeError:  # the event loop is closed: nobody is left to read
            pass

    def _fail_all(self, reason: str) -> None:
        batch = [(s, RequestOutput(rid, "", [], finished=True, finish_reason="error",
                                   error=f"the engine loop failed: {reason}"))
                 for rid, s in self._streams.items()]
        self._streams.clear()
        self._deliver(batch)

    def _take_snapshot(self) -> None:
        sched = self.engine.scheduler
        pools = {"target": self.engine.target_kv, "draft": self.engine.draft_kv}
        self.snapshot = LoopSnapshot(
            in_flight=len(self._streams), running=len(sched.running), waiting=len(sched.waiting),
            steps=self.snapshot.steps,
            pools={name: PoolUse(kv.pool.num_pages, kv.pool.num_pages - kv.pool.free_pages,
                                 kv.pool.free_pages - kv.pool.available)
                   for name, kv in pools.items() if kv is not None},
            engine=dataclasses.replace(
                self.engine.stats,
                accepted_by_position=list(self.engine.stats.accepted_by_position)))
