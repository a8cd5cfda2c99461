"""Reasoning parsing: `<think>...</think>` split into `reasoning` and content, as vLLM 0.32 does it
with `--reasoning-parser qwen3` (`vllm/parser/qwen3.py`, the parser-engine grammar).

Observed and copied behaviour (checked against vLLM in tests/engine/test_vllm_reference.py):
- the output starts in the reasoning state (thinking is on unless the request passes
  `chat_template_kwargs: {"enable_thinking": false}`): text before any `</think>` is reasoning,
  even without an opening `<think>`; `<think>` itself is dropped;
- `</think>` ends reasoning; `<tool_call>` ends it implicitly. A later `</think>` is dropped from a
  finished message but kept in streamed deltas (vLLM streams the text after the end as it comes:
  seen in a forced tool call's streamed arguments, tests/engine/test_vllm_reasoning.py);
- the text after it is content, verbatim (whitespace kept), and goes through the tool parser;
- empty reasoning / content are None; the message field is `reasoning` (vLLM 0.32 sends no
  `reasoning_content`); streamed deltas carry {"reasoning": ...} and {"content": ...}.
"""

from __future__ import annotations

from dataclasses import dataclass

from polar_pl.chat.toolparse import TOOL_CALL_START, partial_tag_overlap

THINK_START = "<think>"
THINK_END = "</think>"
REASONING_PARSERS = ("qwen3",)


def check_reasoning_parser(name: str | None) -> str | None:
    if name is not None and name not in REASONING_PARSERS:
        raise ValueError(f"engine.reasoning_parser must be one of {REASONING_PARSERS} or null, got {name!r}")
    return name


def thinking_enabled(chat_template_kwargs: dict | None) -> bool:
    return bool((chat_template_kwargs or {}).get("enable_thinking", True))


def _reasoning_end(text: str) -> tuple[int, int] | None:
    """(start, end) of what ends reasoning: `</think>` (consumed) or `<tool_call>` (kept)."""
    i, j = text.find(THINK_END), text.find(TOOL_CALL_START)
    if i != -1 and (j == -1 or i < j):
        return i, i + len(THINK_END)
    if j != -1:
        return j, j
    return None


def split_reasoning(text: str) -> tuple[str | None, str | None]:
    """A finished output -> (reasoning, content)."""
    end = _reasoning_end(text)
    if end is None:
        return text.replace(THINK_START, "") or None, None
    reasoning = text[: end[0]].replace(THINK_START, "")
    content = text[end[1] :].replace(THINK_END, "")
    return reasoning or None, content or None


@dataclass(slots=True)
class ReasoningStream:
    """Per-choice streaming state. Feed the full text so far; get the new reasoning text and the
    content text so far (None while still reasoning)."""

    sent_reasoning: int = 0  # chars of the reasoning (THINK_START removed) already sent

    def feed(self, current_text: str) -> tuple[str | None, str | None]:
        end = _reasoning_end(current_text)
        if end is None:
            raw = current_text
            # hold back what could still become </think> or <tool_call>
            hold = max(partial_tag_overlap(raw, THINK_END), partial_tag_overlap(raw, TOOL_CALL_START))
            reasoning = raw[: len(raw) - hold].replace(THINK_START, "")
            hold_start = partial_tag_overlap(reasoning, THINK_START) if not hold else 0
            reasoning = reasoning[: len(reasoning) - hold_start]
            content = None
        else:
            reasoning = current_text[: end[0]].replace(THINK_START, "")
            content = current_text[end[1] :]  # streamed, a later </think> stays (vLLM's deltas keep it)
        new = reasoning[self.sent_reasoning :]
        self.sent_reasoning = max(self.sent_reasoning, len(reasoning))
        return new or None, content
