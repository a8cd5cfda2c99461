"""Gemini responses and `alt=sse` streams, checked structurally.

`check_stream` asserts the streamGenerateContent grammar (one GenerateContentResponse per `data:`
frame, valid parts, finishReason and usageMetadata on the last frame only, error frames terminal).
It is validated on the streams real CLIs accepted and on broken streams, then used on the
translator fed realistic vLLM chunk sequences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import CAPTURES

from polar_pl.gateway.providers import get_adapter
from polar_pl.gateway.providers.thinking_signature import decode_signature

adapter = get_adapter("google")

GEMINI_STREAMS = sorted(
    p
    for p in CAPTURES.glob("*/*.response-from-recorder.sse.txt")
    if "gemini" in p.name or "gemini" in p.parent.name
)
FINISH_REASONS = {"STOP", "MAX_TOKENS", "SAFETY", "RECITATION", "OTHER", "MALFORMED_FUNCTION_CALL"}
STREAM_PATH = "/v1beta/models/gemini-x:streamGenerateContent"


class GrammarError(AssertionError):
    pass


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise GrammarError(msg)


def check_response(resp: dict[str, Any], *, last: bool) -> list[dict[str, Any]]:
    """One GenerateContentResponse; returns its parts."""
    candidates = resp.get("candidates")
    _need(isinstance(candidates, list) and len(candidates) == 1, "exactly one candidate")
    cand = candidates[0]
    _need(cand.get("index", 0) == 0, "candidate index")
    parts: list[dict[str, Any]] = []
    if "content" in cand:
        _need(cand["content"].get("role") == "model", "content.role must be model")
        parts = cand["content"].get("parts")
        _need(isinstance(parts, list) and bool(parts), "content without parts")
    for part in parts:
        kinds = [k for k in ("text", "functionCall") if k in part]
        _need(len(kinds) == 1, f"part must be text or functionCall: {part}")
        if "functionCall" in part:
            call = part["functionCall"]
            _need(isinstance(call.get("name"), str) and bool(call["name"]), "functionCall.name")
            _need(isinstance(call.get("args"), dict), "functionCall.args must be an object")
            _need("thought" not in part, "thought flag on a functionCall")
        else:
            _need(isinstance(part["text"], str) and bool(part["text"]), "empty text part")
    _need(isinstance(resp.get("modelVersion"), str), "modelVersion")
    if last:
        _need(cand.get("finishReason") in FINISH_REASONS, f"finishReason {cand.get('finishReason')}")
        usage = resp.get("usageMetadata") or {}
        keys = ("promptTokenCount", "candidatesTokenCount", "totalTokenCount")
        _need(all(isinstance(usage.get(k), int) for k in keys), "usageMetadata counts")
        _need(usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"], "total")
    else:
        _need("finishReason" not in cand, "finishReason before the last frame")
    return parts


def check_stream(raw: str) -> dict[str, Any]:
    """Assert the alt=sse grammar; returns {text, thoughts, calls, finishReason, usage} or {error}."""
    frames = [f for f in raw.replace("\r\n", "\n").split("\n\n") if f.strip()]
    _need(bool(frames), "empty stream")
    out: dict[str, Any] = {"text": "", "thoughts": "", "calls": []}
    ids = set()
    for i, frame in enumerate(frames):
        _need(frame.startswith("data: ") and "\n" not in frame, f"frame is not one data line: {frame!r}")
        resp = json.loads(frame[len("data: ") :])
        if "error" in resp:
            err = resp["error"]
            _need(isinstance(err.get("code"), int) and isinstance(err.get("message"), str), "error fields")
            _need(isinstance(err.get("status"), str) and err["status"].isupper(), "error.status")
            _need(i == len(frames) - 1, "frames after an error")
            return {**out, "error": err}
        ids.add(resp.get("responseId"))
        last = i == len(frames) - 1
        for part in check_response(resp, last=last):
            if "functionCall" in part:
                out["calls"].append(part["functionCall"])
            elif part.get("thought"):
                out["thoughts"] += part["text"]
            else:
                out["text"] += part["text"]
        if last:
            out["finishReason"] = resp["candidates"][0]["finishReason"]
            out["usage"] = resp["usageMetadata"]
    _need(len(ids) == 1, "responseId changed within one stream")
    return out


# -- the checker itself ------------------------------------------------------------------------


def test_fixture_streams_found():
    assert len(GEMINI_STREAMS) == 4


@pytest.mark.parametrize("path", GEMINI_STREAMS, ids=lambda p: f"{p.parent.name}/{p.name[:20]}")
def test_checker_accepts_streams_real_clis_accepted(path: Path):
    result = check_stream(path.read_text())
    assert result["finishReason"] == "STOP" and (result["text"] or result["calls"])


def test_checker_accepts_recorded_classifier_response():
    path = CAPTURES / "gemini-cli/01-gemini-router-classifier-generateContent.response-from-recorder.json"
    parts = check_response(json.loads(path.read_text()), last=True)
    assert json.loads(parts[0]["text"])["complexity_score"] == 10


def _frame(resp: dict[str, Any]) -> str:
    return f"data: {json.dumps(resp)}\n\n"


def _resp(parts=None, finish=None, rid="r1"):
    cand: dict[str, Any] = {"index": 0}
    if parts is not None:
        cand["content"] = {"role": "model", "parts": parts}
    resp: dict[str, Any] = {"candidates": [cand], "modelVersion": "m", "responseId": rid}
    if finish:
        cand["finishReason"] = finish
        resp["usageMetadata"] = {"promptTokenCount": 2, "candidatesTokenCount": 1, "totalTokenCount": 3}
    return resp


@pytest.mark.parametrize(
    "frames, why",
    [
        ([_resp([{"text": "a"}])], "finishReason"),
        ([_resp([{"text": "a"}], "STOP"), _resp([{"text": "b"}], "STOP")], "before the last"),
        ([_resp([{"functionCall": {"name": "f", "args": "{}"}}], "STOP")], "args"),
        ([_resp([{"text": "a", "functionCall": {"name": "f", "args": {}}}], "STOP")], "text or functionCall"),
        ([_resp([{"text": "a"}]), _resp(None, "STOP", rid="r2")], "responseId"),
        ([_resp([], "STOP")], "without parts"),
        (
            [{"error": {"code": 500, "message": "x", "status": "INTERNAL"}}, _resp(None, "STOP")],
            "after an error",
        ),
    ],
)
def test_checker_rejects_broken_streams(frames, why):
    assert check_stream(_frame(_resp([{"text": "a"}])) + _frame(_resp(None, "STOP")))["text"] == "a"
    with pytest.raises(GrammarError, match=why):
        check_stream("".join(_frame(f) for f in frames))


# -- the translator --------------------------------------------------------------------------


def vllm_chunks(*, reasoning=(), content=(), tools=(), finish="stop", prompt_len=11):
    """Chunks shaped like vLLM's chat stream with return_token_ids (see the Anthropic test)."""
    n = 0

    def chunk(delta, **choice):
        nonlocal n
        n += 1
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": None,
                    "token_ids": [n],
                    **choice,
                }
            ],
        }

    first = chunk({"role": "assistant", "content": ""})
    first["prompt_token_ids"] = list(range(prompt_len))
    chunks = [first]
    chunks += [chunk({"reasoning": r}) for r in reasoning]  # newer vLLM names the field `reasoning`
    chunks += [chunk({"content": c}) for c in content]
    for i, (call_id, name, pieces) in enumerate(tools):
        head = {"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in pieces]
    chunks.append(chunk({}, finish_reason=finish))
    usage = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}
    chunks.append({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return chunks, usage


def run_stream(body, chunks, usage, finish) -> str:
    req = adapter.to_chat(body, path=STREAM_PATH, query={"alt": "sse"})
    translator = adapter.stream(req)
    out = translator.start() + b"".join(translator.feed(c) for c in chunks)
    return (out + translator.finish(finish, usage)).decode()


BODY = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
THINKING_BODY = {**BODY, "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}


def test_text_stream_forwards_each_piece():
    chunks, usage = vllm_chunks(content=["Hel", "lo"])
    raw = run_stream(BODY, chunks, usage, "stop")
    result = check_stream(raw)
    assert result["text"] == "Hello" and result["finishReason"] == "STOP"
    assert result["usage"] == {
        "promptTokenCount": 11,
        "candidatesTokenCount": usage["completion_tokens"],
        "totalTokenCount": 11 + usage["completion_tokens"],
    }
    assert raw.count("data: ") == 3  # two text frames, one closing frame
    assert json.loads(raw.split("\n\n")[0][6:])["modelVersion"] == "gemini-x"


def test_thoughts_only_when_asked_for():
    chunks, usage = vllm_chunks(reasoning=["hmm ", "ok"], content=["A"])
    with_thoughts = check_stream(run_stream(THINKING_BODY, chunks, usage, "stop"))
    assert (with_thoughts["thoughts"], with_thoughts["text"]) == ("hmm ok", "A")
    without = check_stream(run_stream(BODY, chunks, usage, "stop"))
    assert (without["thoughts"], without["text"]) == ("", "A")


def test_one_tool_call_split_across_many_pieces_is_sent_whole():
    args = '{"command": "echo hello > f.txt"}'
    chunks, usage = vllm_chunks(
        content=["On it."], tools=[("id1", "run_shell_command", list(args))], finish="tool_calls"
    )
    raw = run_stream(BODY, chunks, usage, "tool_calls")
    result = check_stream(raw)
    assert result["text"] == "On it."
    assert result["calls"] == [
        {"name": "run_shell_command", "args": {"command": "echo hello > f.txt"}, "id": "id1"}
    ]
    assert result["finishReason"] == "STOP"


def test_two_tool_calls_first_sent_when_second_starts():
    a, b = '{"path": "a"}', '{"command": "ls", "timeout": 3}'
    chunks, usage = vllm_chunks(
        tools=[("x", "read", [a[:3], a[3:]]), ("y", "bash", [b[:5], b[5:9], b[9:]])], finish="tool_calls"
    )
    translator = adapter.stream(adapter.to_chat(BODY, path=STREAM_PATH, query={"alt": "sse"}))
    outs = [translator.feed(c) for c in chunks]
    second_head = 1 + 1 + 2  # role chunk, first call head, its two pieces
    assert b'"name":"read"' in outs[second_head], "first call goes out as soon as the second begins"
    raw = (b"".join(outs) + translator.finish("tool_calls", usage)).decode()
    assert [(c["name"], c["args"]) for c in check_stream(raw)["calls"]] == [
        ("read", {"path": "a"}),
        ("bash", {"command": "ls", "timeout": 3}),
    ]


@pytest.mark.parametrize(
    "finish, expected", [("length", "MAX_TOKENS"), ("content_filter", "SAFETY"), ("stop", "STOP")]
)
def test_finish_reasons(finish, expected):
    chunks, usage = vllm_chunks(content=["x"], finish=finish)
    assert check_stream(run_stream(BODY, chunks, usage, finish))["finishReason"] == expected


def test_engine_failure_mid_stream_is_an_error_frame():
    chunks, _ = vllm_chunks(content=["part"])
    translator = adapter.stream(adapter.to_chat(BODY, path=STREAM_PATH, query={"alt": "sse"}))
    raw = b"".join(translator.feed(c) for c in chunks[:2]) + translator.error(504, "engine timed out")
    result = check_stream(raw.decode())
    assert result["text"] == "part"
    assert result["error"] == {"code": 504, "message": "engine timed out", "status": "DEADLINE_EXCEEDED"}


# -- non-streaming -----------------------------------------------------------------------------


def completion(message, finish="stop", prompt_tokens=40):
    return {
        "id": "c",
        "object": "chat.completion",
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": finish,
                "logprobs": None,
                "token_ids": [1, 2],
            }
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "total_tokens": prompt_tokens + 2},
        "prompt_token_ids": list(range(prompt_tokens)),
    }


def test_response_with_thought_text_and_call():
    req = adapter.to_chat(THINKING_BODY, path=PATH, query={})
    msg = {
        "content": "Sure.",
        "reasoning_content": "think",
        "tool_calls": [{"id": "k", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    out = adapter.from_chat(completion(msg, "tool_calls"), req)
    parts = check_response(out, last=True)
    signature = parts[1].pop("thoughtSignature")
    assert parts[2].pop("thoughtSignature") == signature, "the first functionCall carries it too"
    assert parts == [
        {"text": "think", "thought": True},
        {"text": "Sure."},
        {"functionCall": {"name": "f", "args": {"a": 1}, "id": "k"}},
    ]
    assert decode_signature(signature) == "think"
    assert out["candidates"][0]["finishReason"] == "STOP"
    assert out["usageMetadata"]["promptTokenCount"] == 40 and out["modelVersion"] == "gemini-x"


PATH = "/v1beta/models/gemini-x:generateContent"


def test_round_trip_reproduces_the_engine_turn():
    """A functionCall the gateway answered, sent back with its functionResponse, must become the
    same assistant turn (id, name, argument text) the engine produced."""
    req = adapter.to_chat(BODY, path=PATH, query={})
    engine = {
        "content": "",
        "tool_calls": [
            {
                "id": "call_z",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls -a", "n": 2}'},
            }
        ],
    }
    out = adapter.from_chat(completion(engine, "tool_calls"), req)
    follow_up = {
        "contents": [
            *BODY["contents"],
            out["candidates"][0]["content"],
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": "call_z", "name": "bash", "response": {"output": "."}}}
                ],
            },
        ]
    }
    messages = adapter.to_chat(follow_up, path=PATH, query={}).chat["messages"]
    assert messages[1] == {"role": "assistant", **engine}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_z", "content": '{"output": "."}'}


def test_reasoning_survives_a_history_without_thought_parts():
    """Gemini CLI drops thought parts from its history but keeps thoughtSignature; the engine
    must still get back the reasoning it produced for the in-loop turn (prefix identity)."""
    req = adapter.to_chat(THINKING_BODY, path=PATH, query={})
    engine = {
        "content": "",
        "reasoning_content": "ls first",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        ],
    }
    out = adapter.from_chat(completion(engine, "tool_calls"), req)
    kept = [p for p in out["candidates"][0]["content"]["parts"] if not p.get("thought")]
    assert kept[0]["thoughtSignature"]
    # The Python SDK re-encodes signature bytes with the URL-safe alphabet; both must decode.
    kept[0]["thoughtSignature"] = kept[0]["thoughtSignature"].replace("+", "-").replace("/", "_")
    follow_up = {
        "contents": [
            *BODY["contents"],
            {"role": "model", "parts": kept},
            {"role": "user", "parts": [{"functionResponse": {"name": "bash", "response": {}}}]},
        ]
    }
    messages = adapter.to_chat(follow_up, path=PATH, query={}).chat["messages"]
    assert messages[1] == {"role": "assistant", **engine, "reasoning": "ls first"}


def test_stream_signs_the_first_answer_part_with_the_reasoning():
    chunks, usage = vllm_chunks(reasoning=["a ", "plan"], content=["x", "y"])
    raw = run_stream(BODY, chunks, usage, "stop")
    frames = [json.loads(f[6:]) for f in raw.split("\n\n") if f]
    signed = [
        p
        for f in frames
        for p in f["candidates"][0].get("content", {}).get("parts", [])
        if "thoughtSignature" in p
    ]
    assert len(signed) == 1 and signed[0]["text"] == "x"
    assert decode_signature(signed[0]["thoughtSignature"]) == "a plan"
    assert decode_signature("skip_thought_signature_validator") is None


@pytest.mark.parametrize(
    "status, name",
    [
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (404, "NOT_FOUND"),
        (429, "RESOURCE_EXHAUSTED"),
        (500, "INTERNAL"),
        (502, "UNAVAILABLE"),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
    ],
)
def test_error_body(status, name):
    assert adapter.error_body(status, "m") == {"error": {"code": status, "message": "m", "status": name}}


def test_stream_signs_the_first_function_call_as_well():
    chunks, usage = vllm_chunks(
        reasoning=["why"], content=["Sure."], tools=[("a", "f", ["{}"]), ("b", "g", ["{}"])]
    )
    raw = run_stream(BODY, chunks, usage, "tool_calls")
    parts = [
        p
        for f in raw.split("\n\n")
        if f
        for p in json.loads(f[6:])["candidates"][0].get("content", {}).get("parts", [])
    ]
    signed = [p.get("text") or p["functionCall"]["name"] for p in parts if "thoughtSignature" in p]
    assert signed == ["Sure.", "f"]


def test_stream_without_alt_sse_is_one_json_array_sent_element_by_element():
    req = adapter.to_chat(BODY, path=STREAM_PATH, query={})
    assert req.extra["media_type"] == "application/json"
    translator = adapter.stream(req)
    chunks, usage = vllm_chunks(content=["a", "b"])
    pieces = [translator.start()] + [translator.feed(c) for c in chunks] + [translator.finish("stop", usage)]
    assert pieces[0] == b"[" and pieces[2].startswith(b"{") and pieces[3].startswith(b",")
    items = json.loads(b"".join(pieces))
    assert [check_response(item, last=i == len(items) - 1) for i, item in enumerate(items)][:2] == [
        [{"text": "a"}], [{"text": "b"}]]  # fmt: skip
    assert items[-1]["candidates"][0]["finishReason"] == "STOP"
    failed = adapter.stream(req)
    raw = failed.start() + failed.feed(chunks[1]) + failed.error(500, "boom")
    assert json.loads(raw)[-1] == {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}
