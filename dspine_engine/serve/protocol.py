"""The OpenAI request bodies the server accepts, and what each becomes for the engine.

Pydantic checks shapes and types (a wrong type is a 400 before anything is queued); value
ranges (temperature >= 0, top_p in (0, 1], ...) are the engine's to check, in one place
(`SamplingParams.validate` via `add_request`). Parameters this server does not implement are
refused by name when they ask for something (n > 1, logprobs, penalties, tools, ...) and
ignored when they carry their neutral value, so ordinary clients that always send them work.
Unknown fields are ignored, as the OpenAI API and vLLM do.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..engine.sampling import SamplingParams
from .errors import APIError


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None  # OpenAI's default is 1 (sampling), not the engine's 0
    top_p: float | None = None
    top_k: int | None = None  # extra (not in the OpenAI API; vLLM's spelling)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # extra, for benchmarks that need fixed output lengths
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's parameters for this request (refuses what the engine cannot do)."""
        self._refuse_unsupported()
        max_tokens = self._max_tokens()
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0, seed=self.seed, stop=stop, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _refuse_unsupported(self) -> None:
        if self.n not in (None, 1):
            raise APIError(400, f"n={self.n} is not supported: this server returns one choice "
                                "per request (send n=1 or leave it out, and send several "
                                "requests for several answers)", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported by this server (leave it out or "
                                    "send 0)", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported by this server", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true",
                           param="stream_options")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None

    def as_engine_message(self) -> dict:
        content = self.content
        if content is None:
            raise APIError(400, f"a {self.role!r} message needs text content (tool calls are not "
                                "supported)", param="messages")
        if isinstance(content, list):
            kinds = sorted({p.type for p in content if p.type != "text"})
            if kinds:
                raise APIError(400, f"message content of type {', '.join(kinds)} is not "
                                    "supported: this server takes text only", param="messages")
            content = "".join(p.text or "" for p in content)
        return {"role": self.role, "content": content}


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def _max_tokens(self) -> int | None:
        # max_completion_tokens replaced max_tokens in the OpenAI API; it wins when both come.
        return self.max_completion_tokens if self.max_completion_tokens is not None else (
            self.max_tokens)

    def _refuse_unsupported(self) -> None:
        super()._refuse_unsupported()
        if self.logprobs or self.top_logprobs:
            raise APIError(400, "logprobs are not supported by this server (leave out logprobs "
                                "and top_logprobs)", param="logprobs")
        if self.tools or self.functions or self.tool_choice not in (None, "none"):
            raise APIError(400, "tools and function calling are not supported by this server",
                           param="tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise APIError(400, "response_format other than text is not supported by this "
                                "server", param="response_format")

    def engine_prompt(self) -> list[dict]:
        if not self.messages:
            raise APIError(400, "messages must hold at least one message", param="messages")
        return [m.as_engine_message() for m in self.messages]


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def _refuse_unsupported(self) -> None:
        super()._refuse_unsupported()
        if self.logprobs is not None:
            raise APIError(400, "logprobs are not supported by this server (leave logprobs out)",
                           param="logprobs")
        if self.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported by this server", param="suffix")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported by this server (send 1 or leave it "
                                "out)", param="best_of")

    def engine_prompt(self) -> str | list[int]:
        """One prompt: a string or a token-id list (sent as is, no chat template)."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise APIError(400, f"{len(p)} prompts in one request: this server takes one "
                                    "prompt per request (send several requests)", param="prompt")
            p = p[0]
        if not p:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return p

