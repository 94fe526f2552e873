"""Helpers of the server tests: a live `dspine-serve` (a subprocess on a free loopback port,
stopped with SIGTERM), and readers for its server-sent events and /metrics."""
from __future__ import annotations

import json
import time

import httpx

from dspine_engine.serve.launcher import ServerProcess


class Server(ServerProcess):
    """A quiet dspine-serve with the given arguments."""

    def __init__(self, args: list[str]):
        super().__init__(["--quiet", "--log-level", "warning"] + list(args), start_timeout=300)


def parse_metrics(text: str) -> dict[str, float]:
    """The Prometheus text format as {'name{labels}': value}, comments dropped."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metrics(url: str) -> dict[str, float]:
    """/metrics of the server at ``url``."""
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def wait_idle(url: str, timeout: float = 10.0) -> dict[str, float]:
    """Polls /metrics until no request is in flight; returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if m["dspine_requests_in_flight"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


async def wait_for_metric(client, name: str, at_least: float, tasks, timeout: float = 30.0
                          ) -> float:
    """Polls /metrics on the event loop (a blocking poll would stall the requests in ``tasks``)
    until ``name`` reaches ``at_least``; returns the reading. Bounded: should the requests all
    finish first, or the deadline pass, it fails instead of waiting forever (a poll without a
    bound once hung CI)."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout
    while (seen := parse_metrics((await client.get("/metrics")).text)[name]) < at_least:
        assert asyncio.get_running_loop().time() < deadline, f"{name} = {seen} after {timeout} s"
        assert not all(t.done() for t in tasks), f"the requests finished with {name} = {seen}"
        await asyncio.sleep(0.01)
    return seen


def sse_events(lines) -> list:
    """The JSON events of a server-sent-event body up to ``[DONE]`` (which must come last)."""
    events, done = [], False
    for line in lines:
        if not line:
            continue
        assert line.startswith("data: "), line
        assert not done, "data after [DONE]"
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
        else:
            events.append(json.loads(payload))
    assert done, "the stream did not end with data: [DONE]"
    return events
