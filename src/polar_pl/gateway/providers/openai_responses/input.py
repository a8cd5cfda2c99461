"""OpenAI Responses request input: `instructions` + `input` items -> engine chat messages.

Developer and system messages become system messages (consecutive ones merged, their parts kept in
order); a reasoning item, an assistant message and the function calls that follow them become one
assistant turn (`reasoning_content`, `content`, `tool_calls`); function-call outputs become tool
messages. Calls of client-side non-function tools (custom, local shell, apply_patch) stay in the
history as function calls, hosted-tool items are dropped; each such change is noted.

Text parts of one message are joined with "\n", the join vLLM itself applies to a list of text
parts, so a flattened message renders to the same tokens the list would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from polar_pl.gateway.providers.base import RequestError

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
# Client-executed tool calls of non-function tools (Codex's apply_patch, local shell, ...): the
# model saw them, so they stay in the history as function calls named after their tool.
CLIENT_CALLS = frozenset(
    {"custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call", "computer_call"}
)
CLIENT_CALL_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "computer_call_output",
    }
)
# Server-executed (hosted) tool items: the engine cannot have produced them; dropped with a note.
HOSTED_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
        "compaction",
        "compaction_summary",
    }
)


@dataclass(slots=True)
class _Turn:
    """The assistant turn being assembled from consecutive reasoning/message/call items."""

    reasoning: list[str] = field(default_factory=list)
    content: list[Any] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.tool_calls)

    def to_message(self) -> dict[str, Any]:
        # No text beside tool calls is `null`, as chat clients send it.
        content = _join_content(self.content) if self.content or not self.tool_calls else None
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning:
            msg["reasoning_content"] = "\n".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass(slots=True)
class _Builder:
    """Accumulates chat messages while walking the input items in order."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    turn: _Turn = field(default_factory=_Turn)
    system_parts: list[Any] | None = None  # the open (mergeable) system message's parts
    merged_system: int = 0
    call_ids: set[str] = field(default_factory=set)

    def flush_turn(self) -> None:
        if not self.turn.empty():
            self.messages.append(self.turn.to_message())
            self.turn = _Turn()

    def add_system(self, parts: list[Any]) -> None:
        self.flush_turn()
        if self.system_parts is not None:
            self.system_parts.extend(parts)
            self.merged_system += 1
            return
        self.system_parts = list(parts)
        self.messages.append({"role": "system", "content": self.system_parts})

    def add(self, message: dict[str, Any]) -> None:
        self.flush_turn()
        self.system_parts = None
        self.messages.append(message)

    def finish(self) -> list[dict[str, Any]]:
        self.flush_turn()
        for msg in self.messages:
            if msg["role"] == "system":
                msg["content"] = _join_content(msg["content"])
        if self.merged_system:
            self.notes.append(f"merged {self.merged_system} consecutive developer/system message(s)")
        return self.messages


# --- content parts -----------------------------------------------------------------------------


def convert_part(part: Any, where: str) -> Any:
    """One Responses content part -> a text string or a chat image part."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise RequestError(f"{where}: content part must be an object")
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(f"{where}: {kind} part needs a string 'text'")
        return text
    if kind == "refusal":
        return str(part.get("refusal", ""))
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise RequestError(f"{where}: input_image needs 'image_url' (file_id is not supported)")
        image: dict[str, Any] = {"url": url}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise RequestError(f"{where}: unsupported content part type {kind!r}")


def convert_content(content: Any, where: str) -> list[Any]:
    """A message's `content` (string or part list) -> list of text strings / image parts."""
    if isinstance(content, str):
        return [content]
    if content is None:
        return []
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of parts")
    return [convert_part(p, f"{where}.content[{i}]") for i, p in enumerate(content)]


def _join_content(parts: list[Any]) -> Any:
    """Text-only parts -> one string joined by "\n"; with images -> a chat part list."""
    if all(isinstance(p, str) for p in parts):
        return "\n".join(parts)
    return [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]


# --- input items --------------------------------------------------------------------------------


def convert_message(item: dict[str, Any], b: _Builder, where: str) -> None:
    """A message item (user / assistant / system / developer) -> its chat place."""
    role = item.get("role")
    parts = convert_content(item.get("content"), where)
    if role in ("system", "developer"):
        b.add_system(parts)
    elif role == "user":
        b.add({"role": "user", "content": _join_content(parts)})
    elif role == "assistant":
        if b.turn.content or b.turn.tool_calls:
            b.flush_turn()
        b.system_parts = None
        b.turn.content.extend(parts)
    else:
        raise RequestError(f"{where}: unsupported message role {role!r}")


