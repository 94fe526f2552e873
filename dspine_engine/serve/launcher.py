"""Run `dspine-serve` as a subprocess and wait until it serves (the tests and the load benchmark
start their servers this way, as a user would: a real process on a free loopback port)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

_LISTENING = re.compile(r"on http://([^ ]+):(\d+)/v1")
_ROOT = Path(__file__).resolve().parent.parent.parent


class ServerProcess:
    """``with ServerProcess([...args]) as s:`` runs ``python -m dspine_engine.cli.serve ARGS
    --port 0`` and waits for /health; ``s.url`` is its base URL. stderr is read continuously
    into ``s.log`` (so a chatty server never blocks on a full pipe) and, with ``echo``, copied
    to this process's stderr. Leaving the block sends SIGTERM and waits for the exit."""

    def __init__(self, args: list[str], start_timeout: float = 600.0, echo: bool = False):
        self.args = [sys.executable, "-m", "dspine_engine.cli.serve", "--port", "0"] + list(args)
        self.start_timeout = start_timeout
        self.echo = echo
        self.log: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._address = threading.Event()

    def __enter__(self) -> "ServerProcess":
        path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env=dict(os.environ, PYTHONPATH=path))
        threading.Thread(target=self._read_stderr, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while not self._address.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("dspine-serve did not start:\n" + self.text_log())
        while not self._healthy():  # bound before the model loaded: wait for the app
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("dspine-serve never became healthy:\n" + self.text_log())
            time.sleep(0.1)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            if self.echo:
                sys.stderr.write(line)
            m = _LISTENING.search(line)
            if m and not self._address.is_set():
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                self._address.set()

    def send_sigterm(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code (killed, and TimeoutExpired raised, after ``timeout``)."""
        self.send_sigterm()
        return self.wait(timeout)

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code of a server already told to stop, sending nothing more: a second
        SIGTERM that lands while Python is tearing down (its handlers are gone by then) would
        end the process with -15 instead of its own exit code."""
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
        """The server's resident memory (Linux)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc")

    def text_log(self) -> str:
        return "".join(self.log)
