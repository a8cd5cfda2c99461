"""Google generateContent -> chat translation: real CLI captures keep every part, and each concept
(systemInstruction, turns, function calls and responses, schemas, toolConfig, generationConfig)
converts as documented."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import CAPTURES

from polar_pl.gateway.providers import get_adapter
from polar_pl.gateway.providers.base import RequestError
from polar_pl.gateway.providers.google.schema import schema_to_json_schema

adapter = get_adapter("google")

RECORDS = sorted(
    p for p in CAPTURES.glob("*/*.request.record.json") if "/models/" in json.loads(p.read_text())["path"]
)
PATH = "/v1beta/models/gemini-x:generateContent"


def to_chat(body: dict[str, Any], path: str = PATH, query: dict[str, str] | None = None):
    return adapter.to_chat(body, path=path, query=query or {})


def test_all_google_captures_found():
    assert len(RECORDS) == 5  # gemini cli x3, pi x2


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: f"{p.parent.name}/{p.name[:32]}")
def test_capture_keeps_every_content_part_tool_and_system_part(record: Path):
    rec = json.loads(record.read_text())
    body = json.loads(record.with_name(record.name.replace(".record.", ".body.")).read_text())
    req = to_chat(body, rec["path"], {k: v[0] for k, v in rec["query"].items()})
    assert req.model == rec["path"].split("models/")[1].split(":")[0]
    assert req.stream == rec["path"].endswith(":streamGenerateContent")
    messages = list(req.chat["messages"])

    system = messages.pop(0)
    assert system["role"] == "system"
    for part in body["systemInstruction"]["parts"]:
        assert part["text"] in system["content"]

    flat = iter(messages)
    for content in body["contents"]:
        parts = content["parts"]
        if content["role"] == "model":
            out = next(flat)
            assert out["role"] == "assistant"
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            assert [
                (c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in out.get("tool_calls", [])
            ] == [(c["name"], c["args"]) for c in calls]
            for p in parts:
                if "text" in p:
                    assert p["text"] in (out.get("reasoning") if p.get("thought") else out["content"])
            continue
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        for response in responses:
            tool = next(flat)
            assert tool["role"] == "tool"
            assert json.loads(tool["content"]) == response["response"]
        if len(responses) < len(parts):
            out = next(flat)
            assert out["role"] == "user"
            for p in parts:
                if "text" in p:
                    assert p["text"] in out["content"]
    assert next(flat, None) is None

    decls = [d for t in body.get("tools", []) for d in t.get("functionDeclarations", [])]
    assert [t["function"]["name"] for t in req.chat.get("tools", [])] == [d["name"] for d in decls]
    for tool, decl in zip(req.chat.get("tools", []), decls, strict=True):
        assert tool["function"]["parameters"] == decl["parametersJsonSchema"]
        assert tool["function"]["description"] == decl["description"]


def test_gemini_cli_function_response_answers_its_call_by_id():
    body = json.loads(
        (CAPTURES / "gemini-cli/03-gemini-call2-after-functionResponse.request.body.json").read_text()
    )
    messages = to_chat(body, "/v1beta/models/g:streamGenerateContent", {"alt": "sse"}).chat["messages"]
    call = messages[-2]["tool_calls"][0]
    assert call["id"] == "run_shell_command_1796004673445_0"
    assert messages[-1]["tool_call_id"] == call["id"]


def test_router_classifier_asks_for_json():
    body = json.loads(
        (CAPTURES / "gemini-cli/01-gemini-router-classifier-generateContent.request.body.json").read_text()
    )
    req = to_chat(body, "/v1beta/models/gemini-3.5-flash-lite:generateContent")
    fmt = req.chat["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"]["properties"]["complexity_score"]["type"] == "integer"
    assert (req.chat["temperature"], req.chat["top_p"]) == (1, 0.95)
    assert "top_k" not in req.chat and any("dropped topK=64" in n for n in req.notes)
    assert req.extra["include_thoughts"] is True


def test_calls_without_ids_are_matched_by_name_with_stable_ids():
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "do both"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "thinking it over", "thought": True},
                    {"text": "Doing both."},
                    {"functionCall": {"name": "read", "args": {"path": "a"}}},
                    {"functionCall": {"name": "bash", "args": {"command": "ls"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "bash", "response": {"output": "a b"}}},
                    {"functionResponse": {"name": "read", "response": {"content": "A"}}},
                ],
            },
        ]
    }
    first = to_chat(body).chat["messages"]
    again = to_chat(body).chat["messages"]
    assert first == again, "ids must be derived, not random"
    assistant, tool_bash, tool_read = first[1:]
    assert assistant["content"] == "Doing both." and assistant["reasoning"] == "thinking it over"
    ids = {c["function"]["name"]: c["id"] for c in assistant["tool_calls"]}
    assert tool_bash == {"role": "tool", "tool_call_id": ids["bash"], "content": '{"output": "a b"}'}
    assert tool_read == {"role": "tool", "tool_call_id": ids["read"], "content": '{"content": "A"}'}
    assert len(set(ids.values())) == 2


def test_orphan_function_response_is_noted():
    body = {"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "x", "response": {}}}]}]}
    req = to_chat(body)
    assert req.chat["messages"][0]["role"] == "tool"
    assert any("answers no earlier functionCall" in n for n in req.notes)


def test_inline_images_and_dropped_parts():
    body = {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "look"},
                    {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/4AAQ"}},
                    {"inlineData": {"mimeType": "application/pdf", "data": "JVBER"}},
                    {"executableCode": {"language": "PYTHON", "code": "print(1)"}},
                ],
            }
        ]
    }
    req = to_chat(body)
    assert req.chat["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
    ]
    notes = " | ".join(req.notes)
    assert "application/pdf" in notes and "executableCode" in notes


def test_gemini_schema_types_become_json_schema():
    schema = {
        "type": "OBJECT",
        "propertyOrdering": ["a", "type"],
        "required": ["a"],
        "properties": {
            "a": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["x", "y"]}},
            "type": {"type": "INTEGER", "nullable": True, "description": "a property named type"},
            "u": {"anyOf": [{"type": "NUMBER"}, {"type": "BOOLEAN"}]},
        },
    }
    assert schema_to_json_schema(schema) == {
        "type": "object",
        "required": ["a"],
        "properties": {
            "a": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}},
            "type": {"type": ["integer", "null"], "description": "a property named type"},
            "u": {"anyOf": [{"type": "number"}, {"type": "boolean"}]},
        },
    }


def test_tools_tool_config_and_generation_config():
    body = {
        "contents": [{"parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}, {"text": "be right"}]},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "f",
                        "description": "F",
                        "parameters": {"type": "OBJECT", "properties": {"n": {"type": "NUMBER"}}},
                    },
                    {"name": "g"},
                ]
            },
            {"googleSearch": {}},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["g"]}},
        "generationConfig": {
            "maxOutputTokens": 99,
            "temperature": 0.2,
            "topP": 0.8,
            "topK": 3,
            "stopSequences": ["###"],
            "seed": 7,
            "candidateCount": 2,
        },
        "safetySettings": [],
    }
    req = to_chat(body)
    chat = req.chat
    assert chat["messages"][:2] == [
        {"role": "system", "content": "be brief\nbe right"},
        {"role": "user", "content": "hi"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "F",
                "parameters": {"type": "object", "properties": {"n": {"type": "number"}}},
            },
        },
        {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    assert {k: chat[k] for k in ("max_tokens", "temperature", "top_p", "stop", "seed")} == {
        "max_tokens": 99,
        "temperature": 0.2,
        "top_p": 0.8,
        "stop": ["###"],
        "seed": 7,
    }
    notes = " | ".join(req.notes)
    for expected in ("dropped tool googleSearch", "dropped topK=3", "candidateCount=2", "safetySettings"):
        assert expected in notes


@pytest.mark.parametrize("mode, expected", [("AUTO", "auto"), ("ANY", "required"), ("NONE", "none")])
def test_function_calling_modes(mode, expected):
    body = {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}],
        "tools": [{"functionDeclarations": [{"name": "f"}]}],
        "toolConfig": {"functionCallingConfig": {"mode": mode}},
    }
    assert to_chat(body).chat["tool_choice"] == expected


@pytest.mark.parametrize(
    "body, path, message",
    [
        ({"contents": []}, PATH, "contents"),
        ({"contents": [{"role": "user"}]}, PATH, "parts"),
        ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, PATH, "role"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, PATH, "name"),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
            PATH,
            "args",
        ),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}},
                "tools": [{"functionDeclarations": [{"name": "f"}]}],
            },
            PATH,
            "mode",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}]}, "/v1beta/models/g:embedContent", "unsupported path"),
    ],
)
def test_malformed_requests_raise_request_error(body, path, message):
    with pytest.raises(RequestError, match=message):
        to_chat(body, path)


def test_unknown_alt_is_refused_clearly():
    with pytest.raises(RequestError, match="alt=sse or alt=json"):
        to_chat(
            {"contents": [{"parts": [{"text": "x"}]}]},
            "/v1beta/models/g:streamGenerateContent",
            {"alt": "proto"},
        )


def test_malformed_bodies_only_ever_raise_request_error():
    """Any JSON a client sends gets a 400 in Google's shape, never a 500 with a traceback."""
    from test_anthropic_request import mutations  # same directory, on sys.path

    rich = {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "contents": [
            {
                "role": "user",
                "parts": [{"text": "a"}, {"inlineData": {"mimeType": "image/png", "data": "x"}}],
            },
            {
                "role": "model",
                "parts": [{"text": "t", "thought": True}, {"functionCall": {"name": "f", "args": {}}}],
            },
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {
            "responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT"},
            "thinkingConfig": {"includeThoughts": True},
            "stopSequences": ["x"],
        },
    }
    gemini = json.loads(
        (CAPTURES / "gemini-cli/03-gemini-call2-after-functionResponse.request.body.json").read_text()
    )
    for base, seed in ((rich, 3), (gemini, 4)):
        for body in mutations(base, 1500, seed):
            try:
                to_chat(body, "/v1beta/models/g:streamGenerateContent", {"alt": "sse"})
            except RequestError:
                pass


