"""Reasoning parsing against the reference: vLLM's CPU build with `--reasoning-parser qwen3` and
the embedded engine with `reasoning_parser="qwen3"`, serving a tiny model trained to answer with
`<think>...</think>`, text, then a hermes tool call. Same tokens, same split into `reasoning`,
content and tool calls, streamed and not."""

from __future__ import annotations

import json

import httpx
import pytest

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.vllm_engine import VLLMEngine, vllm_installed, vllm_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_installed(), reason=f"vLLM CPU build not installed at {vllm_python()}"),
]


@pytest.fixture(scope="module")
def engines(think_model_dir):
    vllm = VLLMEngine(think_model_dir, served_model_name="tool", max_model_len=4096, reasoning_parser="qwen3")
    embedded = EmbeddedEngine(
        think_model_dir, served_model_name="tool", max_model_len=4096, reasoning_parser="qwen3"
    )
    try:
        vllm.start()
        embedded.start()
        yield embedded, vllm
    finally:
        embedded.stop()
        vllm.stop()


def both(engines, body: dict) -> list[dict]:
    out = []
    for eng in engines:
        r = httpx.post(f"{eng.base_url}/chat/completions", json={"model": "tool", **body}, timeout=120)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def both_streamed(engines, body: dict) -> list[list[dict]]:
    out = []
    for eng in engines:
        chunks = []
        with httpx.stream(
            "POST",
            f"{eng.base_url}/chat/completions",
            json={"model": "tool", **body, "stream": True},
            timeout=120,
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        out.append(chunks)
    return out


def _message_view(choice: dict) -> dict:
    m = choice["message"]
    return {
        "content": m["content"],
        "reasoning": m.get("reasoning"),
        "has_reasoning_content": "reasoning_content" in m,
        "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []],
        "finish": choice["finish_reason"],
        "token_ids": choice["token_ids"],
    }


def _stream_view(chunks: list[dict]) -> dict:
    """What a client reassembles, plus the order of delta kinds (consecutive repeats collapsed):
    vLLM merges tokens into one chunk when its output loop lags, so chunk boundaries are timing."""
    kinds: list[tuple] = []
    view: dict = {"reasoning": "", "content": "", "names": [], "arguments": "", "token_ids": [], "finish": []}
    for c in chunks:
        for ch in c["choices"]:
            d = {k: v for k, v in ch["delta"].items() if v is not None and k != "role"}
            kind = tuple(sorted(d))
            if kind and (not kinds or kinds[-1] != kind):
                kinds.append(kind)
            view["reasoning"] += d.get("reasoning", "")
            view["content"] += d.get("content", "")
            for tc in d.get("tool_calls") or []:
                if "name" in tc.get("function", {}):
                    view["names"].append(tc["function"]["name"])
                view["arguments"] += tc.get("function", {}).get("arguments", "")
            view["token_ids"] += ch.get("token_ids") or []
            if ch["finish_reason"]:
                view["finish"].append(ch["finish_reason"])
    view["kinds"] = kinds
    return view


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_reasoning_split_matches_vllm(engines, tool_case, with_tools):
    body = {"messages": tool_case.messages, "temperature": 0, "max_tokens": 60, "return_token_ids": True}
    if with_tools:
        body["tools"] = tool_case.tools
    ours, ref = both(engines, body)
    assert ours["prompt_token_ids"] == ref["prompt_token_ids"]
    a, b = _message_view(ours["choices"][0]), _message_view(ref["choices"][0])
    assert a == b
    if with_tools:
        # the think block, then content kept verbatim (vLLM strips no whitespace), then the call
        assert a["reasoning"] == "\nThe user wants a file.\n" and a["content"] == "\n\nok\n"
        assert a["calls"][0][0] == "write_file" and a["finish"] == "tool_calls"
    else:
        # an untrained answer without </think> is all reasoning
        assert a["content"] is None and a["reasoning"]
    assert not a["has_reasoning_content"]


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_streamed_reasoning_matches_vllm(engines, tool_case, with_tools):
    body = {"messages": tool_case.messages, "temperature": 0, "max_tokens": 60, "return_token_ids": True}
    if with_tools:
        body["tools"] = tool_case.tools
    ours, ref = both_streamed(engines, body)
    view, ref_view = _stream_view(ours), _stream_view(ref)
    assert coalesces_to(view.pop("kinds"), ref_view.pop("kinds"))
    assert view == ref_view


def coalesces_to(ours: list[tuple], ref: list[tuple]) -> bool:
    """Whether the order of delta kinds `ours` sent reads as `ref` once some neighbours share a
    chunk. vLLM merges the tokens of a lagging output loop into one delta (a CI run under load:
    ours content, reasoning, content, tool_calls; vLLM's content, content+reasoning, tool_calls),
    so one of its kinds may stand for a run of ours; kinds out of order or missing still fail."""
    i = 0
    for kind in ref:
        want, got = set(kind), set()
        while i < len(ours) and set(ours[i]) <= want:
            got |= set(ours[i])
            i += 1
        if got != want:
            return False
    return i == len(ours)


def test_coalesced_kinds_read_as_the_same_order_and_a_reordered_one_does_not():
    c, r, t = ("content",), ("reasoning",), ("tool_calls",)
    assert coalesces_to([c, r, c, t], [c, ("content", "reasoning"), t])
    assert coalesces_to([c, r, c, t], [c, r, c, t])
    assert not coalesces_to([c, r, c, t], [c, r, t])
    assert not coalesces_to([r, c, t], [c, r, t])
    assert not coalesces_to([c, r], [c, r, t])


def test_thinking_off_is_plain_content(engines, tool_case):
    """chat_template_kwargs enable_thinking=false: no reasoning split, on either engine."""
    body = {
        "messages": tool_case.messages,
        "temperature": 0,
        "max_tokens": 8,
        "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    ours, ref = both(engines, body)
    assert ours["prompt_token_ids"] == ref["prompt_token_ids"]
    assert _message_view(ours["choices"][0]) == _message_view(ref["choices"][0])
    assert ours["choices"][0]["message"]["reasoning"] is None


def test_assistant_reasoning_and_reasoning_content_render_alike(engines, tool_case):
    """Input side: `reasoning` and the deprecated `reasoning_content` on an assistant turn after the
    last user query render the same prompt on both engines (vLLM renames one to the other)."""
    prompts = []
    for field in ("reasoning", "reasoning_content", None):
        messages = [
            *tool_case.messages,
            {
                "role": "assistant",
                "content": None,
                **({field: "I should write it."} if field else {}),
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        body = {"messages": messages, "tools": tool_case.tools, "max_tokens": 1, "return_token_ids": True}
        ours, ref = both(engines, body)
        assert ours["prompt_token_ids"] == ref["prompt_token_ids"]
        prompts.append(ours["prompt_token_ids"])
    assert prompts[0] == prompts[1] != prompts[2]  # and the reasoning is really rendered


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "write_file"}}],
    ids=["required", "named"],
)
def test_forced_tool_call_after_reasoning_matches_vllm(engines, tool_case, tool_choice):
    """With a reasoning parser, vLLM lets the think block through and forces the call right after
    `</think>`; the embedded grammar does the same."""
    body = {
        "messages": tool_case.messages,
        "tools": tool_case.tools,
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 60,
        "return_token_ids": True,
    }
    ours, ref = both(engines, body)
    a, b = ours["choices"][0], ref["choices"][0]
    assert a["token_ids"] == b["token_ids"]
    assert a["message"]["reasoning"] == b["message"]["reasoning"] == "\nThe user wants a file.\n"
    assert a["message"]["content"] == b["message"]["content"]
    assert a["finish_reason"] == b["finish_reason"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in a["message"].get("tool_calls") or []
    ]
    assert calls == [
        (c["function"]["name"], c["function"]["arguments"]) for c in b["message"].get("tool_calls") or []
    ]
    ours_s, ref_s = both_streamed(engines, body)
    assert _stream_view(ours_s) == _stream_view(ref_s)
