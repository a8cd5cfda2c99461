"""OpenAI-shaped errors for the engine server.

Body: {"error": {"message", "type", "param", "code"}} with the HTTP status. `code` is the OpenAI
error code string where one exists (`context_length_exceeded`, `model_not_found`), otherwise the
status as an int, which is what vLLM puts there.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse


class EngineError(Exception):
    """Raised by request handling; turned into the error JSON by the app's exception handler."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        *,
        param: str | None = None,
        code: str | int | None = None,
        err_type: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code if code is not None else status
        self.err_type = err_type or _type_for(status)


def _type_for(status: int) -> str:
    return {
        400: "BadRequestError",
        401: "AuthenticationError",
        403: "PermissionDeniedError",
        404: "NotFoundError",
        422: "UnprocessableEntityError",
        503: "ServiceUnavailableError",
    }.get(status, "InternalServerError")


def error_body(exc: EngineError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.err_type, "param": exc.param, "code": exc.code}}


def error_response(exc: EngineError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status, headers=headers)


def context_length_error(prompt_len: int, max_model_len: int) -> EngineError:
    return EngineError(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains {prompt_len} input tokens, which exceeds this limit even without any output "
        "tokens. Please reduce the length of the input prompt.",
        HTTPStatus.BAD_REQUEST,
        param="input_tokens",
        code="context_length_exceeded",
    )


def model_not_found(name: str, valid: list[str]) -> EngineError:
    """vLLM's answer to a model name it does not serve (an unknown name, or an adapter not held)."""
    return EngineError(
        f"The model `{name}` does not exist. Valid aliases: {', '.join(valid)}.",
        HTTPStatus.NOT_FOUND,
        param="model",
        code="model_not_found",
    )
