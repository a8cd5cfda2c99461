"""LoRA for the trainer (`module.lora`): PEFT's LoRA layers on a frozen base, and the adapter as
PEFT writes it (the tensors and `adapter_config.json`) for the push and the export.

`module.lora.rank: null` is full fine-tuning. With a rank, `attach` puts PEFT's LoRA layers into
the HF model in place: the module keeps training that same HF model (its forward, the LM head the
logprob code reads, checkpointing) with only the adapter's A / B matrices trainable, and holds the
`PeftModel` beside it for what only PEFT does: `disable_adapter()` (the KL reference is the base
with the adapter off, no second copy) and the adapter's state dict in PEFT's names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

KEYS = ("rank", "alpha", "dropout", "target_modules", "lr", "export_merged")
DEFAULTS: dict[str, Any] = {"alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """rank: r of every adapter; alpha: PEFT's lora_alpha (the update is scaled by alpha / rank);
    dropout: on the adapter's input while training; target_modules: "all-linear" (every linear
    layer but the LM head) or a list of module names (q_proj, v_proj, ...); lr: the adapter's
    learning rate (None: module.lr); export_merged: also write the merged model at the end."""

    rank: int
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"
    lr: float | None = None
    export_merged: bool = False

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | LoraSpec | None) -> LoraSpec | None:
        """None (full fine-tuning) for no config or `rank: null`; ValueError naming the
        module.lora.* key of a bad value."""
        if cfg is None or isinstance(cfg, LoraSpec):
            return cfg
        if not isinstance(cfg, Mapping):
            raise ValueError(f"module.lora={cfg!r}: a mapping with keys {', '.join(KEYS)}, or null")
        cfg = dict(cfg)
        if unknown := sorted(set(cfg) - set(KEYS)):
            raise ValueError(f"module.lora.{unknown[0]}: unknown key; allowed: {', '.join(KEYS)}")
        if cfg.get("rank") is None:
            return None
        spec = {k: v for k, v in cfg.items() if v is not None}
        rank = spec["rank"]
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"module.lora.rank={rank!r}: a positive integer (null: full fine-tuning)")
        alpha = spec.get("alpha", DEFAULTS["alpha"])
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
            raise ValueError(f"module.lora.alpha={alpha!r}: a positive number")
        dropout = spec.get("dropout", DEFAULTS["dropout"])
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(f"module.lora.dropout={dropout!r}: a number in [0, 1)")
        spec["target_modules"] = _targets(spec.get("target_modules", DEFAULTS["target_modules"]))
        lr = spec.get("lr")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, int | float) or lr <= 0):
            raise ValueError(f"module.lora.lr={lr!r}: a positive number, or null for module.lr")
        if not isinstance(spec.get("export_merged", False), bool):
            raise ValueError(f"module.lora.export_merged={spec['export_merged']!r}: true or false")
        return cls(**{**spec, "alpha": float(alpha), "dropout": float(dropout)})

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what a checkpoint keeps, and what from_config reads back)."""
        d = asdict(self)
        if isinstance(self.target_modules, tuple):
            d["target_modules"] = list(self.target_modules)
        return d

    def peft_config(self) -> LoraConfig:
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int, takes a float
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


def _targets(value: Any) -> str | tuple[str, ...]:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, Sequence) and value and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise ValueError(
        f"module.lora.target_modules={value!r}: 'all-linear' or a list of module names (q_proj, v_proj, ...)"
    )


def attach(model: nn.Module, spec: LoraSpec) -> PeftModel:
    """PEFT's LoRA layers into `model` (in place); returns the `PeftModel` around it. The base
    weights are frozen, the adapter's A / B are the only trainable parameters."""
    from peft import get_peft_model

    try:
        peft_model = cast("PeftModel", get_peft_model(model, spec.peft_config()))  # mixed=False: a PeftModel
    except ValueError as e:  # PEFT's own message names the modules it could not find
        raise ValueError(f"module.lora.target_modules={spec.target_modules!r}: {e}") from e
    return peft_model


def adapter_state(
    peft_model: PeftModel, dtype: torch.dtype | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, config) of the adapter in PEFT's format: the A / B tensors under the names
    `PeftModel.from_pretrained` and vLLM read (`base_model.model.<module>.lora_A.weight`),
    whole (a sharded model's gathered: a collective every rank joins), detached (cast to `dtype`
    if given), and the content of `adapter_config.json`."""
    from peft.utils import get_peft_model_state_dict

    from polar_pl.module.gather import full_tensors

    tensors = dict(full_tensors(get_peft_model_state_dict(peft_model, save_embedding_layers=False), dtype))
    config = peft_model.peft_config["default"].to_dict()
    # as PeftConfig.save_pretrained writes them: sets (the resolved target modules) become lists
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    for k, v in config.items():
        if hasattr(v, "value"):  # enums (task_type, peft_type)
            config[k] = v.value
    return tensors, config