def convert_reasoning(item: dict[str, Any], b: _Builder, where: str) -> None:
    """A reasoning item -> reasoning_content of the assistant turn it opens.

    Full reasoning text (`content`) is preferred; the summary is what this gateway emits and what
    Codex and Pi send back, so it is the usual source.
    """
    if b.turn.content or b.turn.tool_calls:
        b.flush_turn()
    b.system_parts = None
    source = item.get("content") or item.get("summary") or []
    if not isinstance(source, list):
        raise RequestError(f"{where}: reasoning summary/content must be a list")
    texts = [convert_part(p, f"{where}.summary[{i}]") for i, p in enumerate(source)]
    if any(not isinstance(t, str) for t in texts):
        raise RequestError(f"{where}: reasoning parts must be text")
    if texts:
        b.turn.reasoning.append("\n\n".join(texts))
    if item.get("encrypted_content"):
        b.notes.append(f"{where}: reasoning encrypted_content ignored (not produced by this engine)")


def convert_function_call(item: dict[str, Any], b: _Builder, where: str) -> None:
    """A function_call item -> a tool call on the current assistant turn."""
    call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise RequestError(f"{where}: function_call needs string 'call_id' and 'name'")
    if not isinstance(args, str):
        args = json.dumps(args)
    b.system_parts = None
    b.turn.tool_calls.append(
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    )
    b.call_ids.add(call_id)


def convert_client_call(item: dict[str, Any], b: _Builder, where: str) -> None:
    """A non-function tool call (custom / local_shell / shell / apply_patch) -> a function call."""
    kind = item["type"]
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str):
        raise RequestError(f"{where}: {kind} needs a 'call_id'")
    name = item.get("name") or kind.removesuffix("_call")
    if kind == "custom_tool_call":
        args = json.dumps({"input": item.get("input", "")})
    else:
        payload = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        args = json.dumps(payload)
    convert_function_call({"call_id": call_id, "name": name, "arguments": args}, b, where)
    b.notes.append(f"{where}: {kind} converted to a function call named {name!r}")


def convert_call_output(item: dict[str, Any], b: _Builder, where: str) -> None:
    """function_call_output (and the other *_call_output items) -> a tool message."""
    kind = item["type"]
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str):
        raise RequestError(f"{where}: {kind} needs a 'call_id'")
    output = item.get("output", "")
    if isinstance(output, list):
        content = _join_content(convert_content(output, where))
    elif isinstance(output, str):
        content = output
    else:
        content = json.dumps(output)
    if call_id not in b.call_ids:
        b.notes.append(f"{where}: {kind} for unknown call_id {call_id!r}")
    if kind != "function_call_output":
        b.notes.append(f"{where}: {kind} converted to a tool message")
    b.add({"role": "tool", "tool_call_id": call_id, "content": content})


def convert_item(item: Any, b: _Builder, where: str) -> None:
    """Dispatch one input item by its type (a bare {role, content} is a message)."""
    if not isinstance(item, dict):
        raise RequestError(f"{where}: input item must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        convert_message(item, b, where)
    elif kind == "reasoning":
        convert_reasoning(item, b, where)
    elif kind == "function_call":
        convert_function_call(item, b, where)
    elif kind in CLIENT_CALLS:
        convert_client_call(item, b, where)
    elif kind in CLIENT_CALL_OUTPUTS:
        convert_call_output(item, b, where)
    elif kind in HOSTED_ITEMS:
        b.notes.append(f"{where}: {kind} item dropped (hosted tool / server state)")
    elif kind == "item_reference":
        raise RequestError(
            f"{where}: item_reference needs stored responses, which this gateway does not keep"
        )
    else:
        raise RequestError(f"{where}: unsupported input item type {kind!r}")


def convert_input(instructions: Any, items: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """`instructions` + `input` -> chat messages and notes."""
    b = _Builder()
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("'instructions' must be a string")
        b.add_system([instructions])
    if isinstance(items, str):
        b.add({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            convert_item(item, b, f"input[{i}]")
    elif items is not None:
        raise RequestError("'input' must be a string or a list of items")
    messages = b.finish()
    if not messages:
        raise RequestError("'input' is empty: nothing to send to the model")
    return messages, b.notes
