"""GRPOModule on the tiny model with rows sampled from the real embedded engine: a Lightning
training step, packed logprobs, the direction of an update, epochs x minibatches, skipped batches."""

from __future__ import annotations

import csv
import functools
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from module_rows import prompt_ids, sample_group
from torch.utils.data import DataLoader

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import scorable, token_logprobs
from polar_pl.module.losses import kl_k3
from polar_pl.module.offpolicy import tis_token
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import EmbeddedStateDictSync

BUDGET = 64


class Runtime:
    """Stands in for the rollout runtime: pushes go to the engine itself (no gateway to pause)."""

    interrupted = False

    def __init__(self, engine):
        self.engine = engine

    def push_target(self):
        return self.engine


class Batches(L.LightningDataModule):
    """Stands in for the RolloutDataModule (not under test; a `RolloutFeed`): fixed batches, a
    runtime with its engine, and the `last_metrics` it sets for each batch."""

    def __init__(self, engine, batches):
        super().__init__()
        self.runtime, self.batches = Runtime(engine), batches
        self.steps, self.batches_done, self.wait_total_s, self.last_groups = len(batches), 0, 0.0, []
        self.last_metrics = {
            "rollout/reward_mean": 0.5,
            "rollout/sessions": 8,
            "rollout/note": "not a number",
        }

    def train_dataloader(self):
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)


def per_row(logp: torch.Tensor, batch) -> list[list[float]]:
    """Sampled-token logprobs of each row, in row order."""
    sel = (batch.loss_mask > 0) & scorable(batch.position_ids)
    return [logp[(batch.row_index == r) & sel].tolist() for r in range(batch.num_rows)]


def params(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.model.named_parameters()}


def test_lightning_step_logs_pushes_and_matches_engine(tiny_model_dir, fresh_engine, rows, tmp_path) -> None:
    module = GRPOModule(tiny_model_dir, weight_sync=EmbeddedStateDictSync(), settings=GRPOSettings(lr=1e-3))
    before = params(module)
    v0 = fresh_engine.policy_version()
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, logger=CSVLogger(tmp_path, name="run"), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(module, datamodule=Batches(fresh_engine, [collate(rows, token_budget=BUDGET)]))

    assert module.weight_sync.engine is fresh_engine  # bound from the runtime in on_fit_start
    assert fresh_engine.policy_version() == v0 + 1 and trainer.global_step == 1
    assert any(not torch.equal(before[k], v) for k, v in params(module).items())
    (metrics_csv,) = tmp_path.glob("run/*/metrics.csv")
    logged = {k: v for row in csv.DictReader(metrics_csv.open()) for k, v in row.items() if v != ""}
    for key in (
        "train/loss", "train/clip_frac", "train/kl", "train/entropy", "train/logprob_gap_mean", "train/ratio_p05",
        "train/ratio_p50", "train/ratio_p95", "train/tokens_per_s", "train/staleness_mean", "train/push_s",
        "train/grad_norm", "rollout/reward_mean", "rollout/sessions", "rollout/reward_mean/mini",
        "rollout/pass_rate/mini",
    ):  # fmt: skip
        assert key in logged, key
    assert math.isfinite(float(logged["train/loss"]))
    assert "rollout/note" not in logged
    assert float(logged["rollout/reward_mean/mini"]) == 0.5
    # Rows were sampled by the engine with the weights the trainer started from: the trainer's
    # logprobs (logits at t-1, packed rows) reproduce the engine's.
    assert float(logged["train/logprob_gap_mean"]) < 1e-3
    assert float(logged["train/ratio_p05"]) == pytest.approx(1.0, abs=1e-3)
    assert float(logged["train/staleness_mean"]) == 0.0


