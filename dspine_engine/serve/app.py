"""The HTTP front: an OpenAI-compatible FastAPI app on one engine.

Routes: POST /v1/chat/completions, POST /v1/completions (whole responses, or server-sent
events with ``stream: true``), GET /v1/models, GET /health, GET /metrics. A request becomes one
engine request on the engine loop (engine_loop.py); the engine's validation decides what is a
bad parameter, and every refusal is an OpenAI-style JSON error (errors.py). A client that goes
away, while streaming or while waiting for a whole response, aborts its request at once.
"""
from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine.engine import Engine
from ..engine.kv_cache import KVCacheFullError
from .engine_loop import EngineLoop, QueueFullError, RequestStream, ShuttingDownError
from .errors import APIError, install_handlers
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest
from .responses import SSE_DONE, ResponseShape, finish_reason, sse


def build_app(engine: Engine, served_model_name: str, api_key: str | None = None,
              max_queue: int = 512, default_max_tokens: int = 256,
              shutdown_timeout: float = 30.0) -> FastAPI:
    """The app serving ``engine`` as model ``served_model_name``. The engine loop starts with
    the app (its lifespan) and stops with it, aborting whatever is still in flight."""
    loop = EngineLoop(engine, max_queue)
    metrics = ServerMetrics(lambda: loop.snapshot)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        yield
        await asyncio.to_thread(loop.stop, shutdown_timeout)

    app = FastAPI(title="dspine-serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.abort_in_flight = loop.abort_all  # the shutdown deadline (graceful.py)
    install_handlers(app)
    app.add_middleware(_CountRefusals, metrics=metrics)

    def check_api_key(authorization: str | None = Header(default=None)) -> None:
        if api_key is None:
            return
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 api_key.encode()):
            raise APIError(401, "invalid API key: send 'Authorization: Bearer <key>' with the "
                                "key the server was started with (--api-key)",
                           code="invalid_api_key")

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [{
            "id": served_model_name, "object": "model", "created": started,
            "owned_by": "dspine_engine", "max_model_len": engine.max_model_len,
            "draft": engine.draft is not None}]}

    @v1.post("/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await serve(request, body, chat=True)

    @v1.post("/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await serve(request, body, chat=False)

    app.include_router(v1)

    @app.get("/health")
    async def health():
        if not loop.healthy:
            raise APIError(503, "the engine loop is not running")
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def serve(request: Request, body, chat: bool):
        if body.model != served_model_name:
            raise APIError(400, f"model {body.model!r} is not served here; this server serves "
                                f"{served_model_name!r} (see GET /v1/models)", param="model",
                           code="model_not_found")
        params = body.sampling_params(default_max_tokens)
        prompt = body.engine_prompt()
        endpoint = "chat" if chat else "completion"
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        stream = await submit(rid, prompt, params, chat, endpoint)
        shape = ResponseShape(chat, rid, served_model_name, body.include_usage)
        if body.stream:
            return StreamingResponse(_events(stream, shape), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _whole(request, stream, shape)

    async def submit(rid, prompt, params, chat: bool, endpoint: str) -> RequestStream:
        def on_finished(out):
            metrics.observe_finished(endpoint, out.finish_reason, out.stats)

        try:
            # Completion prompts are sent as they are; chat prompts are messages (templated).
            return await loop.submit(rid, prompt, params, chat=None if chat else False,
                                     on_finished=on_finished)
        except ValueError as e:
            raise APIError(400, str(e)) from None
        except KVCacheFullError as e:
            raise APIError(400, str(e), code="context_length_exceeded") from None
        except QueueFullError as e:
            raise APIError(503, str(e), code="queue_full") from None
        except ShuttingDownError as e:
            raise APIError(503, str(e), code="shutting_down") from None

    return app


async def _events(stream: RequestStream, shape: ResponseShape):
    """The SSE body of a streamed request. If the client goes away, Starlette cancels this
    generator; ``finally`` then aborts the request so its pages go back at once."""
    try:
        if shape.chat:
            yield sse(shape.chunk(first=True))
        async for out in stream:
            if out.new_text:
                yield sse(shape.chunk(out.new_text))
        final = stream.final
        if final.finish_reason == "error":
            yield sse(APIError(500, f"generation failed: {final.error}").body())
        else:
            yield sse(shape.chunk(finish_reason=finish_reason(final.finish_reason)))
            if shape.include_usage:
                yield sse(shape.usage_chunk(final.stats))
        yield SSE_DONE
    finally:
        stream.abort()


async def _whole(request: Request, stream: RequestStream, shape: ResponseShape):
    """A whole response; gives up (and aborts the request) if the client disconnects first."""

    async def collect() -> str:
        return "".join([out.new_text async for out in stream])

    reading = asyncio.create_task(collect())
    leaving = asyncio.create_task(_disconnected(request))
    try:
        await asyncio.wait({reading, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        leaving.cancel()
        if not reading.done():
            reading.cancel()
            stream.abort()
    if not reading.done() or reading.cancelled():
        return Response(status_code=499)  # nobody is listening any more
    text = reading.result()
    final = stream.final
    if final.finish_reason == "error":
        raise APIError(500, f"generation failed: {final.error}")
    return JSONResponse(shape.full(text, finish_reason(final.finish_reason), final.stats))


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read by then, so the
    next ASGI message can only be the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _CountRefusals:
    """Counts every response with an error status in /metrics (a pure ASGI middleware: it must
    not buffer streamed responses or hide client disconnects)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start" and message["status"] >= 400:
                self.metrics.observe_refused(message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)
