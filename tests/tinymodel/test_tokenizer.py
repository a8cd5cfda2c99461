"""The saved tokenizer gives identical ids through AutoTokenizer (Qwen2Tokenizer) and raw `tokenizers`.

transformers 5 rebuilds Qwen tokenizers around their vocabulary with its own normalizer and split
regex; if the trained pipeline differed, the gateway (transformers) and vLLM would disagree on ids.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from polar_pl.tinymodel.tokenizer import CONTROL_TOKENS, SPECIAL_TOKENS

TEXTS = [
    "Hello world",
    "  leading spaces\n\n\n   trailing   ",
    "café Café ﬁ e\u0301 naïve Å",  # decomposed é must be NFC-composed by both
    "日本語のテキスト 中文 한국어 😀👍🏽 Ελληνικά русский עברית",
    "def f(x):\n\treturn x**2  # comment\r\n\r\n    pass\n",
    "I'm   we'll THEY'RE 12345 3.14159 0x1F",
    "\u00a0\u2003tabs\t\t\tand\u3000ideographic\u200b",
    '{"name": "Bash", "arguments": {"command": "ls -la /tmp"}}',
    "<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{}\n</tool_call><think>x</think><tool_response>r</tool_response>",
    "<|endoftext|><|im_end|><|im_start|>",
    "",
]


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def raw(tiny_model_dir):
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def test_loads_as_qwen2_tokenizer_with_qwen_pipeline(hf):
    assert type(hf).__name__ == "Qwen2Tokenizer"
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>" and hf.bos_token is None
    assert len(hf) == 8192


@pytest.mark.parametrize("text", TEXTS)
def test_autotokenizer_matches_raw(hf, raw, text):
    expected = raw.encode(text, add_special_tokens=False).ids
    assert hf.encode(text, add_special_tokens=False) == expected
    assert hf(text)["input_ids"] == expected  # no bos/eos added by default
    assert hf.decode(expected) == unicodedata.normalize("NFC", text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_autotokenizer_matches_raw_on_random_text(hf, raw, text):
    assert hf.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "a", "Z", "1", "'s", "é", "_", "::", "\u3000"]))
)
def test_whitespace_and_contraction_runs(hf, raw, pieces):
    text = "".join(pieces)
    assert hf.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("token", SPECIAL_TOKENS + CONTROL_TOKENS)
def test_control_tokens_are_single_ids(hf, raw, token):
    (token_id,) = hf.encode(token, add_special_tokens=False)
    assert token_id == raw.token_to_id(token) >= 8192 - len(SPECIAL_TOKENS + CONTROL_TOKENS)
    assert hf.convert_ids_to_tokens(token_id) == token


def test_only_chatml_tokens_are_special(hf):
    """Like Qwen3: tool/think tags survive skip_special_tokens, so tool parsers still see them."""
    ids = hf.encode(
        "<|im_start|>a<tool_call>b</tool_call><think>c</think><|im_end|>", add_special_tokens=False
    )
    assert hf.decode(ids, skip_special_tokens=True) == "a<tool_call>b</tool_call><think>c</think>"


def test_compresses_code_and_chat(hf):
    """The vocabulary is trained on code and chat text: a harness-like prompt is well under 1 token/3 chars."""
    text = (
        "You are an interactive CLI tool that helps users with software engineering tasks.\n"
        "def parse_config(path: str) -> dict:\n    with open(path) as f:\n        return json.load(f)\n"
    )
    assert len(hf.encode(text)) < len(text) / 3
