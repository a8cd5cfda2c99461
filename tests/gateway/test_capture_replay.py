"""Every recorded harness request (shared/fixtures/harness-captures) replayed through the gateway
with its original headers, path and query: the answer is 200, the stream is structurally valid
for its provider, the normalized request keeps every message text, system part and function
tool, volatile content is stripped with a note, and side calls are tagged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixture_paths import CAPTURES
from sse_grammar import check_anthropic, check_chat, check_google, check_responses, parse_sse

from polar_pl.testing.scripted import Reply, ToolCall

RECORDS = sorted(
    p for p in CAPTURES.glob("*/*.request.record.json") if json.loads(p.read_text())["method"] == "POST"
)
SIDE = {
    "04-interactive-title-side-request": "claude_code_title",
    "03-chat-memory-extraction-side-request": "qwen_code_memory_extraction",
    "01-gemini-router-classifier-generateContent": "gemini_cli_router",
}
DROP_HEADERS = {
    "host",
    "content-length",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "accept-encoding",
    "connection",
}
BILLING = "x-anthropic-billing-header"


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.name.removesuffix('.request.record.json')}"


def _texts(node: Any, out: list[str]) -> list[str]:
    """Every message text in a raw request: `text` fields, string contents, instructions."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str) and k in ("text", "content", "instructions", "output") and v.strip():
                out.append(v)
            elif k not in ("tools", "parameters", "input_schema", "functionDeclarations", "metadata"):
                _texts(v, out)
    elif isinstance(node, list):
        for v in node:
            _texts(v, out)
    return out


def _strings(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict):
        return "\n".join(_strings(v) for v in node.values())
    if isinstance(node, list):
        return "\n".join(_strings(v) for v in node)
    return ""


def _function_tool_names(provider: str, body: dict) -> set[str]:
    names = set()
    for t in body.get("tools") or ():
        if provider == "google":
            names |= {f["name"] for f in t.get("functionDeclarations") or ()}
        elif provider == "openai_chat":
            names.add(t["function"]["name"])
        elif provider == "openai_responses":
            if t.get("type") == "function":
                names.add(t["name"])
        elif "input_schema" in t:  # anthropic client tools
            names.add(t["name"])
    return names


def _reply(chat: dict, kind: str) -> Reply:
    tools = chat.get("tools") or []
    if kind == "tool" and tools:
        return Reply(tool_calls=[ToolCall(tools[0]["function"]["name"], {"command": "echo hello > f.txt"})])
    return Reply('{"title": "Replay", "complexity_reasoning": "x", "complexity_score": 10}')


@pytest.mark.parametrize("kind", ["text", "tool"])
@pytest.mark.parametrize("record_path", RECORDS, ids=_id)
def test_replay(gateway, script, record_path: Path, kind: str):
    rec = json.loads(record_path.read_text())
    body = rec["body"]
    script.default = lambda chat: _reply(chat, kind)
    s = gateway.create_session(harness=record_path.parent.name)
    headers = {k: v for k, v in rec["headers"].items() if k.lower() not in DROP_HEADERS}
    query = {k: v[0] for k, v in (rec.get("query") or {}).items()}
    r = httpx.post(
        f"{s.base_url}{rec['path']}",
        params=query,
        content=json.dumps(body).encode(),
        headers=headers,
        timeout=120,
    )
    assert r.status_code == 200, r.text[:500]
    (trace,) = gateway.records(s.session_id)
    assert trace.status == "ok" and trace.prompt_ids and trace.response_ids
    provider = trace.provider
    stream = bool(body.get("stream")) or "streamGenerateContent" in rec["path"]
    if stream:
        events = parse_sse(r.text)
        check = {
            "openai_chat": lambda e: check_chat(
                e, bool((body.get("stream_options") or {}).get("include_usage"))
            ),
            "anthropic": check_anthropic,
            "openai_responses": check_responses,
            "google": check_google,
        }[provider]
        result = check(events)
        has_tools = bool(trace.normalized_request.get("tools"))
        if kind == "tool" and has_tools:
            assert result["tools"], "the scripted tool call did not reach the harness"
        else:
            assert "Replay" in result["text"]
    assert trace.raw_response == r.text

    norm = trace.normalized_request
    haystack = _strings(norm["messages"])
    for text in _texts({k: v for k, v in body.items() if k != "tools"}, []):
        kept = "\n".join(line for line in text.split("\n") if not line.startswith(BILLING)).strip()
        # tool results given as objects (Gemini's functionResponse) reach the engine JSON-encoded
        assert kept in haystack or json.dumps(kept)[1:-1] in haystack, f"lost: {kept[:120]!r}"
        assert BILLING not in haystack
    wanted = _function_tool_names(provider, body)
    got = {t["function"]["name"] for t in norm.get("tools") or ()}
    assert wanted <= got, f"function tools lost: {wanted - got}"
    if any(BILLING in t for t in _texts(body, [])):
        assert any("billing header" in n for n in trace.notes)
    name = record_path.name.removesuffix(".request.record.json")
    expected_side = SIDE.get(name)
    assert trace.call_kind == ("side" if expected_side else "main")
    if expected_side:
        assert f"side call: {expected_side}" in trace.notes
