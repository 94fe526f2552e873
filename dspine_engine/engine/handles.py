"""RequestHandle: where one request's outputs go, whoever drives the engine.

The loop driver routes every output of a step to its request's handle; consumers read from the
handle, never from the step that happened to produce the output. So two streams advanced in
turn, a `generate()` call and step-API requests can share one engine and each gets its complete
output exactly once.

A handle is read in one of three ways:
- ``for out in handle`` (sync): drives the engine while it has nothing to give;
- ``async for out in handle``: the same, yielding to the event loop between steps, and waiting
  instead of stepping while another caller (a thread or task) is in a step;
- not at all: a request added with `Engine.add_request` has its outputs merged in the handle
  until the next `Engine.step()` returns them (the step API).
"""
from __future__ import annotations

import asyncio
from collections import deque

from .outputs import GenerationResult, RequestOutput, RequestStats


class RequestHandle:
    def __init__(self, driver, request_id: str, prompt, stats: RequestStats,
                 queue_outputs: bool = True, keep_result: bool = True):
        self._driver = driver
        self.request_id = request_id
        self.prompt = prompt
        self._stats = stats  # the sequence's live stats (final once finished)
        self._pending: deque[RequestOutput] = deque()
        self._queue_outputs = queue_outputs  # False: only the result is wanted (generate)
        self._keep_result = keep_result  # False: no result() reader (the step API): no copy
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self.final: RequestOutput | None = None  # the finished output, once there is one

    # ------------------------------------------------------------------ fed by the driver
    @property
    def wants_deltas(self) -> bool:
        """Whether each step's output is queued (False: only the result is kept)."""
        return self._queue_outputs

    def put(self, out: RequestOutput) -> None:
        if self._keep_result:
            self.collect(out.new_text, out.new_token_ids)
        if out.finished:
            self.final = out
        if self._queue_outputs:
            self._pending.append(out)

    def collect(self, text: str, token_ids: list[int]) -> None:
        """Adds a step's news to the result only."""
        if text:
            self._text.append(text)
        self._token_ids.extend(token_ids)

    # ------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        """The request is over (its final output may still be unread)."""
        return self.final is not None

    @property
    def done(self) -> bool:
        """Finished and every output read."""
        return self.final is not None and not self._pending

    @property
    def stats(self) -> RequestStats:
        """Live statistics (tokens so far, rounds, acceptance); final once finished."""
        return self._stats

    def abort(self) -> bool:
        return self._driver.abort(self.request_id)

    # ------------------------------------------------------------------ reading
    def _readable(self) -> bool:
        return bool(self._pending) or self.finished

    def take(self) -> RequestOutput | None:
        """Everything that arrived since the last read, merged into one output (or None)."""
        if not self._pending:
            return None
        out = self._pending.popleft()
        while self._pending:
            out = merge(out, self._pending.popleft())
        return out

    def __iter__(self):
        while not self.done:
            self._driver.advance_until(self._readable, self.request_id)
            while self._pending:
                yield self._pending.popleft()

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        while not self.done:
            if not self._driver.advance_until(self._readable, self.request_id, blocking=False):
                await asyncio.sleep(0.001)  # another caller is in a step: let it finish
            while self._pending:
                yield self._pending.popleft()
            await asyncio.sleep(0)  # let other requests' tasks read their outputs

    def result(self) -> GenerationResult:
        """Drives the engine until the request finishes; returns its whole result."""
        while not self.finished:
            self._driver.advance_until(lambda: self.finished, self.request_id)
        self._pending.clear()
        f = self.final
        return GenerationResult(self.request_id, self.prompt, "".join(self._text),
                                list(self._token_ids), f.finish_reason, f.stats, error=f.error)


def merge(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """Two consecutive outputs of one request as one (b's end state, both deltas)."""
    return RequestOutput(a.request_id, a.new_text + b.new_text,
                         a.new_token_ids + b.new_token_ids, b.finished, b.finish_reason,
                         b.error, b.stats)
