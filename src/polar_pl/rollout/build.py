"""A `RolloutRuntime` from a composed config (the training config's groups: harness, sandbox, task,
merge, engine, rollout, and the rollout settings of `datamodule:`). `training.build_parts` adds the
DataModule on top; `polar-pl rollout serve`, SFT generation and `polar-pl eval` use it as it is."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from polar_pl.engine.protocol import Engine
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.preflight import preflight
from polar_pl.rollout.local import LocalRollout
from polar_pl.rollout.runtime import RolloutRuntime
from polar_pl.tasks.task import Task

# The keys of `datamodule:` that configure the runtime (the rest are the DataModule's: batching,
# staleness, dynamic sampling, collation, logging). They stay under `datamodule:` in the config.
RUNTIME_KEYS = (
    "group_size", "pools", "max_groups_in_flight", "group_deadline_s", "options", "store_path",
    "gateway_options", "pause_on_push", "engine_down_s", "progress",
)  # fmt: skip
PRETRAINED = ("smollm2",)


def build_runtime(cfg: DictConfig, *, tasks: Sequence[Task] | None = None) -> RolloutRuntime:
    """Instantiate harness, sandbox factory, tasks, evaluator, merge builder, engine and backend into
    a runtime; the config is checked first (preflight.py: a warm-started model_dir must be built
    already, by `polar-pl warm-start`), and a missing pretrained model built before the engine.
    tasks: fed instead of the configured task source's (the rollout service's task queue)."""
    preflight(cfg)
    backend = instantiate(cfg.rollout) if cfg.get("rollout") else LocalRollout()
    harness = instantiate(cfg.harness)
    if cfg.get("pretrained"):
        ensure_pretrained_model(cfg)
    sandbox = instantiate(cfg.sandbox)
    source = instantiate(cfg.task)
    configured = source.tasks()
    evaluator = source.make_evaluator(sandbox)
    builder = instantiate(cfg.merge)
    # rollout=remote: the service runs the engine; the trainer holds a handle that pushes to it
    engine = backend.engine() or build_engine(cfg.engine)
    return RolloutRuntime(
        engine=engine,
        sandbox=sandbox,
        harness=harness,
        tasks=configured if tasks is None else tasks,
        evaluator=evaluator,
        builder=builder,
        backend=backend,
        **runtime_settings(cfg.datamodule),
    )


def runtime_settings(node: DictConfig) -> dict[str, Any]:
    """The runtime's keyword arguments in a `datamodule:` node; max_groups_in_flight null is
    2 x groups_per_step (rollouts for the next step overlap this one, no further)."""
    values = OmegaConf.to_container(node, resolve=True)
    assert isinstance(values, dict)
    settings = {str(k): values[k] for k in RUNTIME_KEYS if k in values}
    if settings.get("max_groups_in_flight") is None:
        settings["max_groups_in_flight"] = 2 * int(values.get("groups_per_step", 2))
    return settings


def build_engine(cfg: DictConfig) -> Engine:
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


def ensure_pretrained_model(cfg: DictConfig) -> None:
    """Build `model_dir` from the named pretrained model's offline source on first use."""
    from polar_pl.pretrained.smollm2 import build_smollm2

    if cfg.pretrained not in PRETRAINED:
        raise ValueError(f"pretrained={cfg.pretrained!r}: allowed values are {PRETRAINED} or null")
    if not (Path(cfg.model_dir) / "config.json").exists():
        print(f"polar-pl: building {cfg.pretrained} at {cfg.model_dir} (once, ~30 s)", flush=True)
        build_smollm2(cfg.model_dir, if_missing=True)
