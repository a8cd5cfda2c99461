"""Sharded training (`trainer.strategy=fsdp`): Lightning's `ModelParallelStrategy` with PyTorch's
FSDP2 `fully_shard`, over one data-parallel mesh dimension (every rank holds a shard of every
parameter, its gradient and its AdamW state; no tensor parallelism).

`GRPOModule.configure_model` asks the strategy to `shard` the policy (and the frozen KL reference,
when there is one): each decoder layer is its own unit (gathered for its forward, freed after it,
gathered again for its backward and recomputation; the module's activation checkpointing stays per
decoder layer), and the root unit holds what is left (embeddings, final norm, LM head). The
trainer's logprob code runs the base model and then the LM head in chunks rather than the model's
own forward, so the root's gather is bound to `CALL`, a method that runs a function inside the
root's forward (`run_sharded`).

Mixed precision is the trainer's (`trainer.precision`: bf16-mixed autocasts over fp32 master
weights, as on one device). `param_dtype: bfloat16` also gathers the layers in bf16 (half the
traffic), at the cost of a bf16 LM head (a larger trainer / engine logprob gap, docs/gpu.md).
Checkpoints are sharded folders (torch.distributed.checkpoint, one file per rank) that resume
with `ckpt_path=<folder>`; `polar-pl eval eval.ckpt_path=<folder>` and the run's export read them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

CALL = "polar_sharded_call"


class FSDPStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy with every rank in one data-parallel (FSDP) dimension.

    param_dtype: the dtype layers are gathered and computed in (None: their own, fp32 master
    weights; "bfloat16": halves the gathers, the LM head too runs in bf16).
    reshard_after_forward: free each layer's gathered weights after its forward (False keeps
    them until its backward: less traffic, more memory).
    save_distributed_checkpoint: sharded checkpoint folders (False: one file gathered on rank 0).
    """

    def __init__(
        self,
        param_dtype: str | None = None,
        reshard_after_forward: bool = True,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            **kwargs,
        )
        dtype = getattr(torch, param_dtype, None) if param_dtype is not None else None
        if param_dtype is not None and not isinstance(dtype, torch.dtype):
            raise ValueError(
                f"trainer.strategy.param_dtype={param_dtype!r}: a torch dtype (bfloat16) or null"
            )
        self.param_dtype: torch.dtype | None = dtype
        self.reshard_after_forward = reshard_after_forward

    def setup_environment(self) -> None:
        # every process is one FSDP shard: data parallel over the world, tensor parallel 1
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def shard(self, model: nn.Module) -> None:
        """`fully_shard` each decoder layer of the HF model `model`, then the model itself, and
        bind the root's gather to `CALL` (see `run_sharded`)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        mesh = self.device_mesh["data_parallel"]
        # inputs are token ids and sampling settings: never cast them
        mp = MixedPrecisionPolicy(param_dtype=self.param_dtype, cast_forward_inputs=False)
        layers = decoder_layers(model)
        if not layers:
            raise ValueError(
                f"trainer.strategy=fsdp: {type(model).__name__} names no decoder layer class "
                "(transformers' `_no_split_modules`), so there is nothing to shard layer by layer"
            )
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=self.reshard_after_forward)
        setattr(model, CALL, _call)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        register_fsdp_forward_method(model, CALL)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a HF model: the modules of the classes it will not split across
    devices (transformers' `_no_split_modules`, what Accelerate's FSDP wrapping reads too)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def run_sharded(model: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) inside the forward of `model`'s root unit when it is sharded (its
    embeddings and LM head gathered for it and its backward), else a plain call."""
    call = getattr(model, CALL, None)
    return call(fn, *args, **kwargs) if call is not None else fn(*args, **kwargs)


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of `model` is a DTensor (FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def to_float(t: torch.Tensor) -> float:
    """A scalar tensor's value; a DTensor's (e.g. the gradient norm of sharded gradients) reduced
    first (a collective every rank joins)."""
    full = getattr(t, "full_tensor", None)
    return float(full() if full is not None else t)


def trainer_strategy(strategy: Any) -> dict[str, Any]:
    """Trainer keywords for `trainer.strategy`: the name "fsdp" (what Lightning users type) is this
    module's `FSDPStrategy` (Lightning's own "fsdp" is FSDP1 without a per-layer policy); any
    other value, a name or an instantiated `_target_` config, is Lightning's to read."""
    return {"strategy": FSDPStrategy()} if strategy == "fsdp" else {}
