"""The chat template renders tools, tool calls, tool results and thinking exactly as Qwen3's does.

Expected strings are written out literally from Qwen3's template behaviour (Qwen/Qwen3-8B), so any
drift in whitespace or ordering fails here rather than in a harness trace.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def _call(args, id_="c1", name="get_weather"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the tool.",
        "tool_calls": [_call({"city": "Paris"})],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_tools_call_result_and_current_thinking(tok):
    """Thinking after the last user query is kept; the tool result becomes a user turn."""
    assert render(tok, CONVERSATION, tools=TOOLS, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_HEADER + "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_thinking_of_earlier_turns_is_dropped(tok):
    """Once a new user query arrives, earlier assistant turns lose their <think> blocks."""
    messages = CONVERSATION + [
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Got it."},
        {"role": "user", "content": "Thanks"},
    ]
    assert render(tok, messages, tools=TOOLS) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_HEADER + "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is sunny.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n"
    )


def test_final_turn_gets_empty_think_and_think_in_content_is_split(tok):
    """The last assistant turn always shows a think block; inline <think> in content is parsed out."""
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert render(tok, messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n"
    )
    messages[1]["content"] = "<think>\nhmm\n</think>\n\nHello"
    assert render(tok, messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello<|im_end|>\n"
    )


def test_string_arguments_parallel_calls_and_consecutive_tool_results(tok):
    """JSON-string arguments are emitted verbatim; consecutive tool messages share one user turn."""
    messages = [
        {"role": "user", "content": "Two cities"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [_call(json.dumps({"city": "Oslo"})), _call({"city": "Lima"}, id_="c2")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {"role": "tool", "tool_call_id": "c2", "content": "sun"},
    ]
    assert render(tok, messages, add_generation_prompt=True) == (
        "<|im_start|>user\nTwo cities<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nrain\n</tool_response>\n<tool_response>\nsun\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_enable_thinking_false_and_system_without_tools(tok):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert (
        render(tok, messages[1:], add_generation_prompt=True)
        == "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_without_system_prompt(tok):
    messages = [{"role": "user", "content": "Q"}]
    assert (
        render(tok, messages, tools=TOOLS)
        == "<|im_start|>system\n" + TOOLS_HEADER + "<|im_start|>user\nQ<|im_end|>\n"
    )


def test_template_file_and_config_agree(tiny_model_dir):
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == (tiny_model_dir / "chat_template.jinja").read_text()
