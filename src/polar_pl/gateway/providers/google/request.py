"""Google generateContent request -> OpenAI Chat Completions request for the engine.

Small conversion functions: contents (user/model turns and their parts), systemInstruction,
function declarations (Gemini's OpenAPI-style schema -> JSON schema), toolConfig and
generationConfig. What has no engine equivalent is dropped and noted for the trace record.

Thought signatures: Gemini CLI keeps a part's `thoughtSignature` in its history but drops thought
text; the gateway's signature carries the reasoning (thinking_signature.py), so a model turn sent
back without its thoughts still re-renders with the reasoning the engine produced.

Function-call ids: Gemini matches a functionResponse to its functionCall by name (ids are
optional), the engine needs an id on both sides. Calls without one get an id derived from their
position in the conversation, so the same history always yields the same ids.
"""

from __future__ import annotations

import json
import re
from typing import Any

from polar_pl.gateway.providers.base import RequestError
from polar_pl.gateway.providers.google.names import camelize
from polar_pl.gateway.providers.google.schema import schema_to_json_schema
from polar_pl.gateway.providers.thinking_signature import decode_signature

_PATH = re.compile(r"models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent|countTokens)$")

_MODES = {"AUTO": "auto", "MODE_UNSPECIFIED": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}

_HANDLED_FIELDS = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "model"}
_IGNORED_FIELDS = {"safetySettings", "labels", "cachedContent"}


def parse_path(path: str) -> tuple[str, bool]:
    """`.../models/{model}:generateContent|streamGenerateContent|countTokens` -> (model, stream)."""
    match = _PATH.search(path)
    if match is None:
        raise RequestError(f"unsupported path {path!r}: expected models/{{model}}:generateContent")
    return match["model"], match["method"] == "streamGenerateContent"


def request_to_chat(body: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """Convert a generateContent body; returns (chat body, notes, generation options kept aside)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    body = camelize(body)
    notes: list[str] = []
    messages: list[dict[str, Any]] = []
    system = system_to_text(body.get("systemInstruction"), notes)
    if system is not None:
        messages.append({"role": "system", "content": system})
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise RequestError("contents is not specified")
    messages.extend(contents_to_messages(contents, notes))
    chat: dict[str, Any] = {"messages": messages}
    tools = tools_to_chat(body.get("tools"), notes)
    if tools:
        chat["tools"] = tools
    apply_tool_config(chat, body.get("toolConfig"), tools, notes)
    options = apply_generation_config(chat, body.get("generationConfig"), notes)
    for key in body:
        if key in _IGNORED_FIELDS:
            notes.append(f"ignored field {key}")
        elif key not in _HANDLED_FIELDS:
            notes.append(f"ignored unknown field {key}")
    return chat, notes, options


def system_to_text(instruction: Any, notes: list[str]) -> str | None:
    """systemInstruction (a Content, or a bare string) -> one system string."""
    if instruction is None:
        return None
    if isinstance(instruction, str):
        return instruction
    if not isinstance(instruction, dict) or not isinstance(instruction.get("parts"), list):
        raise RequestError("systemInstruction: must be a Content with parts")
    texts = []
    for i, part in enumerate(instruction["parts"]):
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            notes.append(f"dropped non-text part {i} of systemInstruction")
    return "\n".join(texts)


def contents_to_messages(contents: list[Any], notes: list[str]) -> list[dict[str, Any]]:
    """user/model turns -> chat messages, pairing functionResponses with their functionCalls."""
    messages: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (name, call id) of calls not yet answered, in order
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
            raise RequestError(f"{where}: must be a Content with parts")
        role = content.get("role") or "user"
        parts = content["parts"]
        for j, part in enumerate(parts):
            if not isinstance(part, dict):
                raise RequestError(f"{where}.parts[{j}]: must be an object")
        if role == "model":
            message = model_turn_to_message(parts, i, where, notes)
            pending.extend((c["function"]["name"], c["id"]) for c in message.get("tool_calls", ()))
            messages.append(message)
        elif role in ("user", "function", "tool"):
            messages.extend(user_turn_to_messages(parts, pending, i, where, notes))
        else:
            raise RequestError(f"{where}.role: must be 'user' or 'model', got {role!r}")
    return messages


def model_turn_to_message(
    parts: list[dict[str, Any]], i: int, where: str, notes: list[str]
) -> dict[str, Any]:
    """A model turn -> one assistant message: thoughts -> reasoning (and the deprecated
    reasoning_content, as in anthropic/request.py), calls -> tool_calls."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    signed: str | None = None
    for j, part in enumerate(parts):
        if signed is None and not part.get("thought"):
            signed = decode_signature(part.get("thoughtSignature"))
        if isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else texts).append(part["text"])
        elif "functionCall" in part:
            calls.append(function_call_to_chat(part["functionCall"], i, len(calls), f"{where}.parts[{j}]"))
        else:
            notes.append(f"dropped {_part_kind(part)} part in {where}")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thoughts or signed is not None:
        message["reasoning"] = message["reasoning_content"] = "".join(thoughts) or signed
    if calls:
        message["tool_calls"] = calls
    return message


