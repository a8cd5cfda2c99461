"""OpenAI Responses request (`POST /v1/responses`) -> the engine's chat body.

`to_chat` turns a Responses request into the engine's chat body: the input items through
input.py, flat function tools into chat tools (every other tool kind dropped and listed in the
notes), tool_choice, token limit, sampling and `text.format`. What has no engine counterpart
(reasoning effort, include, store) is accepted and noted.
"""

from __future__ import annotations

import json
from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest, RequestError
from polar_pl.gateway.providers.openai_responses.input import convert_input

NEEDS_STORAGE = ("previous_response_id", "conversation", "prompt")
# Accepted and meaningless for a local engine: no note.
SILENT_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "stream",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "reasoning",
        "include",
        "store",
        "text",
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "client_metadata",
        "user",
        "safety_identifier",
        "service_tier",
        "stream_options",
        "background",
    }
)


def convert_tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Flat Responses function tools -> chat tools; every other tool kind dropped with a note."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list")
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    strict: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{i}] must be an object")
        kind = tool.get("type")
        if kind != "function":
            inner = [t.get("name") for t in tool.get("tools", []) if isinstance(t, dict)]
            label = f"{kind}:{tool['name']}" if tool.get("name") else str(kind)
            dropped.append(f"{label}({', '.join(map(str, inner))})" if inner else label)
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"tools[{i}]: function tool needs a 'name'")
        fn: dict[str, Any] = {"name": name}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool.get("strict"):
            strict.append(name)
        out.append({"type": "function", "function": fn})
    notes = []
    if dropped:
        notes.append(f"dropped non-function tools: {', '.join(dropped)}")
    if strict:
        notes.append(f"strict schemas not enforced for: {', '.join(strict)}")
    return out, notes


def convert_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> tuple[Any, list[str]]:
    """Responses tool_choice -> chat tool_choice (None: leave it out)."""
    if choice is None:
        return None, []
    if not tools:
        return None, [f"tool_choice {json.dumps(choice)} dropped: no function tools left"]
    if choice in ("auto", "none", "required"):
        return choice, []
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            name = choice.get("name")
            if name not in {t["function"]["name"] for t in tools}:
                raise RequestError(f"tool_choice names unknown function {name!r}")
            return {"type": "function", "function": {"name": name}}, []
        if kind == "allowed_tools":
            mode = choice.get("mode", "auto")
            return mode, [f"tool_choice allowed_tools restriction not enforced (mode {mode!r} kept)"]
        return "auto", [f"tool_choice for hosted tool {kind!r} replaced by 'auto'"]
    raise RequestError(f"unsupported tool_choice {choice!r}")


def convert_text_format(text: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """`text.format` -> chat `response_format`; verbosity is noted and ignored."""
    if not isinstance(text, dict):
        return None, []
    notes = [f"text.verbosity={text['verbosity']!r} ignored"] if text.get("verbosity") else []
    fmt = text.get("format") or {}
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}, notes
    if kind == "json_object":
        return {"type": "json_object"}, notes
    return None, notes


def convert_params(body: dict[str, Any], chat: dict[str, Any]) -> list[str]:
    """Sampling parameters -> chat fields; what has no engine counterpart is noted."""
    notes: list[str] = []
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(key) is not None:
            chat[key] = body[key]
    reasoning = body.get("reasoning") or {}
    ignored = {k: v for k, v in reasoning.items() if v is not None} if isinstance(reasoning, dict) else {}
    if ignored:
        notes.append(f"reasoning {json.dumps(ignored, sort_keys=True)} ignored (the engine decides)")
    if body.get("include"):
        notes.append(f"include {body['include']} ignored")
    if body.get("store"):
        notes.append("store=true ignored: responses are not stored")
    if body.get("background"):
        raise RequestError("background responses are not supported")
    response_format, text_notes = convert_text_format(body.get("text"))
    if response_format:
        chat["response_format"] = response_format
    notes.extend(text_notes)
    for key in sorted(set(body) - SILENT_FIELDS):
        notes.append(f"field {key!r} ignored")
    return notes


def echo_fields(body: dict[str, Any]) -> dict[str, Any]:
    """Request fields the response object echoes back, as the real API does."""
    return {
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "reasoning": body.get("reasoning"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "store": body.get("store", False),
        "metadata": body.get("metadata") or {},
    }


def to_chat(body: dict[str, Any]) -> NormalizedRequest:
    """A Responses request body -> the engine's chat body, with notes on what changed."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("missing required parameter: 'model'")
    for key in NEEDS_STORAGE:
        if body.get(key):
            raise RequestError(f"'{key}' is not supported: this gateway keeps no server-side state")
    messages, notes = convert_input(body.get("instructions"), body.get("input"))
    chat: dict[str, Any] = {"messages": messages}
    tools, tool_notes = convert_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice, choice_notes = convert_tool_choice(body.get("tool_choice"), tools)
    if choice is not None:
        chat["tool_choice"] = choice
    notes += tool_notes + choice_notes + convert_params(body, chat)
    return NormalizedRequest(
        chat=chat,
        stream=bool(body.get("stream", False)),
        model=model,
        notes=tuple(notes),
        extra={"echo": echo_fields(body)},
    )
