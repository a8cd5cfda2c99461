"""`polar-pl warm-start [group=option ...]`: build the warm-started model that `python train.py`
with the same overrides trains from (its config's `warm_start` and `model_dir`).

    polar-pl warm-start experiment=cli_sanity harness=pi   # the CLI learning check's (~2 CPU min)
    polar-pl warm-start experiment=multiturn               # the multi-turn check's (~1 CPU min)
    polar-pl warm-start experiment=cli_tiny harness=pi     # pi's, inside its request (~3 CPU min,
                                                           # +3 for the generic warm start, once)

A config without `warm_start`, or whose model_dir is built (for its harness.extra_args: train.py's
own check), is a no-op that prints nothing in a second: `make train` runs this before every
train.py. With `-m`, each run of a sweep gets its model.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, open_dict
from omegaconf.errors import OmegaConfBaseException

from polar_pl.preflight import check_warm_model

MULTIRUN = ("-m", "--multirun")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--multirun", action="store_true", help="a sweep: build each run's model")
    parser.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="train.py's Hydra overrides (conf/config.yaml)"
    )


def run(args: argparse.Namespace) -> int:
    overrides = [o for o in args.overrides if o not in MULTIRUN]
    try:
        for job in sweep(overrides):
            cfg = compose_config(job)
            if not cfg.get("warm_start"):
                continue
            if (Path(cfg.model_dir) / "config.json").exists():
                check_warm_model(cfg)  # built for this run (train.py's own check), without loading torch
                continue
            from polar_pl.warmstart.models import ensure_warm_model

            ensure_warm_model(cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def sweep(overrides: Sequence[str]) -> list[list[str]]:
    """The override lists of each run of a sweep (`harness=pi,claude_code`: two runs), as Hydra's
    basic sweeper forms them; one list when nothing sweeps."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    choices = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [line]
        for line, o in zip(overrides, parsed, strict=True)
    ]
    return [list(job) for job in itertools.product(*choices)]


def compose_config(overrides: Sequence[str]) -> DictConfig:
    """The training config as `python train.py OVERRIDES` composes it, with Hydra's run-time values
    (the cwd, the group choices) set, so that `${hydra:runtime.choices.harness}` resolves."""
    with initialize_config_module(config_module="polar_pl.conf", version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.cwd = os.getcwd()
    HydraConfig().set_config(cfg)
    return cfg
