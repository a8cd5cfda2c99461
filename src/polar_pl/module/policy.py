"""PolicyModule: the trained policy as a LightningModule, without the GRPO math (grpo.py adds it).

It holds the HF causal LM, optionally under a LoRA adapter (`settings.lora`, module/lora.py: PEFT's
LoRA layers on the frozen base; only the adapter's A / B are trained, in the optimizer and in
checkpoints), and the frozen KL reference when the settings need one (the initial model's copy, or
with LoRA the same model with its adapter off: no copy). It builds AdamW, and runs the passes every
update is made of: no-grad logprob passes over micro-batches, backward passes, optimiser steps.

Several processes (`trainer.devices=N`, Lightning's `ddp`, or `trainer.strategy=fsdp`): each rank
runs forward/backward on its round-robin share of a minibatch's micro-batches (`_share`), adding
empty backward passes so all ranks run as many (each one reduces the gradients). Under `fsdp`
(module/sharding.py) `configure_model` shards the model and the frozen reference layer by layer:
each rank keeps a shard of the weights, gradients and AdamW state, and an empty backward pass is a
forward of a micro-batch with its loss times 0 (every layer's gather and gradient reduction is a
collective).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module.logprobs import Sampling, forward_inputs, scorable, token_logprobs
from polar_pl.module.lora import attach
from polar_pl.module.model import Frozen, enable_checkpointing, load_model
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.sharding import FSDPStrategy, to_float
from polar_pl.module.tree_attention import enable_tree_attention

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
    from peft import PeftModel
    from torch.nn.modules.module import _IncompatibleKeys


class PolicyModule(L.LightningModule):
    """See the module docstring. model_dir: HF model directory (or pass `model`, an nn.Module with
    a HF causal-LM forward); settings: the model's (dtype, attention, checkpointing, lora), the
    optimizer's, and the micro-batch and LM-head chunk sizes."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        settings: GRPOSettings = GRPOSettings(),
        model: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.settings = settings
        if model is None:
            if model_dir is None:
                raise ValueError("GRPOModule needs module.model_dir (or a model)")
            model = load_model(
                model_dir, dtype=settings.dtype, attn_implementation=settings.attn_implementation
            )
        self.model = model.train()  # from_pretrained returns eval mode; the old-logprob pass sets eval itself
        self.model_dir = model_dir
        if settings.gradient_checkpointing:
            enable_checkpointing(self.model)
        enable_tree_attention(self.model)  # exactly sdpa, plus tree batches (collate mode "tree")
        self._peft = _Outside(attach(self.model, settings.lora)) if settings.lora is not None else None
        if settings.lora is not None:
            self._adapter_only_checkpoints()
        # with LoRA the reference is this model with its adapter off (`_reference`): no copy
        needs_copy = settings.needs_ref and settings.lora is None
        self._ref = Frozen(copy.deepcopy(self.model)) if needs_copy else None
        self.sharded = False  # by configure_model under trainer.strategy=fsdp
        self.optimizer_steps = 0  # over the whole run (GRPOModule checkpoints it)

    def configure_model(self) -> None:
        """Under `trainer.strategy=fsdp`: the policy and the frozen reference sharded layer by
        layer over the ranks (module/sharding.py), before the optimizer is built on the shards."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if not isinstance(strategy, FSDPStrategy) or self.sharded:
            return
        strategy.shard(self.model)
        if self._ref is not None:
            strategy.shard(self._ref.model)
        self.sharded = True

    def configure_optimizers(self) -> torch.optim.Optimizer | OptimizerLRSchedulerConfig:
        """The AdamW optimizer; with an lr_scheduler, Lightning's dict with it stepped per step."""
        s = self.settings
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            params, lr=s.optimizer_lr, betas=s.betas, eps=s.adam_eps, weight_decay=s.weight_decay
        )
        if s.lr_scheduler is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": s.lr_scheduler(opt), "interval": "step"}}

    # ---- LoRA and the reference ----------------------------------------------------------
    @property
    def peft_model(self) -> PeftModel | None:
        """With LoRA: the PEFT model around `model` (its adapter's state and config); else None."""
        return self._peft.model if self._peft is not None else None

    def _adapter_only_checkpoints(self) -> None:
        """Checkpoints keep the adapter alone: the frozen base is `model_dir`, rebuilt on resume."""
        trainable = {f"model.{n}" for n, p in self.model.named_parameters() if p.requires_grad}

        def drop_base(
            module: nn.Module, state: dict[str, Any], prefix: str, metadata: dict[str, Any]
        ) -> None:
            for key in [k for k in state if k.startswith(prefix) and k[len(prefix) :] not in trainable]:
                del state[key]

        def base_not_missing(module: nn.Module, incompatible: _IncompatibleKeys) -> None:
            incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k in trainable]

        self.register_state_dict_post_hook(drop_base)
        self.register_load_state_dict_post_hook(base_not_missing)

    @contextlib.contextmanager
    def _reference(self, device: torch.device) -> Iterator[nn.Module]:
        """The frozen reference model: the initial model's copy, or with LoRA this model with its
        adapter off (PEFT's `disable_adapter`), in eval mode."""
        if self._peft is None:
            assert self._ref is not None  # needs_ref without LoRA: the frozen copy
            yield self._ref.on(device)
            return
        was_training = self.model.training
        self.model.eval()
        try:
            with self._peft.model.disable_adapter():
                yield self.model
        finally:
            self.model.train(was_training)

    # ---- no-grad logprob passes ----------------------------------------------------------
    @torch.no_grad()
    def _ref_logprobs(self, batch: TrainBatch, sampling: Sampling) -> torch.Tensor:
        """The frozen reference's logprobs (N, T) of the sampled tokens."""
        sampled = batch.loss_mask * scorable(batch.position_ids)
        refs = []
        rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
        with self._reference(batch.input_ids.device) as ref_model:
            for idx in self._micro(rows, batch):
                kw: dict[str, Any] = {
                    "sampling": sampling[idx],
                    "chunk_tokens": self.settings.logprob_chunk_tokens,
                    "need": sampled[idx],
                }
                refs.append(token_logprobs(ref_model, **self._inputs(batch, idx), **kw)[0])
        return torch.cat(refs)

    @torch.no_grad()
    def _old_logprobs(
        self, batch: TrainBatch, sampling: Sampling
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """pi_old logprobs and entropies (N, T) of the current model, and the reference's logprobs."""
        was_training = self.model.training
        self.model.eval()
        olds: list[torch.Tensor] = []
        ents: list[torch.Tensor] = []
        refs: list[torch.Tensor] = []
        sampled = batch.loss_mask * scorable(batch.position_ids)
        for idx in self._micro(torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device), batch):
            kw: dict[str, Any] = {
                "sampling": sampling[idx],
                "chunk_tokens": self.settings.logprob_chunk_tokens,
                "need": sampled[idx],
            }
            kw.update(self._inputs(batch, idx))
            lp, ent = token_logprobs(self.model, with_entropy=True, **kw)
            assert ent is not None  # with_entropy
            olds.append(lp)
            ents.append(ent)
            if self.settings.needs_ref:
                with self._reference(batch.input_ids.device) as ref_model:
                    refs.append(token_logprobs(ref_model, **kw)[0])
        self.model.train(was_training)
        return torch.cat(olds), torch.cat(ents), (torch.cat(refs) if refs else None)

    def _micro(self, idx: torch.Tensor, batch: TrainBatch) -> list[torch.Tensor]:
        """`idx` cut into micro-batches of at most micro_batch_size sequences and
        micro_batch_tokens tokens (always at least one sequence)."""
        size = self.settings.micro_batch_size or max(idx.numel(), 1)
        if self.settings.micro_batch_tokens is not None:
            size = min(size, max(1, self.settings.micro_batch_tokens // max(batch.input_ids.shape[1], 1)))
        return list(torch.split(idx, size))

    @staticmethod
    def _inputs(batch: TrainBatch, idx: torch.Tensor) -> dict[str, Any]:
        """token_logprobs' model inputs for sequences `idx` (a tree's mask and parents included)."""
        attn = batch.attention_mask[idx] if batch.attention_mask is not None else None
        inputs = forward_inputs(batch.position_ids[idx], batch.row_index[idx], attn)
        return {"input_ids": batch.input_ids[idx], **inputs}

    # ---- backward passes and steps, over the ranks ---------------------------------------
    def _world(self) -> int:
        return self._trainer.world_size if self._trainer is not None else 1

    def _share(self, micros: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
        """This rank's micro-batches (round-robin), and how many empty backward passes it adds so
        that every rank runs as many (DDP and FSDP reduce gradients in each backward)."""
        world = self._world()
        if world == 1:
            return micros, 0
        mine = micros[self.global_rank :: world]
        return mine, -(-len(micros) // world) - len(mine)

    def _empty_backward(
        self, batch: TrainBatch, sampling: Sampling, idx: torch.Tensor, need: torch.Tensor
    ) -> None:
        """A backward pass that changes no gradient but reduces them as a real one does. DDP: 0
        with a path to every parameter. FSDP: a forward of micro-batch `idx` times 0 (each layer's
        gather and reduction is a collective the other ranks are in)."""
        if not self.sharded:
            self._backward(self._touch_all())
            return
        logp, _ = token_logprobs(
            self.model,
            **self._inputs(batch, idx),
            sampling=sampling[idx],
            chunk_tokens=self.settings.logprob_chunk_tokens,
            need=need[idx],
        )
        self._backward(logp.sum() * 0.0)

    def _touch_all(self) -> torch.Tensor:
        """0, with a gradient path to every parameter: a backward that reaches every gradient
        bucket, whichever tokens its micro-batch trains (no unused-parameter search needed)."""
        params = [p.reshape(-1)[:1] for p in self.model.parameters() if p.requires_grad]
        return torch.cat(params).sum() * 0.0

    def _backward(self, loss: torch.Tensor) -> None:
        if self._trainer is not None:
            self.manual_backward(loss)
        else:
            loss.backward()

    def _step(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None = None) -> float:
        """Clip, step, zero the gradients, step the schedule; returns the gradient norm before clipping."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.settings.grad_clip if self.settings.grad_clip is not None else float("inf")
        norm = to_float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        self.optimizer_steps += 1
        return norm


class _Outside:
    """Holds the PeftModel around `PolicyModule.model` outside the module tree: its parameters are
    the model's own, so registering it would list each twice (in checkpoints too)."""

    def __init__(self, model: PeftModel) -> None:
        self.model = model
