"""GracefulServer: uvicorn's server, with the shutdown deadline kept by the engine.

uvicorn's own deadline (``timeout_graceful_shutdown``) cancels the tasks of responses still
running, which cuts their connections and logs a traceback for each. Here, ``deadline`` seconds
after SIGTERM (or Ctrl-C) the engine aborts whatever is still in flight instead, so each of
those clients gets a proper end: ``finish_reason: "abort"`` (then ``[DONE]`` when streaming).
uvicorn's deadline stays, a little later, as the backstop for a client that stopped reading.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import uvicorn

BACKSTOP_SECONDS = 5.0  # after the engine's abort, how long uvicorn waits before cutting


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, abort_in_flight: Callable[[], None],
                 deadline: float):
        config.timeout_graceful_shutdown = deadline + BACKSTOP_SECONDS
        super().__init__(config)
        self._abort_in_flight = abort_in_flight
        self._deadline = deadline

    async def shutdown(self, sockets=None) -> None:
        """Stops accepting, then waits for responses (uvicorn); the engine aborts what is still
        running once the deadline has passed."""
        asyncio.get_running_loop().call_later(self._deadline, self._abort_in_flight)
        await super().shutdown(sockets=sockets)
