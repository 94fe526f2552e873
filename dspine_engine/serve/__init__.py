"""dspine-serve: an OpenAI-compatible HTTP server on the engine (FastAPI + uvicorn).

    from dspine_engine.serve import build_app
    app = build_app(Engine(), "SmolLM2-135M-Instruct")   # any ASGI server can run it

`dspine-serve` (dspine_engine/cli/serve.py) loads the engine and runs this app with uvicorn.
One concern per module: protocol (request bodies -> engine parameters), engine_loop (the
background thread that drives the engine), responses (OpenAI output shapes, SSE), errors
(OpenAI-style JSON errors), metrics (Prometheus text), app (routes), graceful (uvicorn's
server with the engine keeping the shutdown deadline), launcher (runs dspine-serve as a
subprocess, for tests and benchmarks).
"""
from .app import build_app

__all__ = ["build_app"]
