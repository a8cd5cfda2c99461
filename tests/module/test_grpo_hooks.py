"""GRPOModule's Lightning hooks and bookkeeping on the small model, without an engine process:
binding the weight sync, the resume push, checkpointed counters, skipped batches and the logged
rollout metrics. (test_grpo.py runs the same hooks against the real embedded engine; it is too slow
to run per mutant.)"""

from __future__ import annotations

import csv
import functools
import logging
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from small_model import small_model
from synthetic import row
from torch.utils.data import DataLoader

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import EmbeddedStateDictSync

ROWS = [
    row("a0", "a", 1.0, [(2, 5)], 6),
    row("a1", "a", 0.0, [(1, 4)], 5),
    row("b0", "b", 0.25, [(2, 4)], 5, harness="other"),
    row("b1", "b", 0.75, [(1, 3)], 4, harness="other"),
]


class Engine:
    """Stands in for the inference engine (not under test): keeps what is pushed, counts versions."""

    def __init__(self, version: int = 0):
        self.version, self.pushed = version, []

    def update_weights_from_state_dict(self, state: dict[str, torch.Tensor]) -> int:
        self.pushed.append({k: v.clone() for k, v in state.items()})
        self.version += 1
        return self.version

    def policy_version(self) -> int:
        return self.version


class Sync(EmbeddedStateDictSync):
    closed = False

    def close(self) -> None:
        self.closed = True


class Runtime:
    """Stands in for the rollout runtime: its push target is the engine."""

    interrupted = False

    def __init__(self, engine=None):
        self.engine = engine

    def push_target(self):
        return self.engine


