"""dspine-serve as a command: --help explains, and set-up errors are clear one-liners (a taken
port is reported before the model loads)."""
import socket
import subprocess
import sys

import pytest


def _have_serve_extras() -> bool:
    try:
        import fastapi  # noqa: F401
    except ImportError:
        return False
    return True


# Past --help the command imports the server, which needs the serve extras.
needs_serve_extras = pytest.mark.skipif(not _have_serve_extras(),
                                        reason="needs the serve extras (pip install -e '.[serve]')")


def _serve(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "dspine_engine.cli.serve", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_help_explains_endpoints_and_flags():
    out = _serve("--help")
    assert out.returncode == 0
    for words in ("/v1/chat/completions", "/metrics", "--api-key", "--max-queue",
                  "127.0.0.1", "--draft", "--kv-cache-dtype"):
        assert words in out.stdout


@needs_serve_extras
def test_taken_port_is_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = _serve("--port", str(port), "--model", "/no/such/model", timeout=120)
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


@needs_serve_extras
@pytest.mark.parametrize("args,words", [(["--model", "/no/such/model"], "not found"),
                                        (["--draft", "/no/such/draft"], "does not exist")])
def test_bad_model_is_a_clear_error(tiny_llama, args, words):
    if args[0] == "--draft":
        args = ["--model", str(tiny_llama)] + args
    out = _serve("--port", "0", "--quiet", *args, timeout=120)
    assert out.returncode == 1 and words in out.stderr
    assert "Traceback" not in out.stderr