def test_snake_case_field_names_are_accepted_but_user_data_is_not_renamed():
    """The genai SDK sends `thinkingConfig: {"include_thoughts": true}`; the API takes either
    spelling of every proto field. Function args, responses and property names are data."""
    body = {
        "system_instruction": {"parts": [{"text": "s"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"function_call": {"name": "f", "args": {"file_path": "a"}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "f", "response": {"exit_code": 0}}}]},
        ],
        "tools": [{"function_declarations": [{"name": "f", "parameters": {
            "type": "OBJECT", "properties": {"file_path": {"type": "STRING", "max_length": 9}}, "required": ["file_path"]}}]}],
        "tool_config": {"function_calling_config": {"mode": "ANY"}},
        "generation_config": {"max_output_tokens": 7, "stop_sequences": ["x"],
                              "thinking_config": {"include_thoughts": True}},
    }  # fmt: skip
    req = to_chat(body)
    chat = req.chat
    assert chat["messages"][0] == {"role": "system", "content": "s"}
    assert chat["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"file_path": "a"}'
    assert chat["messages"][3]["content"] == '{"exit_code": 0}'
    assert chat["tools"][0]["function"]["parameters"] == {
        "type": "object", "properties": {"file_path": {"type": "string", "maxLength": 9}}, "required": ["file_path"]}  # fmt: skip
    assert (chat["tool_choice"], chat["max_tokens"], chat["stop"]) == ("required", 7, ["x"])
    assert req.extra["include_thoughts"] is True
    assert not any("ignored" in n for n in req.notes), req.notes