class Plain(L.LightningDataModule):
    """Fixed batches, and nothing else: no rollout runtime behind them."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def train_dataloader(self):
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)


class Batches(Plain):
    """Stands in for the RolloutDataModule (a `RolloutFeed`): fixed batches, a runtime with a push
    target, `last_metrics`."""

    def __init__(self, batches, engine=None):
        super().__init__(batches)
        self.runtime = Runtime(engine)
        self.steps, self.batches_done, self.wait_total_s = len(batches), 0, 0.0
        self.last_metrics = {"rollout/sessions": 4, "rollout/ok": True, "rollout/note": "text"}
        self.last_groups = []


def fit(module: GRPOModule, dm: L.LightningDataModule, steps: int = 1, logger=False) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu", max_steps=steps, logger=logger, log_every_n_steps=1, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    return trainer


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_fit_binds_the_datamodules_target_logs_and_closes() -> None:
    engine = Engine(version=7)
    halve = functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda step: 0.5**step)
    module = GRPOModule(
        model=small_model(), weight_sync=Sync(), settings=GRPOSettings(lr=1e-2, lr_scheduler=halve)
    )
    trainer = fit(module, Batches([collate(ROWS, token_budget=16)], engine))
    assert module.weight_sync.engine is engine and module.weight_sync.closed
    assert len(engine.pushed) == 1 and module.optimizer_steps == 1 and trainer.global_step == 1
    logged = trainer.logged_metrics
    assert float(logged["train/policy_version"]) == 8.0
    assert float(logged["rollout/sessions"]) == 4.0 and float(logged["rollout/ok"]) == 1.0
    assert "rollout/note" not in logged
    assert float(logged["rollout/reward_mean/mini"]) == 0.5
    assert float(logged["rollout/reward_mean/other"]) == 0.5
    assert float(logged["rollout/pass_rate/mini"]) == 0.5
    assert float(logged["train/optimizer_steps"]) == 1.0
    assert float(logged["train/lr"]) == pytest.approx(5e-3)  # the schedule stepped once


def test_resumed_fit_pushes_the_restored_weights_first() -> None:
    """A resumed run pushes before its first rollout: the engine restarts from the initial
    checkpoint while the trainer holds the trained weights."""
    engine = Engine()
    module = GRPOModule(model=small_model(), weight_sync=Sync(engine), settings=GRPOSettings(lr=1e-2))
    module.on_load_checkpoint({"grpo": {"optimizer_steps": 5, "skipped_batches": 2, "own_version": 3}})
    restored = weights(module.model)
    fit(module, Batches([collate(ROWS, token_budget=16)]))
    assert len(engine.pushed) == 2 and module.optimizer_steps == 6
    assert all(torch.equal(restored[k], v) for k, v in engine.pushed[0].items())
    assert any(not torch.equal(restored[k], v) for k, v in engine.pushed[1].items())


def test_a_fresh_fit_does_not_push_before_training() -> None:
    engine = Engine()
    module = GRPOModule(
        model=small_model(), weight_sync=Sync(engine), settings=GRPOSettings(lr=1e-2, push_every=2)
    )
    fit(module, Batches([collate(ROWS, token_budget=16)]))
    assert engine.pushed == [] and module.optimizer_steps == 1


def test_an_unbound_sync_needs_a_push_target() -> None:
    module = GRPOModule(model=small_model(), weight_sync=Sync())
    msg = (
        r"module.weight_sync is unbound and no rollout runtime feeds the trainer: fit with a "
        r"RolloutDataModule, or bind_engine\(...\) before fit"
    )
    with pytest.raises(ValueError, match=msg):
        fit(module, Plain([collate(ROWS, token_budget=16)]))
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match=msg):  # plain dataloaders: no datamodule at all
        trainer.fit(module, train_dataloaders=Plain([collate(ROWS, token_budget=16)]).train_dataloader())


def test_bind_engine_binds_the_sync() -> None:
    engine = Engine()
    module = GRPOModule(model=small_model(), weight_sync=Sync())
    module.bind_engine(engine)
    assert module.weight_sync.engine is engine
    GRPOModule(model=small_model()).bind_engine(engine)  # no sync: nothing to bind


def test_counters_round_trip_through_a_checkpoint() -> None:
    module = GRPOModule(model=small_model())
    module.optimizer_steps, module.skipped_batches, module.own_version = 4, 2, 3
    ckpt: dict = {}
    module.on_save_checkpoint(ckpt)
    assert ckpt == {"grpo": {"optimizer_steps": 4, "skipped_batches": 2, "own_version": 3, "lora": None}}
    other = GRPOModule(model=small_model())
    other.on_load_checkpoint(ckpt)
    assert (other.optimizer_steps, other.skipped_batches, other.own_version) == (4, 2, 3)
    module.on_load_checkpoint({})  # a checkpoint from before the counters existed
    assert (module.optimizer_steps, module.skipped_batches, module.own_version) == (0, 0, 0)


def test_skipped_batches_are_counted_logged_and_reported(caplog) -> None:
    module = GRPOModule(model=small_model())
    opt = module.configure_optimizers()
    module.own_version = 3
    with caplog.at_level(logging.WARNING, logger="polar_pl.module.grpo"):
        m = module.update(None, opt)
    assert m == {
        "train/skipped": 1.0,
        "train/skipped_batches": 1.0,
        "train/optimizer_steps": 0.0,
        "train/policy_version": 3.0,
    }
    assert caplog.messages == ["skipped a batch: empty batch (1 skipped so far)"]
    flat = [row("a0", "a", 1.0, [(2, 5)], 6), row("a1", "a", 1.0, [(1, 4)], 5)]
    m = module.update(collate(flat, token_budget=16), opt)
    assert m["train/skipped_batches"] == 2.0 and m["train/filtered_groups_frac"] == 1.0
    assert caplog.messages[-1] == "skipped a batch: no trainable tokens (2 skipped so far)"
    assert module.skipped_batches == 2 and module.optimizer_steps == 0


def test_a_skipped_step_logs_nan_not_the_step_befores_values(tmp_path) -> None:
    """Lightning logs a key's last value again at a step that does not log it: a skipped step's
    row repeated the trained step's loss and logprob gap (a CI run read a push that never happened
    from it), and a skip's train/skipped stuck to every later row."""
    flat = [row("a0", "a", 1.0, [(2, 5)], 6), row("a1", "a", 1.0, [(1, 4)], 5)]  # no signal: skipped
    batches = [collate(ROWS, token_budget=16), collate(flat, token_budget=16), collate(ROWS, token_budget=16)]
    engine = Engine()
    module = GRPOModule(model=small_model(), weight_sync=Sync(), settings=GRPOSettings(lr=1e-2))
    fit(module, Batches(batches, engine), steps=2, logger=CSVLogger(tmp_path, name="", version=""))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["train/skipped"] for r in rows] == ["0.0", "1.0", "0.0"]
    assert [r["train/policy_version"] for r in rows] == ["1.0", "1.0", "2.0"]
    assert rows[1]["train/loss"] == rows[1]["train/logprob_gap_mean"] == "nan"
    assert all(math.isfinite(float(r["train/loss"])) for r in (rows[0], rows[2]))


def test_rollout_metrics_without_a_trainer() -> None:
    module = GRPOModule(model=small_model())
    assert module._rollout_metrics(None) == {}
    m = module._rollout_metrics(collate(ROWS, token_budget=16))
    assert m["rollout/reward_mean/mini"] == 0.5 and m["rollout/reward_std/other"] == pytest.approx(
        0.5 / 2**0.5
    )


