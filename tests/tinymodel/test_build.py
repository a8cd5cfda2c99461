"""Builds are deterministic from the seed, atomic, and the CLI reports bad input without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from polar_pl.tinymodel.build import BUILD_RECORD, build_tiny_model
from polar_pl.tinymodel.model import init_model, tiny_config

ARTIFACTS = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


def test_same_seed_gives_identical_files(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=0)
    b = build_tiny_model(tmp_path / "b", seed=0)
    for name in ARTIFACTS:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    record = json.loads((a / BUILD_RECORD).read_text())
    assert record["seed"] == 0 and record["vocab"] == "bpe" and record["vocab_size"] == 8192
    # Rebuilding into an existing directory replaces it, leaving no temporary siblings behind.
    build_tiny_model(a, seed=0)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a", "b"]
    assert not [
        p
        for p in tmp_path.iterdir()
        if (p.name.startswith(".a.") and not p.name.endswith(".lock")) or ".old-" in p.name
    ]


def test_different_seed_gives_different_weights():
    config = tiny_config(8192, eos_id=8185, pad_id=8183)
    w0 = init_model(config, 0).state_dict()
    w0_again = init_model(config, 0).state_dict()
    w1 = init_model(config, 1).state_dict()
    assert all(torch.equal(w0[k], w0_again[k]) for k in w0)
    assert not torch.equal(w0["model.embed_tokens.weight"], w1["model.embed_tokens.weight"])


def test_bad_vocab_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="vocab must be one of"):
        build_tiny_model(tmp_path / "x", vocab="llama")


def test_cli_rejects_bad_arguments_cleanly(tmp_path):
    cmd = [sys.executable, "-m", "polar_pl.cli", "tiny-model", "--out", str(tmp_path / "m")]
    proc = subprocess.run([*cmd, "--vocab", "llama"], check=False, capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr and "Traceback" not in proc.stderr
