"""RolloutServer: a `RolloutRuntime`'s engine and rollouts, started for serving over HTTP instead
of feeding a Lightning trainer. Built from the same Hydra config as training (`rollout=local` or
`ray`, any harness, sandbox, task source, engine with replicas: `rollout.build.build_runtime`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from polar_pl.rollout.protocol import RolloutClient
from polar_pl.rollout.runtime import RolloutRuntime
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


def feed_tasks(feed: str) -> TaskQueue | None:
    """The tasks a `--feed` serves instead of the configured source's: `config` (None: groups from
    the configured task source, continuously, as in training) or `queue` (a `TaskQueue`: only tasks
    submitted with POST /v1/tasks, one group each)."""
    if feed not in FEEDS:
        raise ValueError(f"rollout serve --feed {feed!r}: allowed values are {', '.join(FEEDS)}")
    return TaskQueue() if feed == "queue" else None


class RolloutServer:
    """The HTTP service's view of a runtime: its client once started, task rows read into tasks,
    the policy version, weight pushes. A runtime built with a `TaskQueue` (`feed_tasks("queue")`)
    takes tasks from POST /v1/tasks."""

    def __init__(self, runtime: RolloutRuntime) -> None:
        self.runtime = runtime
        self._client: RolloutClient | None = None

    @property
    def client(self) -> RolloutClient:
        """The runtime's rollout client: the routes serve only once the service started."""
        if self._client is None:
            raise RuntimeError("the rollout service is not started")
        return self._client

    def start(self) -> RolloutServer:
        self._client = self.runtime.start().rollouts()
        return self

    def stop(self) -> None:
        """Rollouts, engine, evaluator and sandbox hosts: the end of the service."""
        self.runtime.close()

    def tasks_from_rows(self, rows: Sequence[dict[str, Any]]) -> list[Task]:
        return [task_from_row(r, origin=f"POST /v1/tasks[{i}]") for i, r in enumerate(rows)]

    def policy_version(self) -> int:
        return self.runtime.policy_version()

    def push_from_disk(self, path: str) -> int:
        """New weights into every engine replica, gateways paused meanwhile; the new version."""
        p = Path(path)
        if not p.is_dir() or not any(p.glob("*.safetensors")):
            raise FileNotFoundError(f"{path!r} is not a directory holding *.safetensors")
        return int(self.runtime.push_target().update_weights_from_disk(str(p)))
