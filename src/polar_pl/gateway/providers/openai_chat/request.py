"""OpenAI Chat request -> the engine's chat body.

The engine speaks this API already, so conversion is a normalizing pass-through: it copies the
conversation (never mutating the raw request), maps `developer` to `system`, keeps only function
tools, rewrites `max_completion_tokens` and the legacy `functions` fields, enforces `n == 1`, and
lists everything it dropped in the notes.
"""

from __future__ import annotations

from typing import Any

import orjson

from polar_pl.gateway.providers.base import NormalizedRequest, RequestError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
CONTENT_PARTS = frozenset({"text", "image_url"})
# Sampling fields the engine takes as they are.
PASSTHROUGH = (
    "temperature",
    "top_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "parallel_tool_calls",
    "top_k",
    "min_p",
    "repetition_penalty",
    "logit_bias",
)
# Fields that change nothing the engine does; accepted silently.
IGNORED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "store",
        "metadata",
        "user",
        "prompt_cache_key",
        "service_tier",
        "safety_identifier",
        "n",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
    }
)


def convert_message(msg: Any, i: int, notes: list[str]) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise RequestError(f"messages.{i}: must be an object")
    role = msg.get("role")
    if role not in ROLES:
        raise RequestError(f"messages.{i}.role: {role!r} is not one of {sorted(ROLES)}")
    out = dict(msg)
    if role == "developer":
        out["role"] = "system"
        notes.append(f"messages.{i}: developer role sent as system")
    if role == "function":  # legacy function result -> tool result
        out = {"role": "tool", "content": msg.get("content"), "tool_call_id": msg.get("name", "")}
        notes.append(f"messages.{i}: legacy function message sent as tool message")
    content = out.get("content")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append({"type": "text", "text": part})
            elif not isinstance(part, dict) or part.get("type") not in CONTENT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                notes.append(f"messages.{i}.content.{j}: dropped {kind} part (engine takes text and images)")
            else:
                parts.append(part)
        out["content"] = parts
    elif content is not None and not isinstance(content, str):
        raise RequestError(f"messages.{i}.content: must be a string, a list of parts or null")
    if role == "assistant":
        if "reasoning" in out and "reasoning_content" not in out:
            out["reasoning_content"] = out.pop("reasoning")
        if msg.get("function_call") and not msg.get("tool_calls"):
            fc = msg["function_call"]
            out["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": dict(fc)}]
            out.pop("function_call")
            notes.append(f"messages.{i}: legacy function_call sent as tool_calls")
        for j, tc in enumerate(out.get("tool_calls") or ()):
            if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
                raise RequestError(f"messages.{i}.tool_calls.{j}: must have a function")
    if role == "tool" and "tool_call_id" not in out:
        raise RequestError(f"messages.{i}.tool_call_id: field required for a tool message")
    return out


def convert_tools(body: dict[str, Any], notes: list[str]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None and body.get("functions"):
        notes.append("legacy functions sent as tools")
        tools = [{"type": "function", "function": f} for f in body["functions"]]
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools: must be a list")
    kept = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools.{i}: must be an object")
        if tool.get("type", "function") != "function":
            notes.append(
                f"dropped tool {tool.get('name') or i} (type {tool.get('type')}: not a function tool)"
            )
            continue
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools.{i}.function.name: field required")
        kept.append(tool)
    return kept


def convert_tool_choice(body: dict[str, Any], tools: list[dict[str, Any]], notes: list[str]) -> Any:
    choice = body.get("tool_choice")
    if choice is None and body.get("function_call") is not None:
        fc = body["function_call"]
        choice = fc if isinstance(fc, str) else {"type": "function", "function": {"name": fc.get("name")}}
    if choice is None:
        return None
    if not tools:
        notes.append(f"dropped tool_choice {orjson.dumps(choice).decode()} (no function tools)")
        return None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise RequestError(f"tool_choice: {choice!r} is not one of auto, none, required")
        return choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in {t["function"]["name"] for t in tools}:
            notes.append(f"tool_choice names unavailable tool {name!r}; sent auto")
            return "auto"
        return {"type": "function", "function": {"name": name}}
    raise RequestError("tool_choice: must be a string or an object")


def to_chat(body: dict[str, Any]) -> NormalizedRequest:
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: field required (a non-empty list)")
    n = body.get("n")  # a positive integer or absent (providers/numbers.py)
    if n not in (None, 1):
        raise RequestError(f"n={n}: only one choice per request is supported")
    notes: list[str] = []
    chat: dict[str, Any] = {"messages": [convert_message(m, i, notes) for i, m in enumerate(messages)]}
    tools = convert_tools(body, notes)
    if tools:
        chat["tools"] = tools
    choice = convert_tool_choice(body, tools, notes)
    if choice is not None:
        chat["tool_choice"] = choice
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        chat["max_tokens"] = limit
    for key in PASSTHROUGH:
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("reasoning_effort") is not None:
        notes.append(f"accepted reasoning_effort={body['reasoning_effort']} (no engine equivalent)")
    for key in body:
        if key not in IGNORED and key not in PASSTHROUGH and key != "reasoning_effort":
            notes.append(f"ignored field {key}")
    opts = body.get("stream_options") or {}
    extra = {
        "include_usage": bool(opts.get("include_usage")) if isinstance(opts, dict) else False,
        "logprobs": bool(body.get("logprobs")),
    }
    model = body["model"] if isinstance(body.get("model"), str) else ""
    return NormalizedRequest(
        chat=chat, stream=bool(body.get("stream")), model=model, notes=tuple(notes), extra=extra
    )