def test_touch_all_is_zero_with_a_gradient_to_every_parameter() -> None:
    module = GRPOModule(model=small_model())
    params = [p for p in module.model.parameters() if p.requires_grad]
    out = module._touch_all()
    assert out.item() == 0.0
    out.backward()
    assert all(p.grad is not None and not p.grad.any() for p in params)


class Refusing(Engine):
    def update_weights_from_state_dict(self, state: dict[str, torch.Tensor]) -> int:
        raise ValueError("lm_head.weight: holds NaN or infinite values")


def test_a_refused_push_on_rank_zero_raises_on_every_rank() -> None:
    """Rank 0's refused push used to raise there alone: the other ranks waited in the version
    broadcast for ever. Rank 0 now broadcasts its error before raising, and every rank raises."""
    zero = on_ranks(GRPOModule(model=small_model(), weight_sync=Sync(Refusing())), 2, 0, strategy(object, -1))
    with pytest.raises(ValueError, match="NaN"):
        zero._push()
    (version, error), src = zero.trainer.strategy.sent
    assert version == -1 and src == 0 and "NaN" in error
    told = strategy(object, -1, error)
    one = on_ranks(GRPOModule(model=small_model(), weight_sync=Sync(Refusing())), 2, 1, told)
    with pytest.raises(RuntimeError, match="rank 0's weight push failed: ValueError: .*NaN"):
        one._push()
    assert one.own_version == 0


class Ranks:
    """Stands in for a multi-process Trainer (not under test): its world size, this process's
    rank and a strategy whose broadcast hands out rank 0's value."""

    def __init__(self, world_size: int, global_rank: int, strategy):
        self.world_size, self.global_rank, self.strategy = world_size, global_rank, strategy


def strategy(base: type, rank0_value: int, rank0_error: str | None = None):
    """Its broadcast hands out rank 0's (version, error) after a push and keeps what was sent."""

    class Strategy(base):
        def broadcast(self, obj, src=0):
            self.sent = (obj, src)
            return (rank0_value, rank0_error)

    return Strategy()


def on_ranks(module: GRPOModule, world: int, rank: int, strat=None) -> GRPOModule:
    module._trainer = Ranks(world, rank, strat if strat is not None else strategy(object, -1))
    return module


def test_micro_batches_are_shared_round_robin_with_padding() -> None:
    micros = [torch.tensor([i]) for i in range(5)]
    module = GRPOModule(model=small_model())
    assert module._share(micros) == (micros, 0)
    mine, pad = on_ranks(module, 2, 1)._share(micros)
    assert [int(m) for m in mine] == [1, 3] and pad == 1
    mine, pad = on_ranks(module, 2, 0)._share(micros)
    assert [int(m) for m in mine] == [0, 2, 4] and pad == 0
    mine, pad = on_ranks(module, 3, 2)._share(micros[:4])
    assert [int(m) for m in mine] == [2] and pad == 1


def test_only_rank_zero_asks_the_engine_its_version() -> None:
    engine = Engine(version=5)
    module = GRPOModule(model=small_model(), weight_sync=Sync(engine))
    module.own_version = 2
    assert module.current_version() == 5
    assert on_ranks(module, 2, 0).current_version() == 5
    assert on_ranks(module, 2, 1).current_version() == 2
    assert GRPOModule(model=small_model(), weight_sync=Sync()).current_version() == 0  # unbound


@pytest.mark.parametrize("sharded", [False, True])
def test_rank_zero_pushes_and_every_rank_learns_the_version(sharded) -> None:
    engine = Engine(version=3)
    zero = on_ranks(GRPOModule(model=small_model(), weight_sync=Sync(engine)), 2, 0, strategy(object, 4))
    assert zero._push() == 4 and zero.own_version == 4 and len(engine.pushed) == 1
    assert zero.trainer.strategy.sent == ((4, None), 0)
    one = on_ranks(GRPOModule(model=small_model(), weight_sync=Sync(engine)), 2, 1, strategy(object, 4))
    one.sharded = sharded
    gathered = []
    one.model.register_state_dict_post_hook(lambda *_: gathered.append(1))
    assert one._push() == 4 and one.own_version == 4 and len(engine.pushed) == 1
    assert one.trainer.strategy.sent == ((-1, None), 0)
    assert gathered == ([1] if sharded else [])  # a sharded model's ranks join the push's gathers
    alone = GRPOModule(model=small_model(), weight_sync=Sync(engine))
    assert alone._push() == 5 and alone.own_version == 0
