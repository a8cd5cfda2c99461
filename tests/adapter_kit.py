"""A random LoRA adapter pushed into an embedded engine (the adapter-name tests of engine/ and gateway/)."""

from __future__ import annotations

import torch

from polar_pl.engine.embedded import EmbeddedEngine


def push_adapter(engine: EmbeddedEngine, seed: int, target: str = "q_proj") -> int:
    """A rank-4 adapter on every `target` projection, drawn from `seed`; the engine's new version."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in engine.backend.model.named_parameters():
        if name.endswith(f"{target}.weight"):
            module = f"base_model.model.{name.removesuffix('.weight')}"
            tensors[f"{module}.lora_A.weight"] = 0.1 * torch.randn(4, p.shape[1], generator=g)
            tensors[f"{module}.lora_B.weight"] = 0.1 * torch.randn(p.shape[0], 4, generator=g)
    return engine.update_adapter(tensors, {"peft_type": "LORA", "r": 4, "lora_alpha": 8})
