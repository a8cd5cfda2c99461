"""GRPOModule: one rollout batch in, several optimiser steps, weights pushed to the engine.

Per batch (`update`):
1. bookkeeping (prepare.py): rows -> statistics units (a rollout; its side calls a unit of their
   own), call segments, the sampling settings each token was drawn with, overlong masking;
2. rewards per unit (minus a KL penalty when `kl_reward` is on) -> advantages (config-chosen
   function), broadcast to every row and token; optionally drop groups whose task rewards have
   zero variance (their tokens leave the loss);
3. under no_grad, before any update: the trainer's logprobs of the sampled tokens (pi_old) under
   the distribution the engine sampled from, their entropy, the frozen reference's logprobs when
   KL is on, and the off-policy corrections (`tis`, `off_policy_mask`) against the engine's
   behaviour logprobs mu;
4. `epochs` x `minibatches` optimiser steps over the packed sequences, each minibatch cut into
   micro-batches (by sequences and/or tokens) for memory; a tree (a group's shared prefix and
   its rows' suffixes, collate mode "tree") lies in one sequence, so no cut splits it. Aggregation weights are computed once
   for the whole batch, so a rollout weighs the same wherever its rows land; the policy loss
   (config-chosen), KL, an entropy bonus, gradient clipping, AdamW, an optional LR schedule;
5. after every `push_every`-th optimiser step, `weight_sync.push(model)`.

LoRA (`lora`, module/lora.py): PEFT's LoRA layers on the frozen base; only the adapter's A / B
are trained, in the optimizer and in checkpoints; the KL reference is the same model with the
adapter off (no copy); a push sends the adapter alone (weight_sync.py).

Optimisation is manual (`automatic_optimization = False`): Lightning's global step counts
optimiser steps, so a batch advances it by epochs x minibatches, and a skipped batch by 0.

Several processes (`trainer.devices=N`, Lightning's `ddp`, or `trainer.strategy=fsdp`): every rank
holds the whole batch (the datamodule broadcasts rank 0's), so advantages and aggregation weights
are the one-process ones (global normalisation); each rank runs forward/backward on its
round-robin share of every minibatch's micro-batches, adding empty backward passes so all ranks run
as many (each one reduces the gradients), with the loss scaled by N against the strategy's
averaging: the gradient is the one-process gradient. Rank 0 pushes the weights and every rank
learns the version. Under `fsdp` (module/sharding.py) `configure_model` shards the model (and the
frozen reference) layer by layer: each rank keeps a shard of the weights, gradients and AdamW
state; an empty backward pass is a forward of a micro-batch with its loss times 0 (every layer's
gather and gradient reduction is a collective), and the push gathers one tensor at a time.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module import advantages as adv_fns
from polar_pl.module.logprobs import Sampling, forward_inputs, scorable, token_logprobs
from polar_pl.module.lora import attach
from polar_pl.module.metrics import batch_metrics, harness_metrics, numeric, unit_metrics
from polar_pl.module.model import Frozen, enable_checkpointing, load_model
from polar_pl.module.prepare import Prepared, prepare, unit_sums
from polar_pl.module.rollouts import Rollouts
from polar_pl.module.segments import Segments
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.sharding import FSDPStrategy, to_float
from polar_pl.module.tree_attention import enable_tree_attention
from polar_pl.module.weight_sync import WeightSync
from polar_pl.rollout.runtime import feed_of

if TYPE_CHECKING:
    from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
    from peft import PeftModel
    from torch.nn.modules.module import _IncompatibleKeys

log = logging.getLogger(__name__)


class GRPOModule(L.LightningModule):
    """See the module docstring.

    model_dir: HF model directory (or pass `model`, an nn.Module with a HF causal-LM forward).
    settings: the hyper-parameters (settings.py); conf/module/grpo.yaml builds them with `grpo_module`.
    weight_sync: a WeightSync (bound to the datamodule's `push_target()` in on_fit_start if unbound), or None.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        settings: GRPOSettings = GRPOSettings(),
        model: nn.Module | None = None,
        weight_sync: WeightSync | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.settings = settings
        if settings.lora is not None and not (weight_sync is None or weight_sync.pushes_adapters):
            raise ValueError(
                f"module.weight_sync={type(weight_sync).__name__} cannot push a LoRA adapter (module.lora.rank="
                f"{settings.lora.rank}): use module/weight_sync=embedded, disk or none"
            )
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
        self.weight_sync = weight_sync
        # with LoRA the reference is this model with its adapter off (`_reference`): no copy
        needs_copy = settings.needs_ref and settings.lora is None
        self._ref = Frozen(copy.deepcopy(self.model)) if needs_copy else None
        self.sharded = False  # by configure_model under trainer.strategy=fsdp
        self.optimizer_steps = 0  # over the whole run (checkpointed)
        self.skipped_batches = 0
        self.own_version = 0  # pushes done, when there is no weight sync to ask
        self._logged: set[str] = set()  # every key training_step has logged

    # ---- Lightning hooks ------------------------------------------------------------------
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
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            params,
            lr=self.settings.optimizer_lr,
            betas=self.settings.betas,
            eps=self.settings.adam_eps,
            weight_decay=self.settings.weight_decay,
        )
        if self.settings.lr_scheduler is None:
            return opt
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": self.settings.lr_scheduler(opt), "interval": "step"},
        }

    def bind_engine(self, engine: Any) -> None:
        """Point the weight sync at a push target by hand; on_fit_start binds the rollout runtime's
        `push_target()` when the sync is still unbound, so this is only for custom loops."""
        if self.weight_sync is not None:
            self.weight_sync.bind(engine)

    def on_fit_start(self) -> None:
        # The runtime's push target pauses the gateway around each push and tells it the new
        # policy version; the raw engine would do neither, so there is no fallback to it.
        if self.weight_sync is not None and self.weight_sync.engine is None:
            feed = feed_of(self.trainer)
            if feed is None:
                raise ValueError(
                    "module.weight_sync is unbound and no rollout runtime feeds the trainer: fit with a "
                    "RolloutDataModule, or bind_engine(...) before fit"
                )
            self.weight_sync.bind(feed.runtime.push_target())

    def on_train_start(self) -> None:
        if self.optimizer_steps and self.weight_sync is not None:
            # Resumed: the engine started from the initial checkpoint, so it must receive the
            # trained weights before the first rollout (groups start with the first batch, after
            # this hook). Not in on_fit_start: a sharded strategy restores the weights after it.
            self._push()

    def on_fit_end(self) -> None:
        if self.weight_sync is not None:
            self.weight_sync.close()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo"] = {
            "optimizer_steps": self.optimizer_steps,
            "skipped_batches": self.skipped_batches,
            "own_version": self.own_version,
            "lora": self.settings.lora.to_dict() if self.settings.lora is not None else None,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("grpo", {})
        saved = state.get("lora")
        if (saved is None) != (self.settings.lora is None) or (
            saved and self.settings.lora is not None and saved["rank"] != self.settings.lora.rank
        ):
            had = f"LoRA rank {saved['rank']}" if saved else "full fine-tuning"
            raise ValueError(
                f"ckpt_path: the checkpoint was trained with {had}; module.lora.rank="
                f"{self.settings.lora.rank if self.settings.lora else None} cannot resume it"
            )
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.skipped_batches = int(state.get("skipped_batches", 0))
        self.own_version = int(state.get("own_version", 0))

    def training_step(self, batch: TrainBatch | None, batch_idx: int) -> None:
        metrics = self._rollout_metrics(batch)
        # a LightningOptimizer, at runtime a subclass of the optimizer's own class
        metrics.update(self.update(batch, self.optimizers(), self.lr_schedulers()))  # type: ignore[arg-type]
        metrics.setdefault("train/skipped", 0.0)
        # Lightning logs a key's last value again at every later step that does not log it: a
        # skipped step would repeat the step before's loss and logprob gap, and a skip's
        # train/skipped would stick. A key this step did not measure is logged as NaN (a gap).
        metrics.update({k: float("nan") for k in self._logged - metrics.keys()})
        self._logged |= metrics.keys()
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    # ---- the GRPO step --------------------------------------------------------------------
    def current_version(self) -> int:
        """The engine's policy version now (the staleness reference)."""
        sync = self.weight_sync
        if self._world() > 1 and self.global_rank != 0:
            return self.own_version  # only rank 0 talks to the engine; it broadcasts each version
        if sync is not None and sync.engine is not None:
            return sync.policy_version()
        return self.own_version

    def update(
        self, batch: TrainBatch | None, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None = None
    ) -> dict[str, float]:
        """Run the optimiser steps for one rollout batch; returns train/* metrics. Works without a
        Lightning Trainer (bench/gpu_step.py calls it with a plain optimizer)."""
        t0 = time.perf_counter()
        version_now = self.current_version()  # before this batch's pushes: the staleness reference
        if batch is None or batch.num_rows == 0:
            return self._skip("empty batch")
        batch = batch.to(next(self.model.parameters()).device)
        prep = prepare(
            batch,
            side_rows=self.settings.side_rows,
            overlong=self.settings.overlong,
            temperature=self.settings.temperature,
        )
        units = prep.units
        old = ent = ref = penalty = None
        if self.settings.kl_reward_coef > 0:
            old, ent, ref = self._old_logprobs(batch, prep.sampling)
            assert self.settings.kl_reward is not None  # GRPOSettings: kl_reward_coef > 0 needs kl_reward
            assert ref is not None  # kl_reward_coef > 0: needs_ref
            kl = self.settings.kl_reward(old, ref)
            penalty = self.settings.kl_reward_coef * unit_sums(
                kl, prep.eligible, prep.token_unit, units.reward.numel()
            )
        adv, keep, filtered = self._advantages(units, penalty)
        batch.advantages = torch.where(units.row >= 0, adv[units.row.clamp(min=0)], 0.0).detach()
        mask = prep.eligible * keep[prep.token_unit.clamp(min=0)]
        if mask.sum() == 0:
            return self._skip("no trainable tokens", filtered_groups_frac=filtered)
        tok_adv = adv[prep.token_unit.clamp(min=0)] * mask
        fused = old is None and self.single_step
        if fused:  # pi_old is the model as it is: its logprobs come from the update's own forward
            ref = self._ref_logprobs(batch, prep.sampling) if self.settings.needs_ref else None
            tis_w = keep_w = corr = None
        else:
            if old is None:
                old, ent, ref = self._old_logprobs(batch, prep.sampling)
            tis_w, keep_w, corr = self._corrections(
                old, batch.behavior_logprobs, mask, prep.segments, tok_adv
            )
        t1 = time.perf_counter()
        seen = _Seen.zeros(mask, self.settings.tis, self.settings.off_policy_mask) if fused else None
        stats = self._optimise(batch, prep, optimizer, scheduler, mask, tok_adv, old, ref, corr, seen)
        t2 = time.perf_counter()
        sampled = prep.sampled
        if seen is not None:  # pi_old as the micro-steps saw it, over the rows they trained
            old, ent, tis_w, keep_w = seen.old, seen.ent, seen.tis_w, seen.keep_w
            sampled = sampled * seen.covered
        assert old is not None  # fused: seen.old; else _old_logprobs'
        m = batch_metrics(
            old=old,
            behavior=batch.behavior_logprobs,
            sampled=sampled,
            mask=mask,
            entropy=ent,
            token_versions=batch.policy_version,
            current_version=version_now,
            tis_w=tis_w,
            keep_w=keep_w,
            ref=ref,
        )
        m.update(stats)
        m.update(unit_metrics(units, adv, penalty, prep.truncated_calls))
        m.update(
            {
                "train/tokens_per_s": (batch.total_tokens - batch.padding_tokens)
                * self.settings.epochs
                / max(t2 - t0 - stats["train/push_s"], 1e-9),
                "train/old_logprob_s": t1 - t0,
                "train/update_s": t2 - t1 - stats["train/push_s"],
                "train/filtered_groups_frac": filtered,
                "train/trainable_tokens": float(mask.sum()),
                "train/skipped_batches": float(self.skipped_batches),
                "train/policy_version": float(self.current_version()),
            }
        )
        return m

    @property
    def single_step(self) -> bool:
        """One optimiser step per batch: pi_old is the model before that step, so the logprobs of
        the update's forward (detached) are pi_old's and no separate no-grad pass is needed."""
        return self.settings.single_step

    def _corrections(
        self,
        old: torch.Tensor,
        behavior: torch.Tensor,
        mask: torch.Tensor,
        segments: Segments,
        tok_adv: torch.Tensor,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(tis weights, off-policy keep weights, their product) against the engine's logprobs."""
        tis_w, keep_w = (
            fn(old, behavior, mask, segments, tok_adv) if fn is not None else None
            for fn in (self.settings.tis, self.settings.off_policy_mask)
        )
        weights = [w for w in (tis_w, keep_w) if w is not None]
        return tis_w, keep_w, (functools.reduce(torch.mul, weights) if weights else None)

    def _advantages(
        self, units: Rollouts, penalty: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(advantage per unit (K,), keep per unit (K,) bool, fraction of groups dropped). The
        zero-variance filter looks at the task rewards, before any KL penalty."""
        rewards = units.reward if penalty is None else units.reward - penalty.to(units.reward)
        advantage = self.settings.advantage(rewards, units.group).to(units.reward.device)
        keep = units.present
        filtered = 0.0
        if self.settings.filter_zero_variance:
            signal = adv_fns.nonzero_variance_groups(units.reward, units.group)
            groups = units.group[keep].unique()
            dropped = units.group[keep & ~signal].unique()
            filtered = dropped.numel() / max(groups.numel(), 1)
            keep = keep & signal
        return advantage, keep, filtered

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

    def _optimise(
        self,
        batch: TrainBatch,
        prep: Prepared,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler | None,
        mask: torch.Tensor,
        tok_adv: torch.Tensor,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        corr: torch.Tensor | None,
        seen: _Seen | None = None,
    ) -> dict[str, float]:
        self.model.train()
        n = batch.input_ids.shape[0]
        gen = torch.Generator().manual_seed(self.settings.seed + self.optimizer_steps)
        # Once for the whole batch: a rollout weighs the same whichever minibatches its rows land in.
        weights = self.settings.aggregation(mask, batch.row_index, prep.units.row.clamp(min=0))
        sums = {
            k: torch.zeros((), dtype=torch.float64, device=mask.device)
            for k in ("loss", "kl", "clipped", "tokens")
        }
        norms: list[float] = []
        push_s, push_bytes = 0.0, 0
        world = self._world()
        for _ in range(self.settings.epochs):
            order = (
                torch.randperm(n, generator=gen).to(mask.device)
                if self.settings.minibatches > 1
                else torch.arange(n, device=mask.device)
            )
            mbs = [
                mb
                for mb in torch.tensor_split(order, self.settings.minibatches)
                if mb.numel() and mask[mb].sum() > 0
            ]
            for mb in mbs:
                # nothing trainable in a micro-batch: no forward (on every rank alike)
                micros = [idx for idx in self._micro(mb, batch) if mask[idx].sum() > 0]
                mine, pad = self._share(micros)
                # x len(mbs): each optimiser step carries its share of the batch at full scale.
                for idx in mine:
                    self._micro_step(
                        batch,
                        prep,
                        idx,
                        weights[idx] * len(mbs),
                        mask,
                        tok_adv,
                        old,
                        ref,
                        corr,
                        sums,
                        grad_scale=world,
                        seen=seen,
                    )
                for _ in range(pad):
                    self._empty_backward(batch, prep, micros[0], mask)
                norms.append(self._step(optimizer, scheduler))
                if not self.optimizer_steps % self.settings.push_every:
                    push_s += self._timed_push()
                    push_bytes += self.weight_sync.pushed_bytes if self.weight_sync is not None else 0
        steps = max(len(norms), 1)
        if world > 1:  # every rank saw only its share
            keys = list(sums)
            total = self.trainer.strategy.reduce(torch.stack([sums[k] for k in keys]), reduce_op="sum")
            sums = dict(zip(keys, total, strict=True))
        return {
            "train/loss": float(sums["loss"]) / steps,  # mean over optimiser steps
            "train/clip_frac": float(sums["clipped"] / sums["tokens"].clamp(min=1.0)),
            "train/kl": float(sums["kl"]) / steps,
            "train/grad_norm": sum(norms) / steps,
            "train/optimizer_steps": float(len(norms)),
            "train/push_s": push_s,
            "train/push_mb": push_bytes / 1e6,  # the adapter alone with LoRA
            "train/lr": float(optimizer.param_groups[0]["lr"]),
        }

    def _micro_step(
        self,
        batch: TrainBatch,
        prep: Prepared,
        idx: torch.Tensor,
        w: torch.Tensor,
        mask: torch.Tensor,
        tok_adv: torch.Tensor,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        corr: torch.Tensor | None,
        sums: dict[str, torch.Tensor],
        grad_scale: int = 1,
        seen: _Seen | None = None,
    ) -> None:
        """Forward, loss and backward of one micro-batch (sequences `idx`, token weights `w`);
        grad_scale: the number of ranks whose gradients the strategy averages. With `seen` (a
        single-step batch, no `old` given) pi_old is this forward's logprobs, detached, and the
        off-policy corrections are computed here; `seen` keeps them for the batch metrics."""
        m, segments = mask[idx], prep.segments.select(idx)
        logp, ent = token_logprobs(
            self.model,
            **self._inputs(batch, idx),
            sampling=prep.sampling[idx],
            with_entropy=self.settings.entropy_coef > 0 or seen is not None,
            chunk_tokens=self.settings.logprob_chunk_tokens,
            need=m if seen is None else prep.sampled[idx],
        )
        if seen is None:
            assert old is not None  # not fused: update computed pi_old before the steps
            old_mb, corr_mb = old[idx], (corr[idx] if corr is not None else None)
        else:
            old_mb = logp.detach()
            assert ent is not None  # with_entropy when seen
            tis_mb, keep_mb, corr_mb = self._corrections(
                old_mb, batch.behavior_logprobs[idx], m, segments, tok_adv[idx]
            )
            seen.record(idx, old_mb, ent.detach(), tis_mb, keep_mb)
        per_token, clipped = self.settings.policy_loss(logp, old_mb, tok_adv[idx], m, segments)
        if corr_mb is not None:
            per_token = per_token * corr_mb
        if ref is not None and self.settings.kl_coef > 0:
            assert self.settings.kl is not None  # GRPOSettings: kl_coef > 0 needs kl
            k = self.settings.kl(logp, ref[idx])
            per_token = per_token + self.settings.kl_coef * k
            sums["kl"] += (k.detach() * w).sum()
        if self.settings.entropy_coef > 0:
            assert ent is not None  # with_entropy when entropy_coef > 0
            per_token = per_token - self.settings.entropy_coef * ent
        loss = torch.where(w > 0, per_token * w, 0.0).sum()
        touch = grad_scale > 1 and not self.sharded  # FSDP: every forward reaches every layer
        self._backward(loss * grad_scale + self._touch_all() if touch else loss * grad_scale)
        sums["loss"] += loss.detach()
        sums["clipped"] += (clipped * m).sum()
        sums["tokens"] += m.sum()

    # ---- helpers --------------------------------------------------------------------------
    def _micro(self, idx: torch.Tensor, batch: TrainBatch) -> list[torch.Tensor]:
        """`idx` cut into micro-batches of at most micro_batch_size sequences and
        micro_batch_tokens tokens (always at least one sequence)."""
        size = self.settings.micro_batch_size or max(idx.numel(), 1)
        if self.settings.micro_batch_tokens is not None:
            size = min(size, max(1, self.settings.micro_batch_tokens // max(batch.input_ids.shape[1], 1)))
        return list(torch.split(idx, size))

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
        self, batch: TrainBatch, prep: Prepared, idx: torch.Tensor, mask: torch.Tensor
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
            sampling=prep.sampling[idx],
            chunk_tokens=self.settings.logprob_chunk_tokens,
            need=mask[idx],
        )
        self._backward(logp.sum() * 0.0)

    def _touch_all(self) -> torch.Tensor:
        """0, with a gradient path to every parameter: a backward that reaches every gradient
        bucket, whichever tokens its micro-batch trains (no unused-parameter search needed)."""
        params = [p.reshape(-1)[:1] for p in self.model.parameters() if p.requires_grad]
        return torch.cat(params).sum() * 0.0

    @staticmethod
    def _inputs(batch: TrainBatch, idx: torch.Tensor) -> dict[str, Any]:
        """token_logprobs' model inputs for sequences `idx` (a tree's mask and parents included)."""
        attn = batch.attention_mask[idx] if batch.attention_mask is not None else None
        inputs = forward_inputs(batch.position_ids[idx], batch.row_index[idx], attn)
        return {"input_ids": batch.input_ids[idx], **inputs}

    def _backward(self, loss: torch.Tensor) -> None:
        if self._trainer is not None:
            self.manual_backward(loss)
        else:
            loss.backward()

    def _step(self, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None = None) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.settings.grad_clip if self.settings.grad_clip is not None else float("inf")
        norm = to_float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        self.optimizer_steps += 1
        return norm

    def _timed_push(self) -> float:
        t = time.perf_counter()
        if self.weight_sync is not None:
            self._push()  # an unbound sync raises: a silent no-push would fake learning
        else:
            self.own_version += 1
        return time.perf_counter() - t

    def _push(self) -> int:
        """Rank 0 pushes; under several ranks every rank learns the new version, or rank 0's
        error (a refused push raises on every rank, none waits for a version that never comes).
        Under FSDP the other ranks join the push's gathers (`WeightSync.follow`)."""
        assert self.weight_sync is not None
        policy = self._peft.model if self._peft is not None else self.model  # a PeftModel: its adapter alone
        if self._world() == 1:
            return self.weight_sync.push(policy)
        version, error = -1, None
        if self.global_rank == 0:
            try:
                version = int(self.weight_sync.push(policy))
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                self.trainer.strategy.broadcast((version, error), src=0)
                raise
        elif self.sharded:
            self.weight_sync.follow(policy)
        version, error = self.trainer.strategy.broadcast((version, error), src=0)
        if error is not None:
            raise RuntimeError(f"rank 0's weight push failed: {error}")
        self.own_version = int(version)
        return self.own_version

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

    def _skip(self, why: str, **extra: float) -> dict[str, float]:
        self.skipped_batches += 1
        log.warning("skipped a batch: %s (%d skipped so far)", why, self.skipped_batches)
        return {
            "train/skipped": 1.0,
            "train/skipped_batches": float(self.skipped_batches),
            "train/optimizer_steps": 0.0,
            "train/policy_version": float(self.current_version()),
            **{f"train/{k}": float(v) for k, v in extra.items()},
        }

    def _rollout_metrics(self, batch: TrainBatch | None) -> dict[str, float]:
        """rollout/* from the datamodule (its `last_metrics` for this batch) and per harness."""
        feed = feed_of(self._trainer)
        out = numeric(feed.last_metrics if feed is not None else {})
        if batch is not None and batch.num_rows:
            out.update(harness_metrics(batch))
        return out


def grpo_module(
    model_dir: str | Path | None = None,
    *,
    model: nn.Module | None = None,
    weight_sync: WeightSync | None = None,
    **settings: Any,
) -> GRPOModule:
    """conf/module/grpo.yaml's `_target_`: the flat `module.*` keys (lr, kl_coef, lora, ...) become
    the module's GRPOSettings; an unknown key is a ValueError naming it and the known ones."""
    return GRPOModule(
        model_dir, settings=GRPOSettings.from_config(settings), model=model, weight_sync=weight_sync
    )


class _Outside:
    """Holds the PeftModel around `GRPOModule.model` outside the module tree: its parameters are
    the model's own, so registering it would list each twice (in checkpoints too)."""

    def __init__(self, model: PeftModel) -> None:
        self.model = model


@dataclass(slots=True)
class _Seen:
    """pi_old's logprobs and entropies (N, T) as a single-step batch's micro-steps computed them,
    the off-policy weights they derived, and which rows they covered (1 on those rows)."""

    old: torch.Tensor
    ent: torch.Tensor
    covered: torch.Tensor
    tis_w: torch.Tensor | None
    keep_w: torch.Tensor | None

    @classmethod
    def zeros(
        cls,
        mask: torch.Tensor,
        tis: Callable[..., torch.Tensor] | None,
        off_policy_mask: Callable[..., torch.Tensor] | None,
    ) -> _Seen:
        z = functools.partial(torch.zeros_like, mask, dtype=torch.float32)
        return cls(
            z(), z(), z(), z() if tis is not None else None, z() if off_policy_mask is not None else None
        )

    def record(
        self,
        idx: torch.Tensor,
        old: torch.Tensor,
        ent: torch.Tensor,
        tis_w: torch.Tensor | None,
        keep_w: torch.Tensor | None,
    ) -> None:
        self.old[idx], self.ent[idx], self.covered[idx] = old, ent, 1.0
        if self.tis_w is not None:
            assert tis_w is not None  # both come from the same `tis`
            self.tis_w[idx] = tis_w
        if self.keep_w is not None:
            assert keep_w is not None  # both come from the same `off_policy_mask`
            self.keep_w[idx] = keep_w
