"""module/gather.py on one process: tensors written as they come, in transformers' sharded layout
when they outgrow one file (what `from_pretrained`, vLLM and the engines read), a tied LM head once
in an export, and a failed write that still runs every gather (the other ranks are in them)."""

from __future__ import annotations

import json

import pytest
import torch
from small_model import small_model

from polar_pl.engine.weights import load_state_dict
from polar_pl.module.gather import INDEX, full_tensors, write_safetensors


def test_a_model_larger_than_a_file_is_written_in_parts_with_an_index(tmp_path):
    model = small_model()
    state = model.state_dict()
    size = sum(t.numel() * t.element_size() for t in state.values())
    written = write_safetensors(full_tensors(model), tmp_path, shard_bytes=size // 3)
    assert written == size
    index = json.loads((tmp_path / INDEX).read_text())
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) >= 3 and set(index["weight_map"].values()) == set(files)
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    loaded = load_state_dict(tmp_path)  # every part, as the engines read a pushed folder
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)

    from transformers import AutoModelForCausalLM

    model.config.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path)).state_dict()
    assert all(torch.equal(again[k], state[k]) for k in state)


def test_one_file_is_model_safetensors_and_a_tied_head_is_exported_once(tmp_path):
    model = small_model()  # tie_word_embeddings
    names = [n for n, _ in full_tensors(model, dedupe=True)]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert "lm_head.weight" in dict(full_tensors(model))  # a push keeps every name the engine has
    write_safetensors(full_tensors(model), tmp_path)  # tied storage in one file: cloned
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_a_failed_write_still_runs_every_gather(tmp_path):
    """A write that failed half-way used to leave the remaining gathers unrun: under FSDP the
    other ranks would wait in them for ever. The writer drains the iterator, then raises."""
    reached = []

    def tensors():
        for i in range(4):
            reached.append(i)
            yield f"t{i}", torch.ones(4)

    (tmp_path / "out").write_text("a file where the folder should be")
    with pytest.raises(OSError):
        write_safetensors(tensors(), tmp_path / "out")
    assert reached == [0, 1, 2, 3]
