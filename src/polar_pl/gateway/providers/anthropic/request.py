"""Anthropic Messages request -> OpenAI Chat Completions request for the engine.

Small conversion functions, one per Anthropic concept (system, content blocks, tool results,
tools, tool choice, sampling). Everything dropped or changed on the way is appended to `notes`,
which the gateway keeps in the trace record, so a trajectory can be explained later.

Thinking blocks sent back with their text omitted (Claude Code's `display: "omitted"`) or as
`redacted_thinking` get their reasoning from the gateway's own signature (thinking_signature.py).
"""

from __future__ import annotations

import json
from typing import Any

from polar_pl.gateway.providers.base import RequestError
from polar_pl.gateway.providers.thinking_signature import decode_signature

# Anthropic-defined tools that run on Anthropic's servers or need a schema the engine never saw.
SERVER_TOOL_PREFIXES = (
    "web_search_",
    "web_fetch_",
    "bash_",
    "text_editor_",
    "computer_",
    "code_execution_",
    "memory_",
    "tool_search_tool_",
    "mcp_toolset",
)

# Fields that change nothing the engine can act on; accepted silently.
_IGNORED_FIELDS = {"metadata", "stream", "model", "service_tier", "anthropic_version", "betas"}
# Fields accepted but with no engine equivalent: accepted, and the record says so.
_NOTED_FIELDS = {"thinking", "context_management", "container", "mcp_servers", "inference_geo"}


def request_to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Convert a Messages request body; returns (chat body, notes). Raises RequestError."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    notes: list[str] = []
    messages: list[dict[str, Any]] = []
    system = system_to_text(body.get("system"), notes)
    if system is not None:
        messages.append({"role": "system", "content": system})
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise RequestError("messages: field required (a list of messages)")
    for i, message in enumerate(raw_messages):
        messages.extend(message_to_chat(message, i, notes))

    chat: dict[str, Any] = {"messages": messages}
    apply_prefill(chat, notes)
    tools = tools_to_chat(body.get("tools"), notes)
    if tools:
        chat["tools"] = tools
    apply_tool_choice(chat, body.get("tool_choice"), tools, notes)
    apply_sampling(chat, body, notes)
    apply_output_config(chat, body.get("output_config"), notes)
    for key, value in body.items():
        if key in _NOTED_FIELDS:
            notes.append(f"accepted {key}={json.dumps(value, sort_keys=True)} (no engine equivalent)")
        elif key not in _IGNORED_FIELDS and key not in _HANDLED_FIELDS:
            notes.append(f"ignored field {key}")
    return chat, notes


_HANDLED_FIELDS = {
    "system",
    "messages",
    "tools",
    "tool_choice",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "output_config",
}


def apply_prefill(chat: dict[str, Any], notes: list[str]) -> None:
    """A final assistant text turn is a prefill: the engine continues it instead of closing it."""
    last = chat["messages"][-1] if chat["messages"] else {}
    if last.get("role") == "assistant" and last.get("content") and not last.get("tool_calls"):
        chat["continue_final_message"] = True
        chat["add_generation_prompt"] = False
        notes.append("continued the final assistant message (prefill)")


