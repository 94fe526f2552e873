"""What the server sends back, in the OpenAI shapes: whole responses, streamed chunks (as
server-sent events ending with ``data: [DONE]``) and usage, for both endpoints."""
from __future__ import annotations

import json
import time

from ..engine.outputs import RequestStats

SSE_DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage(stats: RequestStats | None) -> dict:
    prompt = stats.prompt_tokens if stats else 0
    completion = stats.new_tokens if stats else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class ResponseShape:
    """Builds the objects of one request's answer (chat: ``chat.completion`` and
    ``chat.completion.chunk``; completions: ``text_completion``)."""

    def __init__(self, chat: bool, response_id: str, model: str, include_usage: bool = False):
        self.chat = chat
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage  # streamed chunks carry "usage": null, the last one
        # (empty choices) the totals, as the OpenAI API does with stream_options.include_usage

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def full(self, text: str, finish_reason: str, stats: RequestStats | None) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": finish_reason, "logprobs": None}
            out = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish_reason,
                      "logprobs": None}
            out = self._envelope("text_completion", [choice])
        out["usage"] = usage(stats)
        return out

    def chunk(self, text: str | None = None, finish_reason: str | None = None,
              first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason,
                      "logprobs": None}
            out = self._envelope("chat.completion.chunk", [choice])
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason,
                      "logprobs": None}
            out = self._envelope("text_completion", [choice])
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, stats: RequestStats | None) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = self._envelope(obj, [])
        out["usage"] = usage(stats)
        return out


def finish_reason(engine_reason: str | None) -> str:
    """The engine's reasons are the API's ("stop", "length"); "abort" stays as vLLM sends it."""
    return engine_reason or "stop"
