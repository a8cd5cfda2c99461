"""The trained model and the frozen reference: loading from a local directory, activation
checkpointing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


class Frozen:
    """Holds the reference model outside the module tree: not trained, not checkpointed (it is the
    initial checkpoint, reloadable from model_dir), moved to the device on first use."""

    def __init__(self, model: nn.Module):
        self.model = model.eval().requires_grad_(False)

    def on(self, device: torch.device) -> nn.Module:
        if next(self.model.parameters()).device != device:
            self.model.to(device)
        return self.model


def load_model(
    model_dir: str | Path, *, dtype: str | None = None, attn_implementation: str | None = None
) -> nn.Module:
    """A HF causal LM from a local directory (nothing is downloaded)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype) if dtype else torch.float32}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if not (Path(model_dir) / "config.json").exists():
        raise FileNotFoundError(f"module.model_dir: no config.json in {model_dir}")
    return AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)


def enable_checkpointing(model: nn.Module) -> None:
    """Activation (gradient) checkpointing of every decoder layer, non-reentrant (works under
    no_grad and with inputs that need no grad). transformers 5 renamed the method."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]  # HF method; torch types it Tensor | Module
