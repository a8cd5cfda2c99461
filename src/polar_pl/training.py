"""What `python train.py` does with a composed config: sweep what killed runs of the same sandbox
owner left behind, build every part from its group, train, and tear everything down in `finally`
(engine, gateway, pools, sandboxes, loggers). SIGTERM / SIGINT end the run promptly (shutdown.py):
a checkpoint, loggers finalised as "killed", exit code 128 + the signal."""

from __future__ import annotations

import copy
import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from polar_pl.datamodule.datamodule import CommitBatches, RolloutDataModule
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.monitor.noise import quiet
from polar_pl.monitor.progress import LiveProgress
from polar_pl.preflight import preflight
from polar_pl.rollout.local import LocalRollout
from polar_pl.shutdown import GracefulShutdown

log = logging.getLogger(__name__)


def build_parts(cfg: DictConfig) -> dict[str, Any]:
    """Instantiate harness, sandbox factory, tasks, evaluator, merge builder, engine, datamodule;
    the config is checked first (preflight.py: a warm-started model_dir must be built already, by
    `polar-pl warm-start`), and a missing pretrained model built before the engine."""
    preflight(cfg)
    rollout = instantiate(cfg.rollout) if cfg.get("rollout") else LocalRollout()
    harness = instantiate(cfg.harness)
    if cfg.get("pretrained"):
        ensure_pretrained_model(cfg)
    sandbox = instantiate(cfg.sandbox)
    source = instantiate(cfg.task)
    tasks = source.tasks()
    evaluator = source.make_evaluator(sandbox)
    builder = instantiate(cfg.merge)
    # rollout=remote: the service runs the engine; the trainer holds a handle that pushes to it
    engine = rollout.engine() or build_engine(cfg.engine)
    datamodule: RolloutDataModule = instantiate(cfg.datamodule)(
        engine=engine,
        sandbox=sandbox,
        harness=harness,
        tasks=tasks,
        evaluator=evaluator,
        builder=builder,
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


def sweep_leftovers(cfg: DictConfig) -> None:
    """Remove the sandboxes, cgroups and processes that runs of this sandbox owner left when they
    were killed (only those whose process is gone: a run still going keeps its sandboxes)."""
    from polar_pl.sandbox.sweep import sweep

    owner = cfg.sandbox.get("owner")
    report = sweep(owner, dead_only=True)
    if not report.empty:
        log.info("swept what earlier runs of sandbox owner %r left: %s", owner, report)


PRETRAINED = ("smollm2",)


def ensure_pretrained_model(cfg: DictConfig) -> None:
    """Build `model_dir` from the named pretrained model's offline source on first use."""
    from polar_pl.pretrained.smollm2 import build_smollm2

    if cfg.pretrained not in PRETRAINED:
        raise ValueError(f"pretrained={cfg.pretrained!r}: allowed values are {PRETRAINED} or null")
    if not (Path(cfg.model_dir) / "config.json").exists():
        print(f"polar-pl: building {cfg.pretrained} at {cfg.model_dir} (once, ~30 s)", flush=True)
        build_smollm2(cfg.model_dir, if_missing=True)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit GRPO on rollouts; returns the final logged metrics. Raises SystemExit(128 + signal)
    when SIGTERM / SIGINT stopped the run."""
    quiet()
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    sweep_leftovers(cfg)
    parts: dict[str, Any] = {}
    loggers: list = []
    checkpoint = Path(cfg.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    shutdown = GracefulShutdown(_Deferred(parts), checkpoint, **cfg.get("shutdown", {}))
    shutdown.install()  # from here on: a signal while the run is still being built unwinds it
    try:
        parts.update(build_parts(cfg))
        loggers = [instantiate(c) for c in cfg.logger.values()] if cfg.get("logger") else []
        return _fit(cfg, parts["datamodule"], loggers, shutdown)
    finally:
        _teardown(parts, loggers, shutdown)


def _fit(
    cfg: DictConfig, dm: RolloutDataModule, loggers: list, shutdown: GracefulShutdown
) -> dict[str, float]:
    module = instantiate(cfg.module)
    # CommitBatches after the configured callbacks: Lightning moves checkpointing last, so a
    # checkpoint always holds the batch just committed.
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    trainer: L.Trainer = instantiate(
        cfg.trainer, logger=loggers, callbacks=[*callbacks, CommitBatches(), shutdown]
    )
    for lg in loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    with LiveProgress(dm.live_metrics, title="rollouts") if dm.progress else nullcontext():
        trainer.fit(module, datamodule=dm, ckpt_path=cfg.get("ckpt_path"))
    return {k: float(v) for k, v in trainer.logged_metrics.items()}


def _teardown(parts: dict[str, Any], loggers: list, shutdown: GracefulShutdown) -> None:
    """Everything the run started, in order, whatever ended it; then the exit a signal asks for."""
    try:
        if "datamodule" in parts:
            parts["datamodule"].teardown()
        for part in ("evaluator", "sandbox"):  # the evaluator first: its sandboxes use the factory's hosts
            close = getattr(parts.get(part), "close", None)
            if close is not None:
                close()
        status = "success" if shutdown.signum is None else "killed"
        for lg in loggers:
            finalize = getattr(lg, "finalize", None)
            if finalize is not None:
                finalize(status)
        try:
            import wandb

            if wandb.run is not None:
                wandb.finish(exit_code=shutdown.exit_code or 0)
        except ImportError:
            pass
    finally:
        shutdown.uninstall()
    if shutdown.signum is not None:
        took = time.monotonic() - shutdown.t0
        log.warning("stopped by a signal: finished %.1f s after it, exit code %d", took, shutdown.exit_code)
        raise SystemExit(shutdown.exit_code)


class _Deferred:
    """The datamodule once it exists: a signal may come while the parts are still being built."""

    def __init__(self, parts: dict[str, Any]) -> None:
        self.parts = parts

    def interrupt(self, harness_grace_s: float) -> None:
        dm = self.parts.get("datamodule")
        if dm is not None:
            dm.interrupt(harness_grace_s)
