"""Weights on disk: the safetensors directory that the weight sync writes and both engines reload
(the embedded engine from a state dict in subprocess mode or from disk, vLLM always from disk).
Tensors keep their Hugging Face names, so any engine that loads a HF checkpoint reads them.

A LoRA adapter on disk is PEFT's folder: `adapter_model.safetensors` (the A / B tensors under
PEFT's names) and `adapter_config.json`, what `PeftModel.from_pretrained` and vLLM's LoRA loading
read.

A push is checked whole before any weight changes (`check_tensors`, `TensorSpec`): every name is
one the model has, every shape matches, every tensor is floating point where the weight is and
holds only finite values. A push that fails the check raises ValueError naming the tensors, and
the engine serves what it served, under the same version."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

# what a push refused whole raises (the engine is unchanged): a failed check, a folder without weights
REFUSED = (ValueError, FileNotFoundError)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What a pushed tensor must be to replace a weight: its shape, and whether it is floating point."""

    shape: tuple[int, ...]
    floating: bool = True


def model_specs(model: nn.Module) -> dict[str, TensorSpec]:
    """The spec of every tensor of `model`'s state dict (tied weights under each of their names)."""
    return {
        k: TensorSpec(tuple(t.shape), t.dtype.is_floating_point)
        for k, t in model.state_dict(keep_vars=True).items()
    }


def checkpoint_specs(model_dir: str | Path) -> dict[str, TensorSpec]:
    """The spec of every tensor of a HF folder's *.safetensors, read from their headers (no data);
    a tied LM head (`tie_word_embeddings`) is named too, as a trainer's state dict names it."""
    specs = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                part = st.get_slice(name)
                specs[name] = TensorSpec(tuple(part.get_shape()), part.get_dtype().startswith(("F", "BF")))
    config = Path(model_dir) / "config.json"
    tied = config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings", False)
    if tied and "model.embed_tokens.weight" in specs:
        specs.setdefault("lm_head.weight", specs["model.embed_tokens.weight"])
    return specs


def tensor_problem(name: str, t: torch.Tensor, spec: TensorSpec | None) -> str | None:
    """Why `t` cannot replace the weight `spec` describes (None: any weight); None when it can."""
    floating = spec.floating if spec is not None else True
    if spec is not None and tuple(t.shape) != spec.shape:
        return f"{name}: shape {tuple(t.shape)} != {spec.shape}"
    if floating and not t.dtype.is_floating_point:
        return f"{name}: dtype {t.dtype} is not floating point"
    if floating and t.numel() and not _finite(t):
        return f"{name}: holds NaN or infinite values"
    return None


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of `t` is finite. A sum is NaN or inf when any value is, and one pass
    of it costs a fiftieth of `isfinite(t).all()` on a CPU (134M float32 values: 39 ms vs 2.1 s,
    one thread); only a sum that overflows (float16's range is small) needs the exact check."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def refuse(problems: list[str]) -> None:
    """ValueError naming the first problems; nothing when there are none."""
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError("; ".join(problems[:5]) + more)


def check_tensors(tensors: Mapping[str, torch.Tensor], specs: Mapping[str, TensorSpec] | None) -> None:
    """ValueError unless every tensor can replace its weight (see module docstring); `specs` None:
    the names and shapes are not known here, the values are still checked."""
    unknown = [k for k in tensors if specs is not None and k not in specs]
    problems = [f"weights not in the model: {unknown[:5]}"] if unknown else []
    for name, t in tensors.items():
        if name not in unknown and (p := tensor_problem(name, t, specs[name] if specs else None)):
            problems.append(p)
    refuse(problems)


def save_state_dict(state_dict: Mapping[str, torch.Tensor], out_dir: Path) -> Path:
    """Write HF-named tensors as one safetensors file (tied tensors are cloned: safetensors refuses
    shared storage)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    path = out_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def check_folder(path: str | Path, specs: Mapping[str, TensorSpec] | None) -> None:
    """`check_tensors` over a folder's *.safetensors, one tensor in memory at a time (a pushed
    checkpoint can be larger than the memory left beside the engine); FileNotFoundError when it
    has none."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    problems = []
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names = list(st.keys())
            if unknown := [k for k in names if specs is not None and k not in specs]:
                problems.append(f"weights not in the model: {unknown[:5]}")
            for name in names:
                if name not in unknown and (
                    p := tensor_problem(name, st.get_tensor(name), specs[name] if specs is not None else None)
                ):
                    problems.append(p)
    refuse(problems)


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
