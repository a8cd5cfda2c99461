"""Chat messages -> prompt token ids, the way vLLM renders them for a HF chat template.

Token faithfulness depends on this: the gateway records `prompt_token_ids`, and the embedded engine
must produce the same ids as vLLM for the same request. What vLLM does before the template
(`vllm/renderers/chat_utils.py`), reproduced here:
- string content becomes one text part; a list of text parts is joined with "\\n"; None is "";
- a system message whose text starts with Claude Code's `x-anthropic-billing-header` line loses
  that line (it changes per request);
- assistant `tool_calls` arguments (JSON strings) are parsed to dicts (invalid -> {});
  an empty tool_calls list is dropped; `reasoning` (or the deprecated `reasoning_content`, used
  only when `reasoning` is absent) is passed as `reasoning` and `reasoning_content`;
- tool messages keep `tool_call_id`; any message keeps a string `name`;
- tools are passed as {"type": "function", "function": {"name", "description", "parameters"}}
  with None kept for a missing description/parameters (vLLM's pydantic dump);
- the rendered text is tokenized without special tokens added.

One deliberate difference: control strings inside message text (`<|im_end|>`, `<|im_start|>`,
`<tool_call>` ... in content, reasoning, tool-call arguments or tool schemas) are tokenized as
text, not as control tokens (chat/controls.py); vLLM would let a tool result open a system turn.
"""

from __future__ import annotations

import json
from typing import Any

from polar_pl.chat.controls import Shield

_BILLING_HEADER = "x-anthropic-billing-header"
ROLES = ("system", "developer", "user", "assistant", "tool")


class RenderError(ValueError):
    """A message list the template cannot render; answered with 400."""

    def __init__(self, message: str, param: str | None = "messages"):
        super().__init__(message)
        self.param = param


def _text_parts(content: Any, where: str) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise RenderError(f"{where}.content must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image"):
            raise RenderError(f"{where}.content[{j}]: this model does not accept images")
        else:
            raise RenderError(f"{where}.content[{j}] is not a text part")
    return texts


def _strip_billing_header(texts: list[str]) -> list[str]:
    out = []
    for text in texts:
        if not text.startswith(_BILLING_HEADER):
            out.append(text)
        elif rest := text.partition("\n")[2]:
            out.append(rest)
    return out


def _tool_call_for_template(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise RenderError(f"{where}: assistant tool_calls entries must be objects")
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise RenderError(f"{where}: chat completions only support tool_calls of type 'function'")
    args = function.get("arguments")
    if isinstance(args, str) and args:
        try:
            args = json.loads(args)
        except ValueError:
            args = {}
    if not isinstance(args, dict):
        args = {}
    return {**call, "function": {**function, "arguments": args}}


def conversation_for_template(messages: list[Any] | None) -> list[dict[str, Any]]:
    """The message dicts handed to the chat template."""
    if not isinstance(messages, list) or not messages:
        raise RenderError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RenderError(f"{where} must be an object")
        role = msg.get("role")
        if role not in ROLES:
            raise RenderError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        texts = _text_parts(msg.get("content"), where)
        if role == "system":
            texts = _strip_billing_header(texts)
        rendered: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
        if role == "assistant":
            calls = msg.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise RenderError(f"{where}.tool_calls must be a list")
                if calls:
                    rendered["tool_calls"] = [_tool_call_for_template(c, where) for c in calls]
            # vLLM 0.32 renames the deprecated `reasoning_content` to `reasoning` (reasoning wins)
            reasoning = msg.get("reasoning")
            if reasoning is None:
                reasoning = msg.get("reasoning_content")
            if reasoning is not None:
                rendered["reasoning"] = rendered["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in msg:
            rendered["tool_call_id"] = msg["tool_call_id"]
        if isinstance(msg.get("name"), str):
            rendered["name"] = msg["name"]
        out.append(rendered)
    return out


def tools_for_template(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RenderError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools"
            )
        function = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        if fn.get("strict") is not None:
            function["strict"] = fn["strict"]
        out.append({"type": "function", "function": function})
    return out


def render_chat(
    tokenizer,
    messages: list[Any] | None,
    tools: list[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[str, list[int]]:
    """Returns (prompt text, prompt token ids)."""
    marked, shield = render_marked(
        tokenizer,
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template_kwargs=chat_template_kwargs,
    )
    return shield.restore(marked), shield.encode(marked)


def _protect(shield: Shield, message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's text is the model's own output: a `<think>` in it was sampled as that
    token (an engine without a reasoning parser passes `<think>` on as content), so it re-renders
    as the token. Everything else (system, user, tool results, tool-call arguments the harness
    echoes as JSON, tool schemas) never becomes a control token."""
    if message.get("role") != "assistant":
        return shield.protect(message)
    if "tool_calls" not in message:
        return message
    return {**message, "tool_calls": shield.protect(message["tool_calls"])}


def render_marked(
    tokenizer,
    messages: list[Any] | None,
    tools: list[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[str, Shield]:
    """The rendered text with control strings from non-assistant messages as sentinels, and the `Shield` that
    encodes it (`shield.encode(text[i:])` gives the ids of any part of it)."""
    shield = Shield(tokenizer)
    conversation = [_protect(shield, m) for m in conversation_for_template(messages)]
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=shield.protect(tools_for_template(tools)),
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            tokenize=False,
            **(chat_template_kwargs or {}),
        )
    except RenderError:
        raise
    except Exception as exc:  # jinja errors (TemplateError, TypeError in filters) are the caller's input
        raise RenderError(f"chat template failed on these messages: {exc}") from exc
    return text, shield