def function_call_to_chat(call: Any, turn: int, k: int, where: str) -> dict[str, Any]:
    """A functionCall -> an OpenAI tool call with a stable id (its own, or derived from position)."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise RequestError(f"{where}.functionCall.name: required")
    args = call.get("args") or {}
    if not isinstance(args, dict):
        raise RequestError(f"{where}.functionCall.args: must be an object")
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{turn}_{k}"
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": arguments}}


def user_turn_to_messages(
    parts: list[dict[str, Any]], pending: list[tuple[str, str]], i: int, where: str, notes: list[str]
) -> list[dict[str, Any]]:
    """A user turn: functionResponses become `tool` messages (first), the rest one user message."""
    tools: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        if isinstance(part.get("text"), str):
            content.append({"type": "text", "text": part["text"]})
        elif "functionResponse" in part:
            tools.append(function_response_to_chat(part["functionResponse"], pending, i, j, at, notes))
        elif "inlineData" in part or "fileData" in part:
            image = media_to_part(part, at, notes)
            if image is not None:
                content.append(image)
        else:
            notes.append(f"dropped {_part_kind(part)} part in {where}")
    out = tools
    if content or not tools:
        if all(p["type"] == "text" for p in content):
            # Chat templates render a string; text parts are joined the way vLLM joins them.
            out.append({"role": "user", "content": "\n".join(p["text"] for p in content)})
        else:
            out.append({"role": "user", "content": content})
    return out


def function_response_to_chat(
    response: Any, pending: list[tuple[str, str]], i: int, j: int, where: str, notes: list[str]
) -> dict[str, Any]:
    """A functionResponse -> a `tool` message answering the call with its id, else its name."""
    if not isinstance(response, dict) or not isinstance(response.get("name"), str):
        raise RequestError(f"{where}.functionResponse.name: required")
    name, given = response["name"], response.get("id")
    match = next((k for k, (_, cid) in enumerate(pending) if given and cid == given), None)
    if match is None:
        match = next((k for k, (n, _) in enumerate(pending) if n == name), None)
    if match is not None:
        call_id = pending.pop(match)[1]
    else:
        call_id = given or f"call_{i}_{j}_orphan"
        notes.append(f"functionResponse {name} in {where} answers no earlier functionCall")
    if response.get("parts"):
        notes.append(f"dropped multimodal parts of functionResponse in {where}")
    body = response.get("response", {})
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(body, ensure_ascii=False)}


def media_to_part(part: dict[str, Any], where: str, notes: list[str]) -> dict[str, Any] | None:
    """inlineData images -> data-URL image parts, fileData images -> URL parts; others dropped."""
    if "inlineData" in part:
        data = part["inlineData"] if isinstance(part["inlineData"], dict) else {}
        mime, payload = data.get("mimeType", ""), data.get("data")
        if isinstance(mime, str) and mime.startswith("image/") and isinstance(payload, str):
            return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{payload}"}}
        notes.append(f"dropped inlineData of type {mime!r} in {where}")
        return None
    data = part["fileData"] if isinstance(part["fileData"], dict) else {}
    if str(data.get("mimeType", "")).startswith("image/") and isinstance(data.get("fileUri"), str):
        return {"type": "image_url", "image_url": {"url": data["fileUri"]}}
    notes.append(f"dropped fileData of type {data.get('mimeType')!r} in {where}")
    return None


def tools_to_chat(tools: Any, notes: list[str]) -> list[dict[str, Any]]:
    """tools[].functionDeclarations -> OpenAI function tools; search/code tools dropped and noted."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools: must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{i}]: must be an object")
        for key in tool:
            if key != "functionDeclarations":
                notes.append(f"dropped tool {key}")
        decls = tool.get("functionDeclarations") or []
        if not isinstance(decls, list):
            raise RequestError(f"tools[{i}].functionDeclarations: must be a list")
        for k, decl in enumerate(decls):
            out.append(declaration_to_tool(decl, f"tools[{i}].functionDeclarations[{k}]"))
    return out


