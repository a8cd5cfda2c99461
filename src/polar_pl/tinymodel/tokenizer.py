"""Byte-level BPE tokenizer for the tiny model, laid out the way transformers loads Qwen tokenizers.

transformers 5 builds `Qwen2Tokenizer` for qwen model types and rebuilds the pipeline around the
vocabulary and merges: NFC normalizer, Qwen's split regex, byte-level pre-tokenizer without its own
regex, byte-level decoder. The tokenizer trained here uses exactly that pipeline, so the raw
`tokenizers.Tokenizer` in tokenizer.json and `AutoTokenizer` give identical ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

QWEN_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Not "special" in Qwen3 either: they survive skip_special_tokens, so tool parsers see them in text.
CONTROL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")


def chat_template() -> str:
    """The ChatML + tools + thinking template shipped with this package."""
    return resources.files("polar_pl.tinymodel").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """Render a conversation with transformers' own jinja environment (its `tojson` and sandbox)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]  # transformers: annotated str, returns a tuple
        conversations=[messages],
        tools=tools,  # type: ignore[arg-type]  # transformers: invariant list[dict | Callable]
        chat_template=chat_template(),
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


def configure_pipeline(tok: Tokenizer) -> Tokenizer:
    """Install Qwen2Tokenizer's normalizer, pre-tokenizer, decoder (and Qwen's post-processor)."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train byte-level BPE so that the vocabulary, control tokens included, has `vocab_size` entries."""
    n_added = len(SPECIAL_TOKENS) + len(CONTROL_TOKENS)
    tok = configure_pipeline(Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False)))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_added,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    add_control_tokens(tok)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"corpus too small for vocab_size={vocab_size}: got {tok.get_vocab_size()} tokens")
    return tok


def add_control_tokens(tok: Tokenizer) -> None:
    """Append the ChatML specials and the tool/think tokens after the BPE vocabulary, as Qwen does."""
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in CONTROL_TOKENS])


def tokenizer_config(tok: Tokenizer, model_max_length: int) -> dict[str, Any]:
    """tokenizer_config.json in Qwen3's layout (eos = <|im_end|>, pad = <|endoftext|>, no bos)."""
    decoder = {
        str(i): {
            "content": a.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": a.special,
        }
        for i, a in sorted(tok.get_added_tokens_decoder().items())
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": chat_template(),
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=False)
    config = tokenizer_config(tok, model_max_length)
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out_dir / "chat_template.jinja").write_text(chat_template(), encoding="utf-8")


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """Ids of the specials and control tokens, each of which must be a single token."""
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + CONTROL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"tokenizer lacks control tokens: {missing}")
    return ids  # type: ignore[return-value]
