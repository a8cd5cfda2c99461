"""Forced tool calls (tool_choice "required" / named): the grammar (engine/constrain.py) and the
contract on a real engine. The untrained tiny model never writes a tool call on its own, so any call
in its answer comes from the mask. (Token-for-token parity with vLLM: test_vllm_reference.py.)"""

from __future__ import annotations

import httpx
import pytest

from polar_pl.engine.constrain import ToolCallGrammar, accepting, advance

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("read", "read_file")
]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "read", "arguments": {"a": [1, -2.5e3, true, null, {}], "b": "x\\n\\u00e9"}}\n</tool_call>',
        '<tool_call>{"name": "read_file", "arguments": 0}</tool_call>',
        '<tool_call>{"name": "read", "arguments": "s"}</tool_call><tool_call>{"name": "read", "arguments": []}</tool_call>',
    ],
)
def test_grammar_accepts_hermes_calls(text):
    g = ToolCallGrammar.for_tools(["read", "read_file"], stop_after_first=False)
    assert accepting(advance(g, g.initial(), text))


@pytest.mark.parametrize(
    "text",
    [
        "ok <tool_call>",  # no text before the call
        '<tool_call>{"name": "write", "arguments": {}}</tool_call>',  # unknown tool
        '<tool_call>{"name": "read", "arguments": {"a" 1}}</tool_call>',  # bad JSON
        '<tool_call>{"name": "read", "arguments": 01}</tool_call>',
        '<tool_call>\n{"name": "read", "arguments": {}}</tool_call>',  # mixed tag variants
    ],
)
def test_grammar_rejects(text):
    g = ToolCallGrammar.for_tools(["read", "read_file"], stop_after_first=False)
    assert advance(g, g.initial(), text) is None


def test_named_stops_after_one_call_and_think_comes_first():
    g = ToolCallGrammar.for_tools(["read"], stop_after_first=True, after_think=True)
    call = '<tool_call>{"name": "read", "arguments": {}}</tool_call>'
    state = advance(g, g.initial(), "<think>plan</think>" + call)
    assert accepting(state) and advance(g, state, "<") is None
    assert advance(g, g.initial(), "plan</think>\n") is None  # the call starts right after </think>


@pytest.mark.parametrize(
    ("tool_choice", "finish"),
    [("required", "tool_calls"), ({"type": "function", "function": {"name": "read_file"}}, "stop")],
    ids=["required", "named"],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forced_choice_always_returns_a_call(engine, tool_choice, finish, temperature):
    r = httpx.post(
        f"{engine.base_url}/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "go"}],
            "tools": TOOLS,
            "tool_choice": tool_choice,
            "temperature": temperature,
            "seed": 1,
            "max_tokens": 400,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "length":  # an endless JSON value: still inside the language
        assert choice["message"]["content"].startswith("<tool_call>")
        return
    assert choice["finish_reason"] == finish
    assert choice["message"]["content"] == ""
    names = [c["function"]["name"] for c in choice["message"]["tool_calls"]]
    assert names and set(names) <= {"read", "read_file"}
    if isinstance(tool_choice, dict):
        assert names == ["read_file"]


def test_named_tool_not_in_tools_is_a_400(engine):
    r = httpx.post(
        f"{engine.base_url}/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "go"}],
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        timeout=60,
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tool_choice"
