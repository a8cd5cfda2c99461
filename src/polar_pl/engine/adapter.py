"""A LoRA adapter (PEFT format) applied to the embedded engine's weights by merging.

Each adapter push writes W = W0 + scaling * B @ A into every linear layer the adapter targets,
from a copy of those layers' weights W0 taken at the first adapter push (the base). Every push
starts from the base, so nothing drifts over a run (unmerging the previous adapter by subtraction
would add its rounding at every push), and decoding costs what the base model costs.

Why merge rather than keep PEFT's LoRA layers in the engine (bench/lora_apply.py, SmolLM2-135M,
rank 16, every linear layer, float32, one CPU thread): applying an adapter took 0.27 s merged vs
0.01 s into LoRA layers, but a decode step of 8 sequences took 42 ms merged vs 61 ms with the
layers (+45 %, every step of every generation). A run generates for many seconds between two
pushes, so merging wins; the price is the copy of the targeted weights (the size of the base's
linear layers: 0.42 GB for SmolLM2 in float32).

A full weight push replaces the base: the backend drops its `AdapterMerge`, and the next adapter
push copies the new weights as its base.

An adapter is checked whole before the first write (`check_adapter`; the vLLM handle runs the same
check before it sends one): a refused adapter leaves the weights as they were.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from polar_pl.engine.weights import TensorSpec, refuse, tensor_problem

# PEFT's names: base_model.model.<module path>.lora_A.weight (vLLM and PeftModel.from_pretrained read these)
PREFIX = "base_model.model."
PARTS = (".lora_A.weight", ".lora_B.weight")
# adapter_config.json settings this merge does not implement, with the value it supports
UNSUPPORTED: dict[str, Any] = {"use_dora": False, "fan_in_fan_out": False, "lora_bias": False, "modules_to_save": None,
               "rank_pattern": {}, "alpha_pattern": {}, "layer_replication": None}  # fmt: skip


def scaling(config: Mapping[str, Any]) -> float:
    """PEFT's scaling of B @ A: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora."""
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def lora_pairs(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{HF weight name: (A (r, in), B (out, r))} of every module the adapter changes. ValueError for
    a tensor that is not lora_A / B under PEFT's names, or a module with only one of the two."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        part = next((p for p in PARTS if name.endswith(p)), None)
        if part is None or not name.startswith(PREFIX):
            raise ValueError(f"adapter tensor {name!r}: expected {PREFIX}<module>{PARTS[0]} or {PARTS[1]}")
        module = name[len(PREFIX) : -len(part)]
        parts.setdefault(module, {})[part] = t
    plan = {}
    for module, ab in parts.items():
        if len(ab) != 2:
            raise ValueError(f"adapter module {module}: needs both lora_A and lora_B")
        plan[f"{module}.weight"] = (ab[PARTS[0]], ab[PARTS[1]])
    return plan


def check_merge_config(config: Mapping[str, Any]) -> None:
    """ValueError for an adapter_config.json this merge cannot apply (a setting of UNSUPPORTED)."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"adapter_config.json: peft_type={config.get('peft_type')!r}; only LORA is served")
    for key, supported in UNSUPPORTED.items():
        if config.get(key, supported) not in (supported, None, {}, False):
            raise ValueError(
                f"adapter_config.json: {key}={config[key]!r} is not supported by the embedded engine"
            )


def merge_plan(
    tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`lora_pairs` of an adapter whose config this merge can apply (`check_merge_config`)."""
    check_merge_config(config)
    return lora_pairs(tensors)


def check_adapter(
    tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], specs: Mapping[str, TensorSpec] | None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`lora_pairs`, checked whole before anything is written or sent (either engine): the config's
    r and lora_alpha are numbers, every targeted weight is in `specs` (None: not known here) and B @ A
    has its shape, every A / B is floating point and finite. ValueError naming what is wrong."""
    try:
        if int(config["r"]) <= 0 or not math.isfinite(scaling(config)):
            raise ValueError
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError("adapter_config.json: r (> 0) and lora_alpha must be numbers") from exc
    plan = lora_pairs(tensors)
    problems = []
    for name, (a, b) in plan.items():
        module = f"{PREFIX}{name.removesuffix('.weight')}"
        spec = specs.get(name) if specs is not None else None
        if specs is not None and spec is None:
            problems.append(f"adapter targets {module}, which the model does not have")
        elif (
            a.dim() != 2
            or b.dim() != 2
            or b.shape[1] != a.shape[0]
            or (spec is not None and (b.shape[0], a.shape[1]) != spec.shape)
        ):
            fits = spec.shape if spec is not None else "(any)"
            problems.append(
                f"{module}: lora_B {tuple(b.shape)} @ lora_A {tuple(a.shape)} does not fit the weight {fits}"
            )
        else:
            problems += [
                p
                for part, t in zip(PARTS, (a, b), strict=True)
                if (p := tensor_problem(module + part, t, None))
            ]
    refuse(problems)
    return plan


class AdapterMerge:
    """Merges adapters into `model`'s weights in place (see module docstring). Runs where the
    model is not being used (the engine's scheduler thread, between decode steps)."""

    def __init__(self, model: nn.Module) -> None:
        self.params = dict(model.named_parameters())
        self.specs = {
            k: TensorSpec(tuple(p.shape), p.dtype.is_floating_point) for k, p in self.params.items()
        }
        self.base: dict[str, torch.Tensor] = {}  # weight name -> W0, for every weight ever merged into

    @torch.no_grad()
    def apply(self, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
        check_merge_config(config)
        plan = check_adapter(tensors, config, self.specs)  # every check before the first write
        s = scaling(config)
        for name in self.base.keys() - plan.keys():  # targeted by an earlier adapter only: back to base
            self.params[name].copy_(self.base[name])
        for name, (a, b) in plan.items():
            w = self.params[name]
            base = self.base.setdefault(name, w.detach().clone())
            a, b = (x.to(device=w.device, dtype=torch.float32) for x in (a, b))
            if w.dtype == torch.float32:
                torch.addmm(base, b, a, alpha=s, out=w.data)
            else:  # half-precision weights: the product in float32, one rounding at the end
                w.copy_(torch.addmm(base.float(), b, a, alpha=s))
