"""Weights on disk: the safetensors directory that the weight sync writes and both engines reload
(the embedded engine from a state dict in subprocess mode or from disk, vLLM always from disk).
Tensors keep their Hugging Face names, so any engine that loads a HF checkpoint reads them.

A LoRA adapter on disk is PEFT's folder: `adapter_model.safetensors` (the A / B tensors under
PEFT's names) and `adapter_config.json`, what `PeftModel.from_pretrained` and vLLM's LoRA loading
read."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def save_state_dict(state_dict: Mapping[str, torch.Tensor], out_dir: Path) -> Path:
    """Write HF-named tensors as one safetensors file (tied tensors are cloned: safetensors refuses
    shared storage)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    path = out_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's *.safetensors files; FileNotFoundError when it has none."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def save_adapter(tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], out_dir: Path) -> Path:
    """A PEFT adapter folder (the two files) at `out_dir`; returns it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    flat = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(flat, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(dict(config), indent=2, sort_keys=True))
    return out_dir


def load_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, config) of a PEFT adapter folder; FileNotFoundError naming the missing file."""
    path = Path(path)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        if not (path / name).is_file():
            raise FileNotFoundError(f"no {name} in {path} (a PEFT adapter folder has {ADAPTER_WEIGHTS} "
                                    f"and {ADAPTER_CONFIG})")  # fmt: skip
    return load_file(str(path / ADAPTER_WEIGHTS)), json.loads((path / ADAPTER_CONFIG).read_text())