def declaration_to_tool(decl: Any, where: str) -> dict[str, Any]:
    if not isinstance(decl, dict) or not isinstance(decl.get("name"), str) or not decl["name"]:
        raise RequestError(f"{where}.name: required")
    if isinstance(decl.get("parametersJsonSchema"), dict):
        parameters = decl["parametersJsonSchema"]
    elif isinstance(decl.get("parameters"), dict):
        parameters = schema_to_json_schema(decl["parameters"])
    else:
        parameters = {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": decl["name"]}
    if isinstance(decl.get("description"), str):
        function["description"] = decl["description"]
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def apply_tool_config(
    chat: dict[str, Any], config: Any, tools: list[dict[str, Any]], notes: list[str]
) -> None:
    """functionCallingConfig mode AUTO / ANY / NONE (+ allowedFunctionNames) -> tool_choice."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise RequestError("toolConfig: must be an object")
    fcc = config.get("functionCallingConfig")
    if fcc is None:
        return
    if not isinstance(fcc, dict):
        raise RequestError("toolConfig.functionCallingConfig: must be an object")
    mode = str(fcc.get("mode") or "AUTO").upper()
    if mode not in _MODES:
        raise RequestError(f"toolConfig.functionCallingConfig.mode: unknown mode {fcc.get('mode')!r}")
    if not tools:
        notes.append("ignored toolConfig without function declarations")
        return
    allowed = fcc.get("allowedFunctionNames") or []
    if not isinstance(allowed, list) or not all(isinstance(name, str) for name in allowed):
        raise RequestError("toolConfig.functionCallingConfig.allowedFunctionNames: must be a list of names")
    if mode == "ANY" and len(allowed) == 1:
        chat["tool_choice"] = {"type": "function", "function": {"name": allowed[0]}}
        return
    chat["tool_choice"] = _MODES[mode]
    if allowed:
        notes.append(f"allowedFunctionNames {allowed} not enforced (tool_choice={_MODES[mode]})")
    if mode == "VALIDATED":
        notes.append("functionCallingConfig mode VALIDATED treated as AUTO")


def apply_generation_config(chat: dict[str, Any], config: Any, notes: list[str]) -> dict[str, Any]:
    """generationConfig -> sampling params and response_format; returns options the adapter keeps."""
    options: dict[str, Any] = {"include_thoughts": False}
    if config is None:
        return options
    if not isinstance(config, dict):
        raise RequestError("generationConfig: must be an object")
    # the numbers were checked before conversion (providers/numbers.py)
    for src, dst in (
        ("maxOutputTokens", "max_tokens"),
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("seed", "seed"),
    ):
        if config.get(src) is not None:
            chat[dst] = config[src]
    stops = config.get("stopSequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise RequestError("generationConfig.stopSequences: must be a list of strings")
        chat["stop"] = list(stops)
    apply_response_format(chat, config, notes)
    thinking = config.get("thinkingConfig")
    if isinstance(thinking, dict):
        options["include_thoughts"] = bool(thinking.get("includeThoughts"))
        notes.append(f"accepted thinkingConfig={json.dumps(thinking, sort_keys=True)} (no engine equivalent)")
    for key in ("topK", "presencePenalty", "frequencyPenalty"):
        if config.get(key) is not None:
            # The engine reports logprobs of the unmodified distribution; these would skew sampling.
            notes.append(f"dropped {key}={config[key]}")
    if config.get("candidateCount") not in (None, 1):
        notes.append(f"candidateCount={config['candidateCount']} served as 1")
    handled = {
        "maxOutputTokens",
        "temperature",
        "topP",
        "seed",
        "stopSequences",
        "thinkingConfig",
        "topK",
        "presencePenalty",
        "frequencyPenalty",
        "candidateCount",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "_responseJsonSchema",
    }
    for key in config:
        if key not in handled:
            notes.append(f"ignored generationConfig.{key}")
    return options


def apply_response_format(chat: dict[str, Any], config: dict[str, Any], notes: list[str]) -> None:
    """responseMimeType application/json (+ schema) -> response_format, as the router asks for."""
    mime = config.get("responseMimeType")
    schema = config.get("responseJsonSchema") or config.get("_responseJsonSchema")
    if schema is None and config.get("responseSchema") is not None:
        schema = schema_to_json_schema(config["responseSchema"])
    elif schema is not None:
        # Gemini CLI sends its classifier schema in Gemini's uppercase dialect even here.
        schema = schema_to_json_schema(schema)
    if mime == "application/json":
        if isinstance(schema, dict):
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            }
        else:
            chat["response_format"] = {"type": "json_object"}
        notes.append("mapped responseMimeType application/json to response_format")
    elif mime not in (None, "text/plain"):
        notes.append(f"ignored responseMimeType {mime}")


def _part_kind(part: dict[str, Any]) -> str:
    keys = [k for k in part if k not in ("thought", "thoughtSignature")]
    return keys[0] if keys else "empty"
