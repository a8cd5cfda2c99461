"""How often the model emits well-formed hermes tool calls when offered tools.

A completion is well formed when it holds at least one `<tool_call>...</tool_call>` block and every
block is a JSON object with a string "name" and an object "arguments" (what vLLM's hermes parser
and the embedded engine accept). "Valid name" additionally requires the name to be an offered tool.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedModel

from polar_pl.tinymodel.conversations import tool_conversation
from polar_pl.tinymodel.tokenizer import ENDOFTEXT, IM_END, render_chat

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCallScore:
    """Fractions over `prompts` completions."""

    prompts: int
    well_formed: float
    valid_name: float

    def as_dict(self) -> dict[str, float | int]:
        return {"prompts": self.prompts, "well_formed": self.well_formed, "valid_name": self.valid_name}


def parse_tool_calls(text: str) -> list[dict[str, Any]] | None:
    """The calls in `text`, or None if there are none or any block is malformed."""
    blocks = TOOL_CALL_RE.findall(text)
    if not blocks or text.count("<tool_call>") != len(blocks):
        return None
    calls = []
    for block in blocks:
        try:
            call = json.loads(block.strip())
        except json.JSONDecodeError:
            return None
        if not (
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("arguments"), dict)
        ):
            return None
        calls.append(call)
    return calls


def eval_prompts(seed: int, count: int) -> list[tuple[str, set[str]]]:
    """(rendered prompt up to the first assistant turn, offered tool names), from held-out conversations."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        conv = tool_conversation(rng, max_tools=3)  # the warm-start training distribution
        first_assistant = next(i for i, m in enumerate(conv.messages) if m["role"] == "assistant")
        names = {t["function"]["name"] for t in conv.tools or []}
        text = render_chat(conv.messages[:first_assistant], conv.tools, add_generation_prompt=True)
        prompts.append((text, names))
    return prompts


@torch.inference_mode()
def score_tool_calls(
    model: PreTrainedModel,
    tok: Tokenizer,
    prompts: list[tuple[str, set[str]]],
    max_new_tokens: int = 80,
    temperature: float = 0.0,
    seed: int = 0,
) -> ToolCallScore:
    """Generate one completion per prompt (greedy when temperature is 0) and score its tool calls."""
    was_training = model.training
    model.eval()
    completions = generate_batch(model, tok, [text for text, _ in prompts], max_new_tokens, temperature, seed)
    well_formed = valid = 0
    for completion, (_, names) in zip(completions, prompts, strict=True):
        calls = parse_tool_calls(completion)
        if calls is not None:
            well_formed += 1
            valid += all(c["name"] in names for c in calls)
    model.train(was_training)
    n = max(len(prompts), 1)
    return ToolCallScore(len(prompts), round(well_formed / n, 3), round(valid / n, 3))


def generate_batch(
    model: PreTrainedModel,
    tok: Tokenizer,
    texts: list[str],
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> list[str]:
    """Completions for `texts` in one left-padded batch, stopping at either ChatML end token."""
    pad_id = tok.token_to_id(ENDOFTEXT)
    assert pad_id is not None  # the tiny tokenizer always has <|endoftext|>
    encoded = [tok.encode(t).ids for t in texts]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), pad_id)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        out = model.generate(  # type: ignore[operator]  # transformers: generate is GenerationMixin's
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            eos_token_id=[tok.token_to_id(IM_END), pad_id],
            pad_token_id=pad_id,
            **sampling,
        )
    finally:
        torch.random.set_rng_state(rng_state)
    return [tok.decode(row[width:].tolist(), skip_special_tokens=False) for row in out]
