"""RolloutServer: a RolloutDataModule's engine and rollouts, started for serving over HTTP instead
of feeding a Lightning trainer. Built from the same Hydra config as training (`rollout=local` or
`ray`, any harness, sandbox, task source, engine with replicas)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from polar_pl.rollout.protocol import RolloutClient
from polar_pl.rollout.tasks import TaskQueue
from polar_pl.tasks.task import Task, task_from_row

FEEDS = ("config", "queue")
# The package's config groups (polar_pl/conf, as train.py uses them); POLAR_CONF_DIR overrides it.
CONF = os.environ.get("POLAR_CONF_DIR") or str(Path(__file__).resolve().parents[2] / "conf")


def compose_config(overrides: Sequence[str], run_dir: str | Path) -> DictConfig:
    """The training config (conf/config.yaml + overrides), with Hydra's run-time paths set to
    `run_dir` as `python train.py` would have them."""
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(Path(run_dir).resolve())
        cfg.hydra.runtime.cwd = os.getcwd()
        cfg.hydra.job.name = "rollout"
    HydraConfig().set_config(cfg)
    return cfg


class RolloutServer:
    """feed: `config` (groups from the configured task source, continuously, as in training) or
    `queue` (only tasks submitted with POST /v1/tasks, one group each)."""

    def __init__(self, datamodule: Any, *, feed: str = "config") -> None:
        if feed not in FEEDS:
            raise ValueError(f"rollout serve --feed {feed!r}: allowed values are {', '.join(FEEDS)}")
        if feed == "queue":
            datamodule.tasks = TaskQueue()
        self.dm, self.feed = datamodule, feed
        self.client: RolloutClient | None = None

    def start(self) -> RolloutServer:
        self.dm.setup()
        self.client = self.dm.rollouts()
        return self

    def stop(self) -> None:
        self.dm.teardown()

    def tasks_from_rows(self, rows: Sequence[dict[str, Any]]) -> list[Task]:
        return [task_from_row(r, origin=f"POST /v1/tasks[{i}]") for i, r in enumerate(rows)]

    def policy_version(self) -> int:
        return int(self.dm.engine.policy_version())

    def push_from_disk(self, path: str) -> int:
        """New weights into every engine replica, gateways paused meanwhile; the new version."""
        p = Path(path)
        if not p.is_dir() or not any(p.glob("*.safetensors")):
            raise FileNotFoundError(f"{path!r} is not a directory holding *.safetensors")
        return int(self.dm.push_target().update_weights_from_disk(str(p)))
