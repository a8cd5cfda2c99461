"""What `python train.py` does with a composed config: build every part from its group, train,
and tear everything down in `finally` (engine, gateway, pools, sandboxes, loggers)."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from polar_pl.datamodule.datamodule import CommitBatches, RolloutDataModule
from polar_pl.datamodule.progress import LiveProgress
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.monitor.noise import quiet


def build_parts(cfg: DictConfig) -> dict[str, Any]:
    """Instantiate harness, sandbox factory, tasks, evaluator, merge builder, engine, datamodule."""
    harness = instantiate(cfg.harness)
    sandbox = instantiate(cfg.sandbox)
    source = instantiate(cfg.task)
    tasks = source.tasks()
    evaluator = source.make_evaluator(sandbox)
    builder = instantiate(cfg.merge)
    engine = build_engine(cfg.engine)
    rollout = instantiate(cfg.rollout) if cfg.get("rollout") else None
    datamodule: RolloutDataModule = instantiate(cfg.datamodule)(
        engine=engine, sandbox=sandbox, harness=harness, tasks=tasks, evaluator=evaluator, builder=builder,
        rollout=rollout,
    )
    return {
        "harness": harness,
        "sandbox": sandbox,
        "tasks": tasks,
        "evaluator": evaluator,
        "engine": engine,
        "datamodule": datamodule,
    }


def build_engine(cfg: DictConfig) -> Any:
    """The `engine` group's handle; `engine.replicas: N` > 1 puts N of them behind one handle."""
    node = copy.deepcopy(cfg)
    with open_dict(node):
        n = int(node.pop("replicas", 1) or 1)
    if n == 1:
        return instantiate(node)
    if n < 1 or node.get("port") is not None or node.get("url") is not None:
        raise ValueError(f"engine.replicas={n}: needs engine.port=null and engine.url=null (each replica "
                         "is launched on a free port)")  # fmt: skip
    return EngineReplicas([instantiate(node) for _ in range(n)])


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit GRPO on rollouts; returns the final logged metrics."""
    quiet()
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("warm_start"):  # a CLI harness's model: warm-started inside that CLI's request
        from polar_pl.tinymodel.build import ensure_harness_model

        ws = cfg.warm_start
        ensure_harness_model(
            cfg.model_dir, ws.harness, cfg.model_cache, cfg.sandbox.get("harness_prefix"), ws.minutes
        )
    parts = build_parts(cfg)
    dm: RolloutDataModule = parts["datamodule"]
    loggers = [instantiate(c) for c in cfg.logger.values()] if cfg.get("logger") else []
    try:
        module = instantiate(cfg.module)
        # CommitBatches after the configured callbacks: Lightning moves checkpointing last, so a
        # checkpoint always holds the batch just committed.
        callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
        trainer: L.Trainer = instantiate(cfg.trainer, logger=loggers, callbacks=[*callbacks, CommitBatches()])
        for lg in loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        with LiveProgress(dm.live_metrics, title="rollouts") if dm.progress else nullcontext():
            trainer.fit(module, datamodule=dm, ckpt_path=cfg.get("ckpt_path"))
        return {k: float(v) for k, v in trainer.logged_metrics.items()}
    finally:
        dm.teardown()
        for part in ("evaluator", "sandbox"):  # the evaluator first: its sandboxes use the factory's hosts
            close = getattr(parts[part], "close", None)
            if close is not None:
                close()
        for lg in loggers:
            finalize = getattr(lg, "finalize", None)
            if finalize is not None:
                finalize("success")
        try:
            import wandb

            if wandb.run is not None:
                wandb.finish()
        except ImportError:
            pass
