"""The prefix rule on the tiny model's real chat template (Qwen3-style ChatML with tools and thinking).

Prompts are rendered by the tokenizer's own template; "sampled" responses are the tokens the
engine would return (the canonical encoding of the text, plus <|im_end|> when the turn ended).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from traj_tokens import rec

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.trajectory import PrefixBuilder

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "list files",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
M1 = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files in src."},
]
THOUGHT, CALL_ARGS = "I should look.", {"path": "src"}
SAMPLED = '<think>\nI should look.\n</think>\n\n<tool_call>\n{"name": "ls", "arguments": {"path": "src"}}\n</tool_call>'
ECHOED = {
    "role": "assistant",
    "content": "",
    "reasoning_content": THOUGHT,
    "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": CALL_ARGS}}],
}


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tok, messages: list[dict[str, Any]]) -> list[int]:
    out = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def sample(tok, text: str, *, ended: bool = True) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False)
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")] if ended else ids


def _rec(idx: int, tok, messages: list[dict[str, Any]], response: list[int], **kw: Any) -> TraceRecord:
    r = rec(idx, render(tok, messages), response, **kw)
    return replace(r, normalized_request={"messages": messages, "tools": TOOLS})


def test_tool_loop_is_one_row_and_the_glue_newline_is_masked(tok) -> None:
    r1 = sample(tok, SAMPLED)
    m2 = [*M1, ECHOED, {"role": "tool", "content": "a.py\nb.py"}]
    res = PrefixBuilder().build([_rec(0, tok, M1, r1), _rec(1, tok, m2, sample(tok, "Two files."))])
    (row,) = res.rows
    p1 = render(tok, M1)
    assert row.input_ids[len(p1) : len(p1) + len(r1)] == r1
    glue = len(p1) + len(r1)
    assert tok.decode(row.input_ids[glue : glue + 1]) == "\n" and row.loss_mask[glue] == 0


def test_length_cut_turn_continues_with_unsampled_im_end_masked(tok) -> None:
    cut_text = "The files are a.py and"
    r1 = sample(tok, cut_text, ended=False)
    m2 = [*M1, {"role": "assistant", "content": cut_text}, {"role": "user", "content": "continue"}]
    res = PrefixBuilder().build(
        [_rec(0, tok, M1, r1, finish="length"), _rec(1, tok, m2, sample(tok, "b.py."))]
    )
    (row,) = res.rows
    end = len(render(tok, M1)) + len(r1)
    assert tok.convert_ids_to_tokens(row.input_ids[end]) == "<|im_end|>"
    assert row.loss_mask[end] == 0 and row.behavior_logprobs[end] == 0.0


def test_template_stripping_earlier_thinking_is_drift(tok) -> None:
    """A new user query makes the template drop the earlier turn's <think> block: same messages,
    different tokens, so the chain breaks as DRIFT (token-faithful prompts remove this)."""
    r1 = sample(tok, SAMPLED)
    m2 = [*M1, ECHOED, {"role": "tool", "content": "a.py"}]
    r2 = sample(tok, "One file.")
    m3 = [*m2, {"role": "assistant", "content": "One file."}, {"role": "user", "content": "Now delete it."}]
    res = PrefixBuilder().build(
        [_rec(0, tok, M1, r1), _rec(1, tok, m2, r2), _rec(2, tok, m3, sample(tok, "Done."))]
    )
    assert [r.call_indices for r in res.rows] == [(0, 1), (2,)]
    assert res.stats.breaks == {"drift": 1}
