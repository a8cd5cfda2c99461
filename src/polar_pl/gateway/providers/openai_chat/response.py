"""Engine chat completion -> the OpenAI Chat response the harness sees: the engine-only fields
(`prompt_token_ids`, `token_ids`, logprobs the harness did not ask for, `policy_version`) are
stripped and the harness's model name is echoed, so the harness sees plain OpenAI output. Also the
error shape and the model list.
"""

from __future__ import annotations

import re
from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest

ENGINE_ONLY_TOP = ("prompt_token_ids", "prompt_text", "policy_version", "kv_transfer_params", "metrics")


def public_choice(ch: dict[str, Any], keep_logprobs: bool) -> dict[str, Any]:
    out = {k: v for k, v in ch.items() if k not in ("token_ids", "logprobs", "stop_reason")}
    out["logprobs"] = ch.get("logprobs") if keep_logprobs else None
    return out


def from_chat(response: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
    keep = req.extra.get("logprobs", False)
    out = {k: v for k, v in response.items() if k not in ENGINE_ONLY_TOP}
    out["model"] = req.model or response.get("model", "")
    out["object"] = "chat.completion"
    out["choices"] = [public_choice(c, keep) for c in response.get("choices") or ()]
    return out


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_ERROR_CODES = {401: "invalid_api_key", 404: "not_found", 429: "rate_limit_exceeded", 504: "timeout"}
# OpenAI's code for a prompt past the context; Codex stops retrying on it instead of hammering an
# engine with a prompt that cannot fit.
CONTEXT_TOO_LONG = re.compile(r"context length|context window|maximum context|too many tokens", re.IGNORECASE)


def error_body(status: int, message: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error"),
            "param": None,
            "code": "context_length_exceeded"
            if CONTEXT_TOO_LONG.search(message)
            else _ERROR_CODES.get(status),
        }
    }


def models_list(name: str) -> dict[str, Any]:
    """`GET /v1/models`: the served model."""
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "polar_pl"}],
    }
