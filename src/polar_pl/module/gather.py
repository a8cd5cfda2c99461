"""Full tensors from a model that may be sharded (FSDP2 DTensors), one at a time, and safetensors
written as they come: what the weight push and the export read, so that neither holds a whole
extra copy of the model beside the trainer's.

Gathering a DTensor (`full_tensor`) is a collective: every rank iterates the same tensors in the
same order (`full_tensors` on every rank; ranks that write nothing drain it with `drain`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

SHARD_BYTES = 1 << 30  # per safetensors file: the most a writer holds beyond the trainer's model
INDEX = "model.safetensors.index.json"


def full(t: torch.Tensor) -> torch.Tensor:
    """`t` whole: a DTensor gathered (a collective), any other tensor as it is; detached."""
    gather = getattr(t, "full_tensor", None)
    return (gather() if gather is not None else t).detach()


def full_tensors(
    tensors: Mapping[str, torch.Tensor] | nn.Module, dtype: torch.dtype | None = None, *, dedupe: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) per entry of a state dict (a module's: HF names), each gathered as it
    is reached and cast to `dtype` if given. dedupe (a module only): a parameter tied under several
    names (a tied LM head) is yielded under its first name only, as transformers saves it."""
    state = tensors.state_dict() if isinstance(tensors, nn.Module) else tensors
    tied = _tied_names(tensors) if dedupe and isinstance(tensors, nn.Module) else set()
    for name, t in state.items():
        if name in tied:
            continue
        whole = full(t)
        yield name, whole if dtype is None else whole.to(dtype)


def _tied_names(model: nn.Module) -> set[str]:
    """The names of parameters that are the same parameter as an earlier name (the same on every
    rank: the module's structure, not its storage, decides)."""
    first: set[int] = set()
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied.add(name)
        first.add(id(p))
    return tied


def drain(tensors: Iterable[object]) -> None:
    """Run an iterator of gathers to its end, keeping nothing (ranks that write nothing)."""
    for _ in tensors:
        pass


def write_safetensors(
    tensors: Iterable[tuple[str, torch.Tensor]], out_dir: Path, shard_bytes: int = SHARD_BYTES
) -> int:
    """Write (name, tensor) pairs into `out_dir` as safetensors files of at most ~`shard_bytes`
    each, as transformers lays out a sharded checkpoint: `model.safetensors` when one file holds
    everything, else `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`.
    A write that fails still drains `tensors` (the other ranks are in the same gathers) before
    raising. Returns the tensor bytes written."""
    it = iter(tensors)
    keys: list[list[str]] = []  # the names in each file
    names: list[Path] = []
    total = 0
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        chunk: dict[str, torch.Tensor] = {}
        size = 0
        for name, t in it:
            t = t.to("cpu").contiguous()
            if any(t.untyped_storage().data_ptr() == u.untyped_storage().data_ptr() for u in chunk.values()):
                t = t.clone()  # safetensors refuses shared storage (a tied LM head)
            chunk[name] = t
            size += t.numel() * t.element_size()
            if size >= shard_bytes:
                names.append(_flush(chunk, out_dir, len(names)))
                keys.append(list(chunk))
                total, chunk, size = total + size, {}, 0
        if chunk or not names:
            names.append(_flush(chunk, out_dir, len(names)))
            keys.append(list(chunk))
            total += size
    except BaseException:
        drain(it)
        raise
    _name_files(out_dir, names, keys, total)
    return total


def _flush(chunk: Mapping[str, torch.Tensor], out_dir: Path, i: int) -> Path:
    path = out_dir / f"model-part{i:05d}.safetensors"
    save_file(dict(chunk), str(path), metadata={"format": "pt"})
    return path


def _name_files(out_dir: Path, paths: list[Path], keys: list[list[str]], total: int) -> None:
    """The written parts under transformers' names (and its index when there are several)."""
    n = len(paths)
    if n == 1:
        paths[0].rename(out_dir / "model.safetensors")
        return
    weight_map = {}
    for i, (path, names) in enumerate(zip(paths, keys, strict=True)):
        final = out_dir / f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        path.rename(final)
        weight_map.update(dict.fromkeys(names, final.name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX).write_text(json.dumps(index, indent=2))
