"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Every failure the server reports goes through `APIError`, so clients (the `openai` package
raises `BadRequestError`, `AuthenticationError`, ... from the status) always get a JSON body
that says what was wrong."""
from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 500: "server_error", 503: "service_unavailable_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first problem pydantic found, said plainly (with the field it concerns)."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({e.get('ctx', {}).get('error', e['msg'])})", None
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    field = ".".join(loc) or None
    if e.get("type") == "missing":
        return f"missing required field {field!r}", field
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    where = f"field {field!r}: " if field else ""
    return f"{where}{e['msg']}{more}", field


def install_handlers(app) -> None:
    """Routes every error (ours, pydantic's, Starlette's 404/405, a bug) to the OpenAI shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, field = _validation_message(exc)
        return APIError(400, message, param=field).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