def system_to_text(system: Any, notes: list[str]) -> str | None:
    """Top-level `system` (string or text blocks) -> one system string.

    Claude Code's per-request billing-header line stays in; the core strips volatile lines from
    every adapter's system messages (gateway/call/volatile.py) and notes it.
    """
    if system is None:
        return None
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise RequestError("system: must be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(system):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise RequestError(f"system.{i}: only text blocks are allowed")
        texts.append(block["text"])
    return "\n".join(texts)


def message_to_chat(message: Any, i: int, notes: list[str]) -> list[dict[str, Any]]:
    """One Anthropic message -> one or more chat messages (tool results become `tool` messages)."""
    if not isinstance(message, dict):
        raise RequestError(f"messages.{i}: must be an object")
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise RequestError(f"messages.{i}.content: must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise RequestError(f"messages.{i}.content.{j}: must be an object with a type")
    where = f"messages.{i}"
    if role == "assistant":
        return [assistant_to_chat(content, where, notes)]
    if role == "user":
        return user_to_chat(content, where, notes)
    if role == "system":
        # Claude Code sends environment context as a system message between turns; keep it there.
        return [{"role": "system", "content": "\n".join(_text_parts(content, where, notes, "system"))}]
    raise RequestError(f"{where}.role: must be 'user' or 'assistant', got {role!r}")


def user_to_chat(blocks: list[dict[str, Any]], where: str, notes: list[str]) -> list[dict[str, Any]]:
    """User blocks: tool results first (they answer the previous assistant turn), then the rest."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "tool_result":
            out.append(tool_result_to_chat(block, f"{where}.content.{j}", notes))
        elif kind == "text":
            parts.append({"type": "text", "text": _text_of(block, f"{where}.content.{j}")})
        elif kind == "image":
            image = image_to_part(block, f"{where}.content.{j}", notes)
            if image is not None:
                parts.append(image)
        elif kind == "document":
            text = document_to_text(block, f"{where}.content.{j}", notes)
            if text is not None:
                parts.append({"type": "text", "text": text})
        else:
            notes.append(f"dropped {kind} block in {where}")
    if parts or not out:
        out.append({"role": "user", "content": _chat_content(parts)})
    return out


def assistant_to_chat(blocks: list[dict[str, Any]], where: str, notes: list[str]) -> dict[str, Any]:
    """Assistant blocks -> content, reasoning and tool_calls of one chat message.

    The reasoning goes in `reasoning` (what vLLM's renderer reads) and, for engines that predate
    it, the deprecated `reasoning_content` (vLLM maps it to `reasoning` when that is absent).
    """
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind, at = block["type"], f"{where}.content.{j}"
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "thinking":
            thinking = block.get("thinking") or ""
            if not isinstance(thinking, str):
                raise RequestError(f"{at}.thinking: must be a string")
            reasoning.append(thinking or decode_signature(block.get("signature")) or "")
        elif kind == "redacted_thinking":
            recovered = decode_signature(block.get("data"))
            if recovered is None:
                notes.append(f"dropped redacted_thinking in {at} (not made by this gateway)")
            else:
                reasoning.append(recovered)
        elif kind == "tool_use":
            calls.append(tool_use_to_call(block, at))
        else:
            notes.append(f"dropped {kind} block in {where}")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if reasoning:
        message["reasoning"] = message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def tool_use_to_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A tool_use block -> an OpenAI tool call (arguments serialized the way vLLM serializes them)."""
    name, call_id, tool_input = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.name: required for tool_use")
    if not isinstance(call_id, str) or not call_id:
        raise RequestError(f"{where}.id: required for tool_use")
    if not isinstance(tool_input, dict):
        raise RequestError(f"{where}.input: must be an object")
    arguments = json.dumps(tool_input, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result_to_chat(block: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any]:
    """A tool_result block -> a `tool` message; multi-part text is joined, errors are marked."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise RequestError(f"{where}.tool_use_id: required for tool_result")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(_text_parts(content, where, notes, "tool_result"))
    else:
        raise RequestError(f"{where}.content: must be a string or a list of blocks")
    if block.get("is_error"):
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def image_to_part(block: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any] | None:
    """An image block -> an OpenAI image_url part (base64 as a data URL), or None if unusable."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise RequestError(f"{where}.source: required for image")
    if source.get("type") == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str):
            raise RequestError(f"{where}.source: base64 images need media_type and data")
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    notes.append(f"dropped image with source type {source.get('type')!r} in {where}")
    return None


def document_to_text(block: dict[str, Any], where: str, notes: list[str]) -> str | None:
    """Plain-text documents become text; PDFs and file references cannot reach a text engine."""
    source = block.get("source") or {}
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return source["data"]
    if source.get("type") == "content" and isinstance(source.get("content"), list):
        return "\n".join(_text_parts(source["content"], where, notes, "document"))
    notes.append(f"dropped document with source type {source.get('type')!r} in {where}")
    return None


def tools_to_chat(tools: Any, notes: list[str]) -> list[dict[str, Any]]:
    """Custom tools -> OpenAI function tools; Anthropic server tools are dropped and noted."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools: must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools.{i}: must be an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            if isinstance(kind, str) and kind.startswith(SERVER_TOOL_PREFIXES):
                notes.append(f"dropped server tool {tool.get('name', kind)} ({kind})")
                continue
            raise RequestError(f"tools.{i}.type: unsupported tool type {kind!r}")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"tools.{i}.name: required")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise RequestError(f"tools.{i}.input_schema: required (a JSON schema object)")
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = schema
        out.append({"type": "function", "function": function})
    return out


def apply_tool_choice(
    chat: dict[str, Any], choice: Any, tools: list[dict[str, Any]], notes: list[str]
) -> None:
    """auto / any / tool / none -> OpenAI tool_choice; disable_parallel_tool_use is kept."""
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise RequestError("tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'")
    if not tools:
        notes.append("ignored tool_choice without function tools")
        return
    kind = choice["type"]
    if kind == "tool":
        names = {t["function"]["name"] for t in tools}
        if not isinstance(choice.get("name"), str) or choice["name"] not in names:
            raise RequestError(f"tool_choice.name: {choice.get('name')!r} is not one of the tools")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def apply_sampling(chat: dict[str, Any], body: dict[str, Any], notes: list[str]) -> None:
    """max_tokens, temperature, top_p, stop_sequences; top_k is dropped (it would bias logprobs).
    The numbers were checked before conversion (providers/numbers.py)."""
    for key in ("max_tokens", "temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise RequestError("stop_sequences: must be a list of strings")
        if stops:
            chat["stop"] = list(stops)
    if body.get("top_k") is not None:
        # The engine's logprobs are of the untruncated distribution; top-k sampling would make
        # them disagree with what was sampled, so the trainer would see off-policy tokens.
        notes.append(f"dropped top_k={body['top_k']}")


def apply_output_config(chat: dict[str, Any], config: Any, notes: list[str]) -> None:
    """output_config: effort has no engine equivalent; a JSON-schema format becomes response_format."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise RequestError("output_config: must be an object")
    fmt = config.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"]},
        }
        notes.append("mapped output_config.format json_schema to response_format")
    rest = {k: v for k, v in config.items() if k != "format"}
    if rest:
        notes.append(f"accepted output_config={json.dumps(rest, sort_keys=True)} (no engine equivalent)")


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{where}.text: must be a string")
    return text


def _text_parts(blocks: list[Any], where: str, notes: list[str], what: str) -> list[str]:
    """Text of nested blocks (tool results, system messages); anything else is noted and dropped."""
    texts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise RequestError(f"{where}.content.{j}: must be an object")
        if block.get("type") == "text":
            texts.append(_text_of(block, f"{where}.content.{j}"))
        else:
            notes.append(f"dropped {block.get('type')} block in {what} at {where}")
    return texts


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content becomes one string (what chat templates render); images keep parts."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts
