"""A live `dspine-serve` for the server tests: started as a user would (a subprocess on a free
loopback port), waited for, and stopped with SIGTERM; plus small readers for SSE and /metrics."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"on http://([^ ]+):(\d+)/v1")


class Server:
    """``with Server([...args]) as s:`` runs ``python -m dspine_engine.cli.serve ARGS --port 0``;
    ``s.url`` is its base URL; stderr is collected in ``s.log`` (read continuously, so a chatty
    server never blocks on a full pipe)."""

    def __init__(self, args: list[str], start_timeout: float = 180.0):
        self.args = [sys.executable, "-m", "dspine_engine.cli.serve", "--port", "0",
                     "--quiet", "--log-level", "warning"] + list(args)
        self.start_timeout = start_timeout
        self.log: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._address = threading.Event()

    def __enter__(self) -> "Server":
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=env, cwd=ROOT)
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self._address.wait(self.start_timeout) or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError("dspine-serve did not start:\n" + "".join(self.log))
        deadline = time.monotonic() + 60
        while True:  # the socket is bound before the app starts: wait for /health
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError("dspine-serve never became healthy:\n" + "".join(self.log))
            time.sleep(0.1)

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            m = _LISTENING.search(line)
            if m and not self._address.is_set():
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                self._address.set()

    def send_sigterm(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code (killed after ``timeout``: the test fails then)."""
        self.send_sigterm()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                self.terminate()
        finally:
            self.kill()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def text_log(self) -> str:
        return "".join(self.log)


def metrics(url: str) -> dict[str, float]:
    """/metrics as {'name{labels}': value} (the Prometheus text format, comments dropped)."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def wait_idle(url: str, timeout: float = 10.0) -> dict[str, float]:
    """Polls /metrics until no request is in flight; returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if m["dspine_requests_in_flight"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


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
