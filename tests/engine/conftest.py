"""Engine test fixtures: the tiny model served by the embedded engine over real HTTP, and a copy of
the tiny model trained to answer one request with a tool call (an untrained model never emits one,
so tool-call parsing could not be checked on real generations)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from polar_pl.chat.render import render_chat
from polar_pl.engine.embedded import EmbeddedEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]
TOOL_MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Create hello.py that prints hello."},
]
TOOL_ARGS = {"path": "hello.py", "content": "print('hello')"}
TOOL_REPLY = (
    'I will write it.\n<tool_call>\n{"name": "write_file", "arguments": '
    + json.dumps(TOOL_ARGS)
    + "}\n</tool_call>"
)

# A think block, text with surrounding whitespace, then a tool call: what Qwen3 writes with
# thinking on (the reasoning-parser reference test).
THINK_REPLY = (
    "<think>\nThe user wants a file.\n</think>\n\nok\n" + TOOL_REPLY[TOOL_REPLY.index("<tool_call>") :]
)


def memorize(src: Path, out: Path, messages, tools, reply: str, steps: int = 400) -> Path:
    """Copy the model at src to out and train it until greedy decoding of the rendered request
    reproduces `reply` + <|im_end|> exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(src, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    _, prompt = render_chat(tok, messages, tools)
    target = tok.encode(reply, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[:, : len(prompt)] = -100
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        out_ = model(input_ids=ids, labels=labels)
        # checked before the step, so the weights saved are the weights checked (checking the
        # forward before an Adam step and saving the weights after it let a CI run's saved model
        # write `"_file",` where it had been checked to write `"content":`)
        logits = out_.logits[0, len(prompt) - 1 : -1].detach()
        margin = logits.softmax(-1).max(-1).values.min()
        if bool((logits.argmax(-1) == ids[0, len(prompt) :]).all()) and float(margin) > 0.6:
            print(f"memorized in {step} steps")
            break
        opt.zero_grad()
        out_.loss.backward()
        opt.step()
    else:
        raise RuntimeError("the tiny model did not memorize the tool-call reply")
    model.eval()
    model.save_pretrained(out)
    return out


@dataclass(frozen=True, slots=True)
class ToolCase:
    """The request the tool model was trained on, and what it answers."""

    messages: list = field(default_factory=lambda: TOOL_MESSAGES)
    tools: list = field(default_factory=lambda: TOOLS)
    args: dict = field(default_factory=lambda: TOOL_ARGS)
    reply: str = TOOL_REPLY


@pytest.fixture(scope="session")
def tool_case() -> ToolCase:
    return ToolCase()


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return memorize(
        Path(tiny_model_dir), tmp_path_factory.mktemp("tool-model"), TOOL_MESSAGES, TOOLS, TOOL_REPLY
    )


@pytest.fixture(scope="session")
def think_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    return memorize(
        Path(tiny_model_dir), tmp_path_factory.mktemp("think-model"), TOOL_MESSAGES, TOOLS, THINK_REPLY
    )


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with EmbeddedEngine(
        tiny_model_dir, served_model_name="tiny", max_batch_size=16, max_model_len=4096
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def tool_engine(tool_model_dir):
    with EmbeddedEngine(tool_model_dir, served_model_name="tool") as eng:
        yield eng
