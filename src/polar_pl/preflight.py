"""Checks on a composed config that need nothing heavy (no torch, no Lightning, no engine): a run
that cannot work stops within seconds of `python train.py`, in one line naming the setting and the
fix (`ConfigError`), instead of failing every rollout minutes later.

`train.py` calls `preflight` before it imports the trainer; `training.build_parts` calls it again
for the other entry points (SFT generation, `polar-pl rollout serve`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from polar_pl.errors import ConfigError
from polar_pl.sandbox.image import default_harness_prefix


def preflight(cfg: DictConfig) -> None:
    """Every check below, on the run's config."""
    if _sessions_run_here(cfg):
        check_harness_prefix(instantiate(cfg.harness), cfg.sandbox)


def check_harness_prefix(harness: Any, sandbox_cfg: DictConfig) -> None:
    """A CLI harness runs from the harness prefix its sandbox mounts, and a sandbox leaves a missing
    prefix out (bwrap and Docker refuse to mount it), so every rollout would fail alike. The
    harness knows what it needs (`prefix_problem`); the sandbox config says where it is."""
    given = sandbox_cfg.get("harness_prefix")
    prefix = None if given == "" else default_harness_prefix(given)  # "": no CLIs (sandbox=docker)
    problem = harness.prefix_problem(Path(prefix) if prefix else None)
    if problem is not None:
        where = prefix or ".cache/harness"
        raise ConfigError(
            f"sandbox.harness_prefix (POLAR_HARNESS_PREFIX) {problem}: harness={harness.name} runs its CLI "
            f"from there; install it with `polar-pl harness install {harness.name} --prefix {where}` and "
            f"set POLAR_HARNESS_PREFIX={where}"
        )


def _sessions_run_here(cfg: DictConfig) -> bool:
    """rollout=local and a one-node Ray (`address: local`) run their sandboxes on this machine.
    rollout=remote (a `url`) runs them in a service that checks its own config; a Ray cluster's
    nodes may hold the prefix where this machine does not (one without it fails its rollouts,
    and the run stops by fail-fast: datamodule/failfast.py)."""
    rollout = cfg.get("rollout") or {}
    return "url" not in rollout and rollout.get("address", "local") == "local"
