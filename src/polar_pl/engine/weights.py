"""Weights on disk: the safetensors directory that the weight sync writes and both engines reload
(the embedded engine from a state dict in subprocess mode or from disk, vLLM always from disk).
Tensors keep their Hugging Face names, so any engine that loads a HF checkpoint reads them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

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