def test_packed_logprobs_equal_padded(tiny_model_dir, rows) -> None:
    module = GRPOModule(tiny_model_dir)
    packed, padded = collate(rows, mode="pack", token_budget=BUDGET), collate(rows, mode="pad")
    assert packed.input_ids.shape[0] < len(rows)  # several rows share a sequence
    with torch.no_grad():
        a = per_row(token_logprobs(module.model, packed.input_ids, packed.position_ids)[0], packed)
        b = per_row(
            token_logprobs(module.model, padded.input_ids, padded.position_ids, padded.attention_mask)[0],
            padded,
        )
    for x, y, row in zip(a, b, rows, strict=True):
        assert x == pytest.approx(y, abs=1e-5)
        assert x == pytest.approx(row.behavior_logprobs[-len(x) :], abs=1e-3)


def test_positive_advantage_tokens_gain_probability(tiny_model_dir, rows) -> None:
    module = GRPOModule(tiny_model_dir, settings=GRPOSettings(lr=1e-3))
    batch = collate(rows, token_budget=BUDGET)
    with torch.no_grad():
        old = per_row(token_logprobs(module.model, batch.input_ids, batch.position_ids)[0], batch)
    metrics = module.update(batch, module.configure_optimizers())
    assert metrics["train/optimizer_steps"] == 1.0
    with torch.no_grad():
        new = per_row(token_logprobs(module.model, batch.input_ids, batch.position_ids)[0], batch)
    for row, o, n in zip(rows, old, new, strict=True):
        delta = sum(n) / len(n) - sum(o) / len(o)
        assert delta > 0 if row.reward > 0 else delta < 0, (row.rollout_id, row.reward, delta)


