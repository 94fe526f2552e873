"""dspine-serve: an OpenAI-compatible HTTP server on the engine."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path

from .generate import add_model_arguments

DESCRIPTION = """\
Serve a target model (optionally with a DSpine or DFlash draft, through lossless speculative
decoding) behind an OpenAI-compatible HTTP API:

  POST /v1/chat/completions   chat (the model's chat template), stream or not
  POST /v1/completions        raw text or token-id prompts, stream or not
  GET  /v1/models             the served model
  GET  /health                200 while the engine loop runs
  GET  /metrics               Prometheus text: requests, tokens, tokens/s, tau, acceptance by
                              block position, queue length, KV pool use

Parameters: max_tokens / max_completion_tokens, temperature (default 1, as in the OpenAI API;
0 = greedy), top_p, top_k (extra), seed, stop (string or list), ignore_eos (extra), stream,
stream_options.include_usage. n must be 1; logprobs, penalties and tools are refused with a
400 that says so. The server binds to loopback unless --host says otherwise."""

EPILOG = """\
examples:
  dspine-serve                                   # SmolLM2-135M-Instruct on 127.0.0.1:8000
  dspine-serve --draft default --device cuda     # + the shipped DSpine drafter
  dspine-serve --model path/to/Qwen3-8B --draft path/to/dspine-draft --api-key secret
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi!"}]}'
  python -c "from openai import OpenAI; c = OpenAI(base_url='http://127.0.0.1:8000/v1', \\
      api_key='none'); print(c.chat.completions.create(model='SmolLM2-135M-Instruct', \\
      messages=[{'role': 'user', 'content': 'Hi!'}]).choices[0].message.content)"
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dspine-serve", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free one)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--dtype", default="auto",
                   help="gguf, float32, bfloat16 or float16 (default: bfloat16 on CUDA; on the "
                        "CPU the GGUF's own quantised blocks for a .gguf or the default model, "
                        "float32 for a model directory)")
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="requests decoded together (continuous batching; default 64)")
    p.add_argument("--kv-cache-tokens", type=int, default=None,
                   help="target KV pool size in tokens (default: 32K on the CPU, half the free "
                        "GPU memory on CUDA)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context limit (default: the model's)")
    p.add_argument("--max-queue", type=int, default=512,
                   help="requests that may wait beyond the --max-num-seqs running ones; more "
                        "are refused with 503 (default 512)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens of requests that do not say (default 256)")
    p.add_argument("--api-key", default=os.environ.get("DSPINE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $DSPINE_API_KEY, "
                        "else no key)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: the model's directory name; "
                        "SmolLM2-135M-Instruct for the default model)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds to let in-flight requests finish before aborting "
                        "them (their answers end with finish_reason \"abort\"; default 30)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default info: one line per request)")
    p.add_argument("--quiet", action="store_true", help="no progress bars while loading")
    return p


def served_name(model) -> str:
    from ..models.default_model import _DEFAULT_SPECS, MODEL_NAME

    if model is None or str(model).lower() in _DEFAULT_SPECS:
        return MODEL_NAME
    path = Path(model)
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name


def _bind(host: str, port: int) -> socket.socket:
    """Binds before the model loads, so a taken port fails at once rather than after it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import uvicorn

        from ..serve import build_app
        from ..serve.graceful import GracefulServer
    except ImportError as e:
        print(f"dspine-serve: the server needs its extras ({e.name} is missing): "
              "pip install -e '.[serve]' (or pip install fastapi uvicorn prometheus_client)",
              file=sys.stderr)
        return 2
    from .. import Engine
    from .generate import _draft_choice, spec_settings

    try:
        sock = _bind(args.host, args.port)
    except OSError as e:
        print(f"dspine-serve: error: cannot listen on {args.host}:{args.port}: {e.strerror}",
              file=sys.stderr)
        return 1
    draft = _draft_choice(args)
    try:
        engine = Engine(args.model, draft=draft, device=args.device,
                        dtype=args.dtype, kv_cache_tokens=args.kv_cache_tokens,
                        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        progress=not args.quiet,
                        tensor_parallel_size=args.tensor_parallel_size,
                        kv_cache_dtype=args.kv_cache_dtype, **spec_settings(args))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"dspine-serve: error: {e}", file=sys.stderr)
        return 1
    name = args.served_model_name or served_name(args.model)
    app = build_app(engine, name, api_key=args.api_key, max_queue=args.max_queue,
                    default_max_tokens=args.default_max_tokens,
                    shutdown_timeout=args.shutdown_timeout)
    config = uvicorn.Config(app, log_level=args.log_level)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    mode = ("autoregressive" if draft is None
            else f"draft {draft}, {engine.config.spec_policy} verification")
    weights = "gguf" if engine.quantized else str(engine.dtype).replace("torch.", "")
    print(f"dspine-serve: {name} ({mode}, {engine.device} {weights}) on http://{shown}:{port}/v1"
          f"{' (API key required)' if args.api_key else ''}", file=sys.stderr, flush=True)
    # uvicorn handles SIGTERM (stop accepting, let requests finish, then shut the app down) and
    # re-raises the signal afterwards; this handler receives it, so the exit code is 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server = GracefulServer(config, app.state.abort_in_flight, args.shutdown_timeout)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        return 130
    print("dspine-serve: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
