"""qwen3 reasoning parsing (chat/reasoning.py): the splits vLLM 0.32's `--reasoning-parser qwen3`
makes (observed on the real server; the live comparison is in test_vllm_reference.py)."""

from __future__ import annotations

import pytest

from polar_pl.chat.reasoning import ReasoningStream, check_reasoning_parser, split_reasoning

CASES = [
    # think block, then content kept verbatim (vLLM keeps the blank lines after </think>)
    ("<think>\nplan\n</think>\n\nok", ("\nplan\n", "\n\nok")),
    # no </think>: everything is reasoning, content None (thinking starts on)
    ("just text", ("just text", None)),
    # <tool_call> ends reasoning implicitly and stays in the content for the tool parser
    ("<think>x<tool_call>{}</tool_call>", ("x", "<tool_call>{}</tool_call>")),
    # a second </think> is dropped from the finished message (a stream keeps it, as vLLM's does:
    # tests/engine/test_vllm_reasoning.py::test_forced_tool_call_after_reasoning_matches_vllm)
    ("<think>a</think>b</think>c", ("a", "bc")),
    ("<think></think>", (None, None)),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_split_reasoning(text, expected):
    assert split_reasoning(text) == expected


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_stream_reassembles_to_the_full_split(text, expected):
    """Fed one character at a time, the reasoning deltas join to the full parse's reasoning and
    the last content equals its content, a later </think> kept."""
    stream = ReasoningStream()
    reasoning, content = "", None
    for k in range(1, len(text) + 1):
        new, content = stream.feed(text[:k])
        reasoning += new or ""
        assert "<think" not in reasoning and "</" not in reasoning
    if text.count("</think>") > 1:  # streamed, a later </think> stays (vLLM's deltas keep it)
        expected = (expected[0], text[text.index("</think>") + len("</think>") :])
    assert (reasoning or None, content or None) == expected


def test_unknown_parser_is_a_config_error():
    with pytest.raises(ValueError, match="reasoning_parser"):
        check_reasoning_parser("deepseek")
