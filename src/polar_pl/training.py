"""What `python train.py` does with a composed config: sweep what killed runs of the same sandbox
owner left behind, build every part from its group, train, and tear everything down in `finally`
(engine, gateway, pools, sandboxes, loggers). SIGTERM / SIGINT end the run promptly (shutdown.py):
a checkpoint, loggers finalised as "killed", exit code 128 + the signal."""

from __future__ import annotations

import copy
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from polar_pl.datamodule.datamodule import CommitBatches, RolloutDataModule
from polar_pl.module.sharding import trainer_strategy
from polar_pl.monitor.noise import quiet
from polar_pl.monitor.progress import LiveProgress
from polar_pl.rollout.build import RUNTIME_KEYS, build_runtime
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.shutdown import GracefulShutdown

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Parts:
    """What a training run is built from: the rollout runtime (engine, harness, sandbox factory,
    tasks, evaluator, merge builder, rollout backend) and the DataModule that owns it in training."""

    runtime: RolloutRuntime
    datamodule: RolloutDataModule


def build_parts(cfg: DictConfig) -> Parts:
    """The runtime from its groups (`rollout.build.build_runtime`: the config checked first, a
    missing pretrained model built before the engine), then the DataModule around it from the
    rest of `datamodule:`."""
    runtime = build_runtime(cfg)
    node = copy.deepcopy(cfg.datamodule)  # still under the root: `${steps}` resolves
    with open_dict(node):
        for key in RUNTIME_KEYS:
            node.pop(key, None)
    datamodule: RolloutDataModule = instantiate(node)(runtime=runtime)
    return Parts(runtime, datamodule)


def sweep_leftovers(cfg: DictConfig) -> None:
    """Remove the sandboxes, cgroups and processes that runs of this sandbox owner left when they
    were killed (only those whose process is gone: a run still going keeps its sandboxes)."""
    from polar_pl.sandbox.sweep import sweep

    owner = cfg.sandbox.get("owner")
    report = sweep(owner, dead_only=True)
    if not report.empty:
        log.info("swept what earlier runs of sandbox owner %r left: %s", owner, report)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit GRPO on rollouts; returns the final logged metrics. Raises SystemExit(128 + signal)
    when SIGTERM / SIGINT stopped the run."""
    quiet()
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    sweep_leftovers(cfg)
    built = _Built()
    loggers: list = []
    checkpoint = Path(cfg.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    shutdown = GracefulShutdown(built, checkpoint, **cfg.get("shutdown", {}))
    shutdown.install()  # from here on: a signal while the run is still being built unwinds it
    try:
        built.parts = build_parts(cfg)
        loggers = [instantiate(c) for c in cfg.logger.values()] if cfg.get("logger") else []
        return _fit(cfg, built.parts, loggers, shutdown)
    finally:
        _teardown(built.parts, loggers, shutdown)


def _fit(cfg: DictConfig, parts: Parts, loggers: list, shutdown: GracefulShutdown) -> dict[str, float]:
    module = instantiate(cfg.module)
    # CommitBatches after the configured callbacks: Lightning moves checkpointing last, so a
    # checkpoint always holds the batch just committed.
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        logger=loggers,
        callbacks=[*callbacks, CommitBatches(), shutdown],
        **trainer_strategy(cfg.trainer.get("strategy")),
    )
    for lg in loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    runtime = parts.runtime
    with LiveProgress(runtime.live_metrics, title="rollouts") if runtime.progress else nullcontext():
        trainer.fit(module, datamodule=parts.datamodule, ckpt_path=cfg.get("ckpt_path"))
    return {k: float(v) for k, v in trainer.logged_metrics.items()}


def _teardown(parts: Parts | None, loggers: list, shutdown: GracefulShutdown) -> None:
    """Everything the run started, in order, whatever ended it; then the exit a signal asks for."""
    try:
        if parts is not None:
            parts.runtime.close()  # rollouts, engine, then the evaluator and the sandbox hosts
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


class _Built:
    """The parts once they exist: a signal may come while they are still being built."""

    parts: Parts | None = None

    def interrupt(self, harness_grace_s: float) -> None:
        if self.parts is not None:
            self.parts.runtime.interrupt(harness_grace_s)
