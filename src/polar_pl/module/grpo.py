"""GRPOModule: one rollout batch in, several optimiser steps, weights pushed to the engine.

Per batch (`update`):
1. rewards per rollout -> advantages (config-chosen function), broadcast to every row and token;
   optionally drop groups whose rewards have zero variance (their tokens leave the loss);
2. under no_grad, before any update: the trainer's logprobs of the sampled tokens (pi_old), the
   entropy of each prediction, the frozen reference's logprobs when KL is on, and the truncated
   importance weights pi_old / mu against the engine's behaviour logprobs mu when TIS is on;
3. `epochs` x `minibatches` optimiser steps over the packed sequences, each minibatch cut into
   micro-batches of `micro_batch_size` sequences for memory (the aggregation weights are computed
   per minibatch, so accumulation is exact); clipped surrogate (+ KL), gradient clipping, AdamW;
4. after every `push_every`-th optimiser step, `weight_sync.push(model)`.

Optimisation is manual (`automatic_optimization = False`): Lightning's global step counts
optimiser steps, so a batch advances it by epochs x minibatches, and a skipped batch by 0.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module import advantages as adv_fns
from polar_pl.module import aggregation as agg_fns
from polar_pl.module.logprobs import scorable, token_logprobs
from polar_pl.module.losses import clipped_policy_loss
from polar_pl.module.metrics import batch_metrics, harness_metrics, numeric
from polar_pl.module.weight_sync import WeightSync

log = logging.getLogger(__name__)


class _Frozen:
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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class GRPOModule(L.LightningModule):
    """See the module docstring.

    model_dir: HF model directory (or pass `model`, an nn.Module with a HF causal-LM forward).
    advantage: fn(rewards (K,), group (K,)) -> (K,), see advantages.py (default group_mean).
    aggregation: fn(mask, row_index, row_rollout) -> token weights, see aggregation.py.
    kl: fn(logp, ref_logp) -> (N, T) (kl_k1 / kl_k3) or None; used when kl_coef > 0.
    tis: fn(old_logp, behavior_logp, mask, row_index) -> (N, T) (tis_token / tis_sequence) or None.
    filter_zero_variance: drop groups whose rewards are all equal.
    micro_batch_size: sequences per forward/backward (None: the whole minibatch).
    temperature: the engine's sampling temperature (logits are divided by it).
    weight_sync: a WeightSync (bound to the datamodule's engine in on_fit_start if unbound), or None.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        model: nn.Module | None = None,
        advantage: Callable[..., torch.Tensor] | None = None,
        aggregation: Callable[..., torch.Tensor] | None = None,
        kl: Callable[..., torch.Tensor] | None = None,
        kl_coef: float = 0.0,
        tis: Callable[..., torch.Tensor] | None = None,
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        dual_clip: float | None = None,
        filter_zero_variance: bool = True,
        epochs: int = 1,
        minibatches: int = 1,
        micro_batch_size: int | None = None,
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        grad_clip: float | None = 1.0,
        temperature: float = 1.0,
        push_every: int = 1,
        weight_sync: WeightSync | None = None,
        dtype: str | None = None,
        attn_implementation: str | None = None,
        gradient_checkpointing: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        self.automatic_optimization = False
        for key, value, low in (
            ("epochs", epochs, 1),
            ("minibatches", minibatches, 1),
            ("push_every", push_every, 1),
        ):
            if int(value) < low:
                raise ValueError(f"module.{key}={value}: must be >= {low}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"module.micro_batch_size={micro_batch_size}: must be >= 1 or null")
        if kl_coef > 0 and kl is None:
            raise ValueError("module.kl_coef > 0 needs module.kl (kl_k1 or kl_k3)")
        if model is None:
            if model_dir is None:
                raise ValueError("GRPOModule needs module.model_dir (or a model)")
            model = load_model(model_dir, dtype=dtype, attn_implementation=attn_implementation)
        self.model = model.train()  # from_pretrained returns eval mode; the old-logprob pass sets eval itself
        self.model_dir = model_dir
        if gradient_checkpointing:
            enable_checkpointing(self.model)
        self.advantage = advantage or functools.partial(adv_fns.group_mean, std_normalize=True)
        self.aggregation = aggregation or agg_fns.token_mean
        self.kl, self.kl_coef, self.tis = kl, float(kl_coef), tis
        self.eps_low, self.eps_high, self.dual_clip = eps_low, eps_high, dual_clip
        self.filter_zero_variance = filter_zero_variance
        self.epochs, self.minibatches, self.micro_batch_size = int(epochs), int(minibatches), micro_batch_size
        self.lr, self.weight_decay, self.betas, self.adam_eps = lr, weight_decay, tuple(betas), adam_eps
        self.grad_clip, self.temperature = grad_clip, temperature
        self.push_every, self.weight_sync, self.seed = int(push_every), weight_sync, seed
        self._ref = _Frozen(copy.deepcopy(self.model)) if self.kl_coef > 0 else None
        self.optimizer_steps = 0  # over the whole run (checkpointed)
        self.skipped_batches = 0
        self.own_version = 0  # pushes done, when there is no weight sync to ask

    # ---- Lightning hooks ------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, eps=self.adam_eps, weight_decay=self.weight_decay
        )

    def bind_engine(self, engine: Any) -> None:
        """Point the weight sync at the engine (the datamodule owns it). on_fit_start does this
        itself from `trainer.datamodule.engine` when the sync is still unbound."""
        if self.weight_sync is not None:
            self.weight_sync.bind(engine)

    def on_fit_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        engine = getattr(dm, "engine", None)
        if self.weight_sync is not None and self.weight_sync.engine is None and engine is not None:
            self.weight_sync.bind(engine)
        if self.optimizer_steps and self.weight_sync is not None:
            # Resumed (Lightning restores the weights before this hook): the engine started from the
            # initial checkpoint, so it must receive the trained weights before the first rollout.
            self.weight_sync.push(self.model)

    def on_fit_end(self) -> None:
        if self.weight_sync is not None:
            self.weight_sync.close()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["grpo"] = {
            "optimizer_steps": self.optimizer_steps,
            "skipped_batches": self.skipped_batches,
            "own_version": self.own_version,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("grpo", {})
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        self.skipped_batches = int(state.get("skipped_batches", 0))
        self.own_version = int(state.get("own_version", 0))

    def training_step(self, batch: TrainBatch | None, batch_idx: int) -> None:
        metrics = self._rollout_metrics(batch)
        metrics.update(self.update(batch, self.optimizers()))
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    # ---- the GRPO step --------------------------------------------------------------------
    def current_version(self) -> int:
        """The engine's policy version now (the staleness reference)."""
        sync = self.weight_sync
        if sync is not None and sync.engine is not None:
            return sync.policy_version()
        return self.own_version

    def update(self, batch: TrainBatch | None, optimizer: torch.optim.Optimizer) -> dict[str, float]:
        """Run the optimiser steps for one rollout batch; returns train/* metrics. Works without a
        Lightning Trainer (bench/gpu_step.py calls it with a plain optimizer)."""
        t0 = time.perf_counter()
        version_now = self.current_version()  # before this batch's pushes: the staleness reference
        if batch is None or batch.num_rows == 0:
            return self._skip("empty batch")
        device = next(self.model.parameters()).device
        batch = batch.to(device)
        group_adv, keep, filtered = self._advantages(batch)
        row_adv = group_adv[batch.rollout_index]
        batch.advantages = row_adv.detach()
        sampled = batch.loss_mask * scorable(batch.position_ids)
        mask = sampled * keep[batch.rollout_index][batch.row_index.clamp(min=0)] * (batch.row_index >= 0)
        if mask.sum() == 0:
            return self._skip("no trainable tokens", filtered_groups_frac=filtered)
        tok_adv = row_adv[batch.row_index.clamp(min=0)] * mask

        old, ent, ref = self._old_logprobs(batch)
        tis_w = (
            self.tis(old, batch.behavior_logprobs, mask, batch.row_index) if self.tis is not None else None
        )
        t1 = time.perf_counter()
        stats = self._optimise(batch, optimizer, mask, tok_adv, old, ref, tis_w)
        t2 = time.perf_counter()
        real_tokens = batch.total_tokens - batch.padding_tokens
        m = batch_metrics(
            old=old, behavior=batch.behavior_logprobs, sampled=sampled, mask=mask, entropy=ent,
            token_versions=batch.policy_version, current_version=version_now, tis_w=tis_w,
        )  # fmt: skip
        m.update(stats)
        m.update({
            "train/tokens_per_s": real_tokens * self.epochs / max(t2 - t0 - stats["train/push_s"], 1e-9),
            "train/old_logprob_s": t1 - t0,
            "train/update_s": t2 - t1 - stats["train/push_s"],
            "train/filtered_groups_frac": filtered,
            "train/trainable_tokens": float(mask.sum()),
            "train/advantage_abs_mean": float(row_adv.abs().mean()),
            "train/skipped_batches": float(self.skipped_batches),
            "train/policy_version": float(self.current_version()),
        })  # fmt: skip
        return m

    def _advantages(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(advantage per rollout (K,), keep per rollout (K,) bool, fraction of groups dropped)."""
        rewards, group = adv_fns.rollout_rewards(batch.rewards, batch.rollout_index, batch.group_index)
        advantage = self.advantage(rewards, group).to(batch.rewards.device)
        keep = group >= 0
        filtered = 0.0
        if self.filter_zero_variance:
            signal = adv_fns.nonzero_variance_groups(rewards, group)
            groups = group[keep].unique()
            dropped = group[keep & ~signal].unique()
            filtered = dropped.numel() / max(groups.numel(), 1)
            keep = keep & signal
        return advantage, keep, filtered

    @torch.no_grad()
    def _old_logprobs(self, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """pi_old logprobs and entropies (N, T) of the current model, and the reference's logprobs."""
        was_training = self.model.training
        self.model.eval()
        olds, ents, refs = [], [], []
        ref_model = self._ref.on(batch.input_ids.device) if self._ref is not None else None
        sampled = batch.loss_mask * scorable(batch.position_ids)
        for idx in self._micro(torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)):
            args, need = self._inputs(batch, idx), sampled[idx]
            lp, ent = token_logprobs(
                self.model, *args, temperature=self.temperature, with_entropy=True, need=need
            )
            olds.append(lp)
            ents.append(ent)
            if ref_model is not None:
                refs.append(token_logprobs(ref_model, *args, temperature=self.temperature, need=need)[0])
        self.model.train(was_training)
        return torch.cat(olds), torch.cat(ents), (torch.cat(refs) if refs else None)

    def _optimise(self, batch, optimizer, mask, tok_adv, old, ref, tis_w) -> dict[str, float]:
        self.model.train()
        n = batch.input_ids.shape[0]
        gen = torch.Generator().manual_seed(self.seed + self.optimizer_steps)
        row_rollout = batch.rollout_index
        # Device-side sums: converting per micro-batch would make the GPU wait on the host each time.
        zero = torch.zeros((), dtype=torch.float64, device=mask.device)
        loss_sum, kl_sum, clipped, tokens = zero.clone(), zero.clone(), zero.clone(), zero.clone()
        norms: list[float] = []
        push_s = 0.0
        steps = 0
        for _ in range(self.epochs):
            order = (
                torch.randperm(n, generator=gen).to(mask.device)
                if self.minibatches > 1
                else torch.arange(n, device=mask.device)
            )
            for mb in torch.tensor_split(order, self.minibatches):
                if mb.numel() == 0 or mask[mb].sum() == 0:
                    continue
                weights = self.aggregation(mask[mb], batch.row_index[mb], row_rollout)
                for pos in self._micro(torch.arange(mb.numel(), device=mb.device)):
                    idx = mb[pos]
                    logp, _ = token_logprobs(
                        self.model, *self._inputs(batch, idx), temperature=self.temperature, need=mask[idx]
                    )
                    pg, was_clipped = clipped_policy_loss(
                        logp,
                        old[idx],
                        tok_adv[idx],
                        eps_low=self.eps_low,
                        eps_high=self.eps_high,
                        dual_clip=self.dual_clip,
                    )
                    if tis_w is not None:
                        pg = pg * tis_w[idx]
                    per_token = pg
                    if ref is not None:
                        k = self.kl(logp, ref[idx])
                        per_token = per_token + self.kl_coef * k
                        kl_sum += (k.detach() * weights[pos]).sum()
                    loss = (per_token * weights[pos]).sum()
                    self._backward(loss)
                    loss_sum += loss.detach()
                    clipped += (was_clipped * mask[idx]).sum()
                    tokens += mask[idx].sum()
                norms.append(self._step(optimizer))
                steps += 1
                push_s += self._maybe_push()
        return {
            "train/loss": float(loss_sum) / max(steps, 1),  # mean over optimiser steps
            "train/clip_frac": float(clipped / tokens.clamp(min=1.0)),
            "train/kl": float(kl_sum) / max(steps, 1),
            "train/grad_norm": sum(norms) / max(len(norms), 1),
            "train/optimizer_steps": float(steps),
            "train/push_s": push_s,
            "train/lr": float(optimizer.param_groups[0]["lr"]),
        }

    # ---- helpers --------------------------------------------------------------------------
    def _micro(self, idx: torch.Tensor) -> list[torch.Tensor]:
        size = self.micro_batch_size or max(idx.numel(), 1)
        return list(torch.split(idx, size))

    @staticmethod
    def _inputs(batch: TrainBatch, idx: torch.Tensor):
        attn = batch.attention_mask[idx] if batch.attention_mask is not None else None
        return batch.input_ids[idx], batch.position_ids[idx], attn

    def _backward(self, loss: torch.Tensor) -> None:
        if self._trainer is not None:
            self.manual_backward(loss)
        else:
            loss.backward()

    def _step(self, optimizer: torch.optim.Optimizer) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return norm

    def _maybe_push(self) -> float:
        if self.optimizer_steps % self.push_every:
            return 0.0
        t = time.perf_counter()
        if self.weight_sync is not None:
            self.weight_sync.push(self.model)  # an unbound sync raises: a silent no-push would fake learning
        else:
            self.own_version += 1
        return time.perf_counter() - t

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
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        out = numeric(getattr(dm, "last_metrics", None) or {})
        if batch is not None and batch.num_rows:
            out.update(harness_metrics(batch))
        return out
