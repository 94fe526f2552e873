"""The loop driver: the one owner of the engine's step, and of where each output goes.

A step is one prefill batch or one decode/speculative round over the running requests. Every
output a step produces is routed to its request's `RequestHandle`, whoever asked for the step:
`generate()`, `stream()`, a handle's iterator, an async server task or a step-API caller. Steps
are serialised by a lock, so threads or tasks may drive the engine concurrently.

Overlapped rounds (``overlap``; EngineConfig.overlap): a round step launches the next round
before it finishes the one in flight, so the host's work on a round's results (lengths, stops,
text, outputs) runs while the device computes the next round, from the state the device keeps
per seat (seat_state.py). A step then delivers the previous round's tokens; a prefill step
leaves the round in flight as it is (stream order keeps the device's work apart), and the
last round in flight is finished when nothing is left to launch.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time

from .handles import RequestHandle
from .outputs import RequestOutput
from .cache_manager import CacheManager
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .speculative import LaunchedRound, finish_round, launch_round, speculative_round

log = logging.getLogger("dspine_engine")


class EngineDeadError(RuntimeError):
    """A failure after which the engine cannot run another step (a tensor-parallel worker died).
    Unlike a failed batch, it is not contained: every unfinished request ends with the error,
    and the step raises it to whoever drove it."""


class LoopDriver:
    def __init__(self, scheduler: Scheduler, runner, stats, has_draft: bool, policy=None,
                 overlap: bool = False):
        self.scheduler = scheduler
        self.overlap = overlap
        self._flight: list[LaunchedRound] = []  # the overlapped round's groups, not read yet
        self.runner = runner
        self.policy = policy  # how many drafts each round verifies (spec_policy.py)
        self.stats = stats  # EngineStats, totals over the engine's life
        self.has_draft = has_draft
        self._lock = threading.Lock()
        self._seqs: dict[str, Sequence] = {}  # unfinished requests
        self._handles: dict[str, RequestHandle] = {}  # ids in use (unfinished or unread)
        self._step_api: dict[str, RequestHandle] = {}  # handles read by step() (insertion order)
        # Step-API requests with outputs not yet returned -> their insertion number: step() reads
        # only these (not every queued request) and returns them in insertion order.
        self._news: dict[str, int] = {}
        self._order: dict[str, int] = {}
        self._serial = itertools.count()

    # ------------------------------------------------------------------ requests
    def in_use(self, request_id: str) -> bool:
        return request_id in self._handles

    def add(self, seq: Sequence, step_api: bool = False,
            queue_outputs: bool = True) -> RequestHandle:
        """Queues a sequence (the scheduler may refuse it: KVCacheFullError). ``step_api``: its
        outputs are returned by `step_api_outputs`; ``queue_outputs=False``: the handle only
        collects the result (for `generate`)."""
        with self._lock:
            if seq.request_id in self._handles:
                raise ValueError(f"request id {seq.request_id!r} is already in use")
            self.scheduler.add(seq)
            handle = RequestHandle(self, seq.request_id, seq.prompt, seq.stats, queue_outputs,
                                   keep_result=not step_api)
            self._seqs[seq.request_id] = seq
            self._handles[seq.request_id] = handle
            if step_api:
                self._step_api[seq.request_id] = handle
                self._order[seq.request_id] = next(self._serial)
            self.stats.requests += 1
            return handle

    def abort(self, request_id: str) -> bool:
        """Stops a request; its pages go back at once and its handle gets the final output.
        Returns False for an unknown or already finished id."""
        with self._lock:
            seq = self._seqs.get(request_id)
            if seq is None:
                return False
            self.scheduler.finish(seq, "abort")
            self._deliver(self._finished_output(seq, ""))
            return True

    def has_work(self) -> bool:
        """Requests to run, or step-API outputs not yet returned by `step_api_outputs`."""
        return self.scheduler.has_work() or bool(self._news)

    def settle(self) -> None:
        """Finishes the round in flight, if any (its outputs go to their requests): afterwards
        the host's state is the device's, as between two rounds without overlap."""
        with self._lock:
            self._step_guarded(self._finish_flight, None, self._flight_seqs)

    # ------------------------------------------------------------------ driving
    def advance(self, blocking: bool = True) -> bool:
        """Runs one step if there is work. Returns False when it ran nothing (no work, or another
        caller holds the step and ``blocking`` is False)."""
        if not self._lock.acquire(blocking):
            return False
        try:
            return self._step()
        finally:
            self._lock.release()

    def advance_until(self, ready, request_id: str, blocking: bool = True) -> bool:
        """One step on behalf of a consumer of ``request_id`` unless ``ready()`` already holds
        (another caller's step may have made it so). Raises instead of looping forever if the
        engine has nothing left to do while the consumer still waits. Returns False when
        ``blocking`` is False and another caller holds the step."""
        if ready():
            return True
        if not self._lock.acquire(blocking):
            return False
        try:
            if not ready() and not self._step() and not ready():
                raise RuntimeError(f"request {request_id!r} is waiting but the engine has no "
                                   "work left (this is a bug)")
            return True
        finally:
            self._lock.release()

    def step_api_outputs(self) -> list[RequestOutput]:
        """The outputs of step-API requests since the last call, one merged output each (in the
        order the requests were added)."""
        with self._lock:  # a step in another thread may be adding news
            news, self._news = self._news, {}
            outs = []
            for rid in sorted(news, key=news.__getitem__):
                handle = self._step_api[rid]
                out = handle.take()
                if out is not None:
                    outs.append(out)
                if handle.done:
                    del self._step_api[rid]
                    del self._order[rid]
                    self._handles.pop(rid, None)
            return outs

    # ------------------------------------------------------------------ one step
    def _step(self) -> bool:
        admitted = self.scheduler.admit()
        if admitted:  # a failed prefill fails its own requests (a round in flight goes on)
            return self._step_guarded(lambda: self._prefill(admitted), admitted,
                                      lambda: admitted)
        batch = list(self.scheduler.running)
        if not batch:  # what is in flight belongs to ended requests: finish it, emit nothing
            return self._step_guarded(self._finish_flight, None, self._flight_seqs)
        if self.overlap:
            return self._step_guarded(lambda: self._overlapped_round(batch), None,
                                      lambda: batch + self._flight_seqs())
        return self._step_guarded(lambda: speculative_round(self.runner, self.scheduler, batch,
                                                            self.stats, self.policy),
                                  batch, lambda: batch)

    def _step_guarded(self, work, emitted: list[Sequence] | None, failing) -> bool:
        """Runs one step's ``work`` (returning {request id: new tokens}, or None when there was
        nothing to do), then routes the tokens to ``emitted`` (None: the requests that got
        tokens). If the work fails, ``failing()`` requests end with the error, not the engine
        (a round in flight among them is dropped); a dead engine fails them all and raises."""
        t0 = time.perf_counter()
        try:
            with self.runner.threads():
                new_tokens = work()
        except EngineDeadError as e:
            self._flight = []
            log.error("engine stopped: %s", e)
            self._fail_all(f"{type(e).__name__}: {e}")
            raise
        except Exception as e:  # a failed batch must not take the engine down
            log.exception("step failed")
            failed = failing()
            if not set(self._flight_seqs()).isdisjoint(failed):
                self._flight = []
            for s in failed:
                if s.status is not Status.FINISHED:
                    self.scheduler.finish(s, "error", error=f"{type(e).__name__}: {e}")
                    self._deliver(self._finished_output(s, ""))
            return True
        if new_tokens is None:
            return False
        self.stats.busy_seconds += time.perf_counter() - t0
        self.stats.new_tokens += sum(map(len, new_tokens.values()))
        seqs = emitted if emitted is not None else [self._seqs[r] for r in new_tokens]
        for seq in seqs:
            self._emit(seq, new_tokens.get(seq.request_id, []))
        return True

    def _overlapped_round(self, batch: list[Sequence]) -> dict[str, list[int]]:
        """Launches the batch's round (a launch per group of the policy's plan, which reads
        the acceptance observed up to the round in flight), then finishes the one before."""
        groups = (self.policy.plan(batch) if self.policy is not None
                  else [(self.runner.block, batch)])
        launched = [launch_round(self.runner, self.scheduler, group, tokens)
                    for tokens, group in groups]
        done = self._finish_flight() or {}
        self._flight = launched
        return done

    def _finish_flight(self) -> dict[str, list[int]] | None:
        """The new tokens of the round in flight (None when there is none)."""
        flight, self._flight = self._flight, []
        if not flight:
            return None
        new_tokens = {}
        for launched in flight:
            new_tokens.update(finish_round(self.runner, launched, self.scheduler, self.stats,
                                           self.policy, timed=False))
        return new_tokens

    def _flight_seqs(self) -> list[Sequence]:
        return [s for launched in self._flight for s in launched.seqs]

    def _fail_all(self, error: str) -> None:
        """Ends every unfinished request (running or waiting) with ``error``."""
        for seq in list(self._seqs.values()):
            self.scheduler.finish(seq, "error", error=error)
            self._deliver(self._finished_output(seq, ""))

    def _prefill(self, seqs: list[Sequence]) -> dict[str, list[int]]:
        seats = CacheManager.seats_of(seqs)
        logits, taps = self.runner.prefill(seqs, seats)
        first = self.runner.sample_prefill(seqs, seats, logits).tolist()
        if self.has_draft:
            self.runner.ingest_prompt_context(seqs, seats, taps)
        self.scheduler.prefilled(seqs)
        return {seq.request_id: seq.commit([tok]) for seq, tok in zip(seqs, first)}

    # ------------------------------------------------------------------ outputs
    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        """Routes one sequence's tokens of a step (once per sequence and step: kept lean)."""
        detok, text = seq.detok, ""
        if detok is not None:
            if tokens:
                text = detok.add(tokens)
            if detok.stopped_by is not None:
                seq.finish_reason = "stop"
        handle = self._handles[seq.request_id]
        if seq.finish_reason is not None:
            self.scheduler.finish(seq, seq.finish_reason)
            self._deliver(self._finished_output(seq, text, tokens))
        elif handle.wants_deltas:
            self._put(handle, RequestOutput(seq.request_id, text, tokens, False))
        else:
            handle.collect(text, tokens)  # generate(): no per-step output object

    def _finished_output(self, seq: Sequence, text: str, tokens=()) -> RequestOutput:
        if seq.detok is not None:
            text += seq.detok.flush()
        seq.stats.elapsed = time.perf_counter() - seq.t_admitted
        self._seqs.pop(seq.request_id, None)
        return RequestOutput(seq.request_id, text, list(tokens), finished=True,
                             finish_reason=seq.finish_reason, error=seq.error, stats=seq.stats)

    def _deliver(self, out: RequestOutput) -> None:
        handle = self._handles[out.request_id]
        self._put(handle, out)
        if out.finished and out.request_id not in self._step_api:
            del self._handles[out.request_id]  # its consumer holds the handle; the id is free

    def _put(self, handle: RequestHandle, out: RequestOutput) -> None:
        handle.put(out)
        order = self._order.get(out.request_id)
        if order is not None:  # a step-API request: step() returns it next
            self._news[out.request_id] = order