def test_epochs_minibatches_micro_batches_and_push_every(tiny_model_dir, fresh_engine, rows) -> None:
    sync = EmbeddedStateDictSync().bind(fresh_engine)
    module = GRPOModule(
        tiny_model_dir,
        weight_sync=sync,
        settings=GRPOSettings(
            lr=1e-3,
            epochs=2,
            minibatches=2,
            micro_batch_size=1,
            push_every=2,
            kl=kl_k3,
            kl_coef=0.1,
            tis=functools.partial(tis_token, cap=2.0),
        ),
    )
    v0 = fresh_engine.policy_version()
    batch = collate(rows, token_budget=32)  # several sequences, so the minibatches are not empty
    assert batch.input_ids.shape[0] >= 2
    m = module.update(batch, module.configure_optimizers())
    assert m["train/optimizer_steps"] == 4 and module.optimizer_steps == 4
    assert fresh_engine.policy_version() == v0 + 2  # pushed after steps 2 and 4
    assert m["train/kl"] > 0 and math.isfinite(m["train/loss"])  # the policy left the reference
    assert m["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert m["train/push_s"] > 0


def test_zero_variance_and_empty_batches_are_skipped(tiny_model_dir, engine) -> None:
    module = GRPOModule(tiny_model_dir, settings=GRPOSettings(lr=1e-3))
    opt = module.configure_optimizers()
    before = params(module)
    same = sample_group(engine, "flat", prompt_ids(6, 3), rewards=[1.0] * 4)
    m = module.update(collate(same, token_budget=BUDGET), opt)
    assert m["train/skipped"] == 1.0 and m["train/filtered_groups_frac"] == 1.0
    assert module.update(None, opt)["train/skipped_batches"] == 2.0
    assert module.optimizer_steps == 0 and all(torch.equal(before[k], v) for k, v in params(module).items())
    # Without the filter the same batch trains (with zero advantages: the loss is 0).
    keep = GRPOModule(tiny_model_dir, settings=GRPOSettings(lr=1e-3, filter_zero_variance=False))
    m = keep.update(collate(same, token_budget=BUDGET), keep.configure_optimizers())
    assert m["train/optimizer_steps"] == 1.0 and m["train/loss"] == 0.0


def test_bad_config_names_the_key(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="module.minibatches"):
        GRPOModule(tiny_model_dir, settings=GRPOSettings(minibatches=0))
    with pytest.raises(ValueError, match="module.kl"):
        GRPOModule(tiny_model_dir, settings=GRPOSettings(kl_coef=0.1))
    with pytest.raises(FileNotFoundError, match="module.model_dir"):
        GRPOModule("/nonexistent/model")


def test_resume_restores_counters_and_pushes_trained_weights(
    tiny_model_dir, fresh_engine, rows, tmp_path
) -> None:
    """A resumed run pushes the restored weights before training: the engine would otherwise sample
    with the initial checkpoint while the trainer holds the trained one."""

    class Recording(EmbeddedStateDictSync):
        def push(self, model):
            self.pushed = [*getattr(self, "pushed", []), params_of(model)]
            return super().push(model)

    def params_of(model) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in model.named_parameters()}

    def fit(max_steps: int, ckpt_path=None) -> tuple[GRPOModule, L.Trainer]:
        module = GRPOModule(tiny_model_dir, weight_sync=Recording(), settings=GRPOSettings(lr=1e-2))
        trainer = L.Trainer(
            accelerator="cpu", max_steps=max_steps, default_root_dir=tmp_path, logger=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        batches = [collate(rows, token_budget=BUDGET) for _ in range(max_steps)]
        trainer.fit(module, datamodule=Batches(fresh_engine, batches), ckpt_path=ckpt_path)
        return module, trainer

    first, _ = fit(1)
    (ckpt,) = tmp_path.glob("checkpoints/*.ckpt")
    trained = params(first)
    fresh_engine.update_weights_from_state_dict(GRPOModule(tiny_model_dir).model.state_dict())  # a new engine
    v0 = fresh_engine.policy_version()
    resumed, trainer = fit(2, ckpt_path=str(ckpt))
    assert trainer.global_step == 2 and resumed.optimizer_steps == 2
    assert fresh_engine.policy_version() == v0 + 2  # the resume push, then the step's push
    first_push = resumed.weight_sync.pushed[0]
    assert all(torch.equal(trained[k], first_push[k]) for k in trained)  # the restored weights
    assert any(not torch.equal(trained[k], v) for k, v in params(resumed).items())  # then trained on


@pytest.mark.parametrize("micro_batch_size", [None, 1])
def test_single_step_batch_takes_pi_old_from_its_own_forward(
    tiny_model_dir, rows, monkeypatch, micro_batch_size
) -> None:
    """One optimiser step per batch: pi_old is the model before the step, so the update's own
    forward gives its logprobs and no separate pass runs; the step (weights after it) and the
    metrics are those of the two-pass path, with TIS and KL on."""
    kw = {"lr": 1e-3, "micro_batch_size": micro_batch_size, "tis": functools.partial(tis_token, cap=2.0),
              "kl": kl_k3, "kl_coef": 0.1, "entropy_coef": 0.01}  # fmt: skip
    fused, two_pass = (
        GRPOModule(tiny_model_dir, settings=GRPOSettings(**kw)),
        GRPOModule(tiny_model_dir, settings=GRPOSettings(**kw)),
    )
    assert fused.single_step
    passes = []
    monkeypatch.setattr(GRPOModule, "_old_logprobs", lambda self, *a: passes.append(1) or _OLD(self, *a))
    m_fused = fused.update(collate(rows, token_budget=BUDGET), fused.configure_optimizers())
    assert passes == []
    monkeypatch.setattr(GRPOModule, "single_step", property(lambda self: False))
    m_two = two_pass.update(collate(rows, token_budget=BUDGET), two_pass.configure_optimizers())
    assert passes == [1]
    for k, v in params(two_pass).items():
        assert torch.allclose(params(fused)[k], v, atol=1e-6, rtol=1e-5), k
    for key in ("train/loss", "train/kl", "train/entropy", "train/logprob_gap_mean", "train/tis_weight_mean",
                "train/clip_frac", "train/ratio_p50"):  # fmt: skip
        assert m_fused[key] == pytest.approx(m_two[key], rel=1e-5, abs=1e-6), key


_OLD = GRPOModule._old_logprobs
