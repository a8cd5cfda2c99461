"""Warm start: tool-call scoring, assistant-only loss masks, and a short real fine-tuning run."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from polar_pl.tinymodel.model import init_model, tiny_config
from polar_pl.tinymodel.tokenizer import render_chat
from polar_pl.warmstart.chat_warmstart import IGNORE, assistant_mask, training_examples, warm_start
from polar_pl.warmstart.toolcall_eval import eval_prompts, parse_tool_calls


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a"}}\n</tool_call>', [("Read", {"file_path": "/a"})]),
        (('<think>\nx\n</think>\n\nok\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
         '<tool_call>\n{"name": "b", "arguments": {"k": 1}}\n</tool_call>'), [("a", {}), ("b", {"k": 1})]),
        ("no call here", None),
        ('<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a"\n</tool_call>', None),  # truncated JSON
        ('<tool_call>\n{"name": "Read", "arguments": "{}"}\n</tool_call>', None),  # arguments must be an object
        ('<tool_call>\n{"name": "Read", "arguments": {}}\n</tool_call><tool_call>\n{"name"', None),  # unclosed block
    ],
)  # fmt: skip
def test_parse_tool_calls(text, expected):
    calls = parse_tool_calls(text)
    assert (None if calls is None else [(c["name"], c["arguments"]) for c in calls]) == expected


def test_assistant_mask_covers_exactly_the_assistant_turns(tiny_model_dir):
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Read /a"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "Read", "arguments": {"file_path": "/a"}}}]},
        {"role": "tool", "content": "data"},
        {"role": "assistant", "content": "Done."},
    ]  # fmt: skip
    ids = tok.encode(render_chat(messages)).ids
    mask = assistant_mask(ids, tok)
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    # Like Qwen3: only the final turn of the current query gets the (empty) think block.
    assert trained == (
        '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a"}}\n</tool_call><|im_end|>'
        "<think>\n\n</think>\n\nDone.<|im_end|>"
    )


def test_training_examples_label_only_assistant_tokens(tiny_model_dir):
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    examples = training_examples(tok, seed=3, count=20, max_len=640)
    assert examples and all(len(ids) <= 640 and len(ids) == len(labels) for ids, labels in examples)
    for ids, labels in examples:
        assert 0 < sum(label != IGNORE for label in labels) < len(ids)
        assert all(label in (IGNORE, t) for t, label in zip(ids, labels, strict=True))


def test_eval_prompts_end_with_generation_prompt():
    prompts = eval_prompts(seed=5, count=4)
    assert len(prompts) == 4
    for text, names in prompts:
        assert text.endswith("<|im_start|>assistant\n") and "<tools>" in text and names


@pytest.mark.slow
def test_short_warm_start_lowers_the_loss(tiny_model_dir, tmp_path):
    """A real (12 s) fine-tuning run: weights change, loss falls, and the report has before/after scores."""
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    (tmp_path / "tokenizer.json").write_bytes((tiny_model_dir / "tokenizer.json").read_bytes())
    model = init_model(tiny_config(tok.get_vocab_size(), eos_id=8185, pad_id=8183), seed=0)
    before = model.model.layers[0].mlp.up_proj.weight.clone()
    report = warm_start(model, tmp_path, seed=0, minutes=0.2, eval_count=4)
    assert report["steps"] >= 2
    assert report["loss_last20_mean"] < report["loss_first"]
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)
    for phase in ("before", "after"):
        for mode in ("greedy", "sampled_t0.7"):
            score = report[phase][mode]
            assert score["prompts"] == 4 and 0.0 <= score["valid_name"] <= score["well_formed"] <= 1.0
