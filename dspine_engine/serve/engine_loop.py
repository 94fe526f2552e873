"""The engine loop: one background thread owns the Engine and drives its `step()`.

A step is a long blocking torch call (tens of milliseconds on the CPU); run on the event loop
it would stall every connection, so it runs here, and every engine call (submit, abort, step)
happens on this one thread: the server puts no locks around the engine. The event loop talks
to the thread through a FIFO command queue. Requests join and leave between steps (continuous
batching is the engine's: each step admits what fits and runs one round over everything
running).

Output routing is the engine's: each request is an `Engine.submit` handle, and the engine's
loop driver puts every output of a step into the handle of the request it belongs to. After
each step the thread takes what each open handle received (one merged output per request) and
hands it to the request's `RequestStream` on the event loop with `call_soon_threadsafe`.
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
from ..engine.handles import RequestHandle
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
    """One request's outputs on the event loop, in order; the last has ``finished=True``.
    Fed from the request's engine handle by the engine thread (which alone touches the
    handle)."""

    def __init__(self, owner: "EngineLoop",
                 on_finished: Callable[[RequestOutput], None] | None = None):
        self._owner = owner
        self._on_finished = on_finished  # called once with the finished output, read or not
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.final: RequestOutput | None = None  # set once the finished output has arrived
        self.handle: RequestHandle | None = None  # engine thread only: set when accepted

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
            self._owner._send(("abort", self))


@dataclass
class _Submit:
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
        self._claims = threading.Lock()  # settles who answers a submit (see _claim), no more
        # Accepted requests whose final output has not been handed on yet (engine thread
        # only). Each stream holds its engine handle: the engine says what is whose.
        self._open: list[RequestStream] = []
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
        """Queues a request. Raises what `Engine.submit` raises (ValueError, KVCacheFullError),
        QueueFullError or ShuttingDownError; nothing else is affected. ``on_finished`` runs on
        the event loop with the request's finished output, whether anyone reads the stream or
        not (metrics count aborted requests too)."""
        stream = RequestStream(self, on_finished)
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_Submit(request_id, prompt, params, chat, stream, done))
        if self._refusal() is not None:  # the thread may be gone: nobody would take it
            self._refuse(done)
        try:
            await asyncio.wrap_future(done)
        except asyncio.CancelledError:  # the client left while the request was being queued
            stream.abort()  # a no-op unless the submit went through after all
            raise
        return stream

    def abort_all(self) -> None:
        """Aborts every request in flight (the shutdown deadline); later ones are still taken.
        Each one's client gets its final output (finish_reason "abort")."""
        self._send(("abort_all", None))

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
                stepped = self.engine.has_unfinished()
                if stepped:
                    self.engine.step()  # submitted requests' outputs go to their handles
                    self.snapshot.steps += 1
                self._forward()  # also the final outputs of requests aborted just now
                self._take_snapshot()
                if not stepped:
                    if self._stopping:
                        return
                    self._wake.wait()
        except BaseException as e:  # a bug here must not leave requests waiting forever
            self._failed = f"{type(e).__name__}: {e}"  # first: submit() checks it after sending
            log.exception("the engine loop failed; failing every request in flight")
            self._fail_all(self._failed)
            self._refuse_queued()
            raise

    def _queued_commands(self):
        """The commands sent so far, in order, each taken off the queue."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _drain_commands(self) -> None:
        for command in self._queued_commands():
            if isinstance(command, _Submit):
                self._submit(command)
            elif command[0] == "abort":
                handle = command[1].handle
                if handle is not None:  # None: the submit was refused or never ran
                    handle.abort()
            elif command[0] == "abort_all":
                self._abort_open()
            elif command[0] == "stop":
                self._stopping = True
                self._abort_open()

    def _abort_open(self) -> None:
        for stream in self._open:
            stream.handle.abort()  # the final outputs go out with the next _forward

    def _submit(self, c: _Submit) -> None:
        if not self._claim(c.done):
            return  # the client left before the request reached the engine, or it was refused
        try:
            if self._refusal() is not None:
                raise self._refusal()
            if len(self._open) >= self.capacity:
                raise QueueFullError(
                    f"the server is at capacity ({len(self._open)} requests in flight: "
                    f"{self.engine.scheduler.max_num_seqs} running seats + "
                    f"{self.capacity - self.engine.scheduler.max_num_seqs} queued); retry later")
            c.stream.handle = self.engine.submit(c.prompt, c.params, request_id=c.request_id,
                                                 chat=c.chat)
        except Exception as e:
            c.done.set_exception(e)
            return
        self._open.append(c.stream)
        c.done.set_result(None)

    def _forward(self) -> None:
        """Hands each open request what its handle received since the last call."""
        batch, still_open = [], []
        for stream in self._open:
            out = stream.handle.take()
            if out is not None:
                batch.append((stream, out))
            if not stream.handle.finished:
                still_open.append(stream)
        self._open = still_open
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
        batch = [(s, RequestOutput(s.handle.request_id, "", [], finished=True,
                                   finish_reason="error",
                                   error=f"the engine loop failed: {reason}"))
                 for s in self._open]
        self._open = []
        self._deliver(batch)

    def _refuse_queued(self) -> None:
        """After a failure: refuses the submits already queued (later ones refuse themselves)."""
        for command in self._queued_commands():
            if isinstance(command, _Submit):
                self._refuse(command.done)

    def _refusal(self) -> ShuttingDownError | None:
        """Why no new request is taken now (None: they are). Either thread may ask."""
        if self._failed is not None:
            return ShuttingDownError(f"the engine loop failed ({self._failed}); the server "
                                     "takes no new requests")
        if self._stopping:
            return ShuttingDownError("the server is shutting down and takes no new requests")
        return None

    def _claim(self, done: concurrent.futures.Future) -> bool:
        """Takes a submit's future to settle it; False if the client cancelled it or the other
        thread took it first (both threads may try: the engine's, and a submit that finds the
        loop stopping or failed)."""
        with self._claims:
            return not (done.running() or done.done()) and done.set_running_or_notify_cancel()

    def _refuse(self, done: concurrent.futures.Future) -> None:
        if self._claim(done):
            done.set_exception(self._refusal())

    def _take_snapshot(self) -> None:
        sched = self.engine.scheduler
        pools = {"target": self.engine.target_kv, "draft": self.engine.draft_kv}
        self.snapshot = LoopSnapshot(
            in_flight=len(self._open), running=len(sched.running), waiting=len(sched.waiting),
            steps=self.snapshot.steps,
            pools={name: PoolUse(kv.pool.num_pages, kv.pool.num_pages - kv.pool.free_pages,
                                 kv.pool.free_pages - kv.pool.available)
                   for name, kv in pools.items() if kv is not None},
            engine=dataclasses.replace(
                self.engine.stats,
                accepted_by_position=list(self.engine.stats.accepted_by_position)))
