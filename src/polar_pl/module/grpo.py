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
   behaviour logprobs mu (targets.py); a single-step batch takes pi_old from its own forward;
4. `epochs` x `minibatches` optimiser steps over the packed sequences, each minibatch cut into
   micro-batches (by sequences and/or tokens) for memory; a tree (a group's shared prefix and
   its rows' suffixes, collate mode "tree") lies in one sequence, so no cut splits it.
   Aggregation weights are computed once for the whole batch, so a rollout weighs the same
   wherever its rows land; the policy loss (config-chosen), KL, an entropy bonus, gradient
   clipping, AdamW, an optional LR schedule;
5. after every `push_every`-th optimiser step, `weight_sync.push(model)` (with LoRA, the adapter
   alone: weight_sync.py).

The settings are one GRPOSettings (settings.py); the model, its LoRA adapter, the frozen reference,
the logprob passes and the steps over several ranks are PolicyModule's (policy.py).

Optimisation is manual (`automatic_optimization = False`): Lightning's global step counts
optimiser steps, so a batch advances it by epochs x minibatches, and a skipped batch by 0.

Several processes (`trainer.devices=N`, Lightning's `ddp`, or `trainer.strategy=fsdp`): every rank
holds the whole batch (the datamodule broadcasts rank 0's), so advantages and aggregation weights
are the one-process ones (global normalisation); each rank trains on its share of the
micro-batches with the loss scaled by N against the strategy's averaging: the gradient is the
one-process gradient. Rank 0 pushes the weights (under `fsdp` the push gathers one tensor at a
time) and every rank learns the version.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module.logprobs import token_logprobs
from polar_pl.module.metrics import batch_metrics, harness_metrics, numeric, unit_metrics
from polar_pl.module.policy import PolicyModule
from polar_pl.module.prepare import prepare, unit_sums
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.targets import Seen, Targets, corrections, unit_advantages
from polar_pl.module.weight_sync import WeightSync
from polar_pl.rollout.runtime import feed_of

log = logging.getLogger(__name__)


class GRPOModule(PolicyModule):
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
        if settings.lora is not None and not (weight_sync is None or weight_sync.pushes_adapters):
            raise ValueError(
                f"module.weight_sync={type(weight_sync).__name__} cannot push a LoRA adapter (module.lora.rank="
                f"{settings.lora.rank}): use module/weight_sync=embedded, disk or none"
            )
        super().__init__(model_dir, settings=settings, model=model)
        self.weight_sync = weight_sync
        self.skipped_batches = 0
        self.own_version = 0  # pushes done, when there is no weight sync to ask
        self._logged: set[str] = set()  # every key training_step has logged

    # ---- Lightning hooks ------------------------------------------------------------------
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
        s = self.settings
        prep = prepare(batch, side_rows=s.side_rows, overlong=s.overlong, temperature=s.temperature)
        units = prep.units
        old = ent = ref = penalty = None
        if s.kl_reward_coef > 0:
            old, ent, ref = self._old_logprobs(batch, prep.sampling)
            assert s.kl_reward is not None and ref is not None  # GRPOSettings: kl_reward_coef > 0 needs both
            kl = s.kl_reward(old, ref)
            penalty = s.kl_reward_coef * unit_sums(kl, prep.eligible, prep.token_unit, units.reward.numel())
        adv, keep, filtered = unit_advantages(s, units, penalty)
        batch.advantages = torch.where(units.row >= 0, adv[units.row.clamp(min=0)], 0.0).detach()
        mask = prep.eligible * keep[prep.token_unit.clamp(min=0)]
        if mask.sum() == 0:
            return self._skip("no trainable tokens", filtered_groups_frac=filtered)
        tok_adv = adv[prep.token_unit.clamp(min=0)] * mask
        fused = old is None and self.single_step
        if fused:  # pi_old is the model as it is: its logprobs come from the update's own forward
            ref = self._ref_logprobs(batch, prep.sampling) if s.needs_ref else None
            tis_w = keep_w = corr = None
        else:
            if old is None:
                old, ent, ref = self._old_logprobs(batch, prep.sampling)
            tis_w, keep_w, corr = corrections(s, old, batch.behavior_logprobs, mask, prep.segments, tok_adv)
        t1 = time.perf_counter()
        seen = Seen.zeros(mask, s.tis, s.off_policy_mask) if fused else None
        stats = self._optimise(
            Targets(batch, prep, mask, tok_adv, old, ref, corr, seen), optimizer, scheduler
        )
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
                * s.epochs
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

    def _optimise(
        self, t: Targets, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None
    ) -> dict[str, float]:
        """epochs x minibatches optimiser steps over the batch, pushing after every push_every-th;
        returns their train/* metrics (summed over the ranks)."""
        self.model.train()
        s, mask = self.settings, t.mask
        n = t.batch.input_ids.shape[0]
        gen = torch.Generator().manual_seed(s.seed + self.optimizer_steps)
        # Once for the whole batch: a rollout weighs the same whichever minibatches its rows land in.
        weights = s.aggregation(mask, t.batch.row_index, t.prep.units.row.clamp(min=0))
        sums = {
            k: torch.zeros((), dtype=torch.float64, device=mask.device)
            for k in ("loss", "kl", "clipped", "tokens")
        }
        norms: list[float] = []
        push_s, push_bytes = 0.0, 0
        world = self._world()
        for _ in range(s.epochs):
            order = (
                torch.randperm(n, generator=gen).to(mask.device)
                if s.minibatches > 1
                else torch.arange(n, device=mask.device)
            )
            mbs = [mb for mb in torch.tensor_split(order, s.minibatches) if mb.numel() and mask[mb].sum() > 0]
            for mb in mbs:
                # nothing trainable in a micro-batch: no forward (on every rank alike)
                micros = [idx for idx in self._micro(mb, t.batch) if mask[idx].sum() > 0]
                mine, pad = self._share(micros)
                # x len(mbs): each optimiser step carries its share of the batch at full scale.
                for idx in mine:
                    self._micro_step(t, idx, weights[idx] * len(mbs), sums, grad_scale=world)
                for _ in range(pad):
                    self._empty_backward(t.batch, t.prep.sampling, micros[0], mask)
                norms.append(self._step(optimizer, scheduler))
                if not self.optimizer_steps % s.push_every:
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
        t: Targets,
        idx: torch.Tensor,
        w: torch.Tensor,
        sums: dict[str, torch.Tensor],
        grad_scale: int = 1,
    ) -> None:
        """Forward, loss and backward of one micro-batch (sequences `idx`, token weights `w`);
        grad_scale: the number of ranks whose gradients the strategy averages. With `t.seen` (a
        single-step batch, no `t.old`) pi_old is this forward's logprobs, detached, and the
        off-policy corrections are computed here; `t.seen` keeps them for the batch metrics."""
        s, batch, prep, seen = self.settings, t.batch, t.prep, t.seen
        m, segments, adv = t.mask[idx], prep.segments.select(idx), t.tok_adv[idx]
        logp, ent = token_logprobs(
            self.model,
            **self._inputs(batch, idx),
            sampling=prep.sampling[idx],
            with_entropy=s.entropy_coef > 0 or seen is not None,
            chunk_tokens=s.logprob_chunk_tokens,
            need=m if seen is None else prep.sampled[idx],
        )
        if seen is None:
            assert t.old is not None  # not fused: update computed pi_old before the steps
            old_mb, corr_mb = t.old[idx], (t.corr[idx] if t.corr is not None else None)
        else:
            old_mb = logp.detach()
            assert ent is not None  # with_entropy when seen
            tis_mb, keep_mb, corr_mb = corrections(s, old_mb, batch.behavior_logprobs[idx], m, segments, adv)
            seen.record(idx, old_mb, ent.detach(), tis_mb, keep_mb)
        per_token, clipped = s.policy_loss(logp, old_mb, adv, m, segments)
        if corr_mb is not None:
            per_token = per_token * corr_mb
        if t.ref is not None and s.kl_coef > 0:
            assert s.kl is not None  # GRPOSettings: kl_coef > 0 needs kl
            k = s.kl(logp, t.ref[idx])
            per_token = per_token + s.kl_coef * k
            sums["kl"] += (k.detach() * w).sum()
        if s.entropy_coef > 0:
            assert ent is not None  # with_entropy when entropy_coef > 0
            per_token = per_token - s.entropy_coef * ent
        loss = torch.where(w > 0, per_token * w, 0.0).sum()
        touch = grad_scale > 1 and not self.sharded  # FSDP: every forward reaches every layer
        self._backward(loss * grad_scale + self._touch_all() if touch else loss * grad_scale)
        sums["loss"] += loss.detach()
        sums["clipped"] += (clipped * m).sum()
        sums["tokens"] += m.sum()

    # ---- the weight push ------------------------------------------------------------------
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

    # ---- metrics -------------------------------------------------------------------------
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
