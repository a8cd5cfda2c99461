"""Checks on a composed config that need nothing heavy (no torch, no Lightning, no engine): a run
that cannot work stops within seconds of `python train.py`, in one line naming the setting and the
fix (`ConfigError`), instead of failing every rollout minutes later.

`train.py` calls `preflight` before it imports the trainer; `training.build_parts` calls it again
for the other entry points (SFT generation, `polar-pl rollout serve`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from polar_pl.errors import ConfigError
from polar_pl.pretrained.smollm2 import BUILD_RECORD as PRETRAINED_RECORD  # also the tool cold start's
from polar_pl.sandbox.image import default_harness_prefix

# What a tiny model's folder records about its build (polar_pl/tinymodel/build.py), read without
# importing it: that module loads torch.
BUILD_RECORD = "tinymodel.json"  # a tiny model's (tinymodel/build.py)


# Weight syncs that cannot send a LoRA adapter alone (module/weight_sync.py's `pushes_adapters`),
# named here so that the check needs no torch.
ADAPTERLESS_SYNCS = ("polar_pl.module.weight_sync.VLLMWeightTransferSync",)
# Weight syncs that read whole parameters, so cannot push a sharded model (trainer.strategy=fsdp).
UNSHARDED_SYNCS = ("polar_pl.module.weight_sync.VLLMWeightTransferSync",)
# SmolLM2-135M-Instruct's (hidden_size, layers, vocab): its recipes refuse another model (an export of
# a SmolLM2 run has the same shape and passes).
SMOLLM2_SHAPE = (576, 30, 49152)
# What each CLI harness can train on instead of the untrained tiny model.
REAL_CLI_RECIPES = {"pi": "python train.py experiment=smollm2_tools"}


def preflight(cfg: DictConfig) -> None:
    """Every check below, on the run's config."""
    # by its class: a recipe's settings for another harness (mini's `tools`) would fail its init
    harness_class: Any = get_class(cfg.harness._target_)
    check_recipe(cfg, harness_class.name)
    harness = instantiate(cfg.harness)
    if _sessions_run_here(cfg):
        check_harness_prefix(harness, cfg.sandbox)
    if cfg.get("warm_start"):
        check_warm_model(cfg)


def check_recipe(cfg: DictConfig, harness: str) -> None:
    """Combinations of groups that start but cannot train anything, or not what was asked for:
    each is refused in one line naming the keys and what to run instead."""
    tiny = is_generic_tiny_model(cfg)
    if tiny and harness != "mini":
        raise ConfigError(
            f"harness={harness} on the untrained tiny model (model_dir {cfg.model_dir}) trains nothing: it "
            f"cannot act behind a CLI's prompt. {_through_cli(harness)}"
        )
    fits = cfg.get("fits_harnesses")
    if fits and harness not in fits:
        raise ConfigError(
            f"harness={harness} with experiment={cfg.get('recipe')}, a recipe made for harness "
            f"{'|'.join(fits)} (its model has not learnt {harness}'s tools). {_through_cli(harness)}"
        )
    accelerator = str(cfg.get("trainer", {}).get("accelerator", "cpu"))
    if tiny and accelerator in ("gpu", "cuda"):
        raise ConfigError(
            f"trainer.accelerator={accelerator} on the untrained tiny model (model_dir {cfg.model_dir}): "
            "set model_dir to a real model and its recipe (an experiment, or ~experiment)"
        )
    if cfg.get("recipe") == "tiny" and not tiny:
        raise ConfigError(
            f"experiment=tiny is the tiny model's recipe (lr {cfg.module.get('lr')}, its task and sizes), "
            f"not for model_dir {cfg.model_dir}: pick a recipe for that model (experiment=...) or "
            "~experiment to keep the groups' own values"
        )
    if cfg.get("pretrained") == "smollm2" and (shape := _model_shape(cfg.model_dir)) not in (
        None,
        SMOLLM2_SHAPE,
    ):
        raise ConfigError(
            f"experiment={cfg.get('recipe')} is SmolLM2-135M-Instruct's recipe (lr {cfg.module.get('lr')}, its "
            f"sizes), not for model_dir {cfg.model_dir} (hidden_size, layers, vocab {shape}): pick a recipe for "
            "that model (experiment=gpu, ...) or ~experiment to keep the groups' own values"
        )
    engine = cfg.get("engine", {})
    if accelerator in ("gpu", "cuda") and engine.get("device") == "cpu":
        raise ConfigError(
            f"trainer.accelerator={accelerator} with engine.device=cpu: every push would copy the weights "
            "off the GPU and sampling would run on the CPU; set engine.device=null (the GPU) or trainer=cpu"
        )
    module = cfg.get("module", {})
    sync = (module.get("weight_sync") or {}).get("_target_")
    if (module.get("lora") or {}).get("rank") and sync in ADAPTERLESS_SYNCS:
        raise ConfigError(
            f"module.lora.rank={module.lora.rank} with module/weight_sync={sync.rsplit('.', 1)[-1]}, which "
            "cannot push an adapter alone: use module/weight_sync=embedded, disk or none"
        )
    if _sharded(cfg.get("trainer", {})) and sync in UNSHARDED_SYNCS:
        raise ConfigError(
            f"trainer.strategy=fsdp with module/weight_sync={sync.rsplit('.', 1)[-1]}, which reads whole "
            "parameters: use module/weight_sync=disk (written from the shards as they are gathered)"
        )


def _model_shape(model_dir: str) -> tuple[int, int, int] | None:
    """(hidden_size, layers, vocab) of an HF folder's config.json; None if there is none yet."""
    path = Path(model_dir) / "config.json"
    if not path.exists():
        return None
    c = json.loads(path.read_text(encoding="utf-8"))
    return (c.get("hidden_size"), c.get("num_hidden_layers"), c.get("vocab_size"))


def _through_cli(harness: str) -> str:
    """What trains through `harness` instead: its real-model recipe, or the plumbing check."""
    real = REAL_CLI_RECIPES.get(harness)
    instead = (
        f"`{real}` (SmolLM2-135M-Instruct, cold-started inside {harness}'s own request, then GRPO)"
        if real
        else f"the real-model recipe through a CLI, `{REAL_CLI_RECIPES['pi']}` (pi; none for {harness} yet)"
    )
    return (
        f"Run {instead}, or `python train.py experiment=cli_tiny harness={harness}` for the plumbing check "
        "on a tiny model warm-started inside that CLI"
    )


def _sharded(trainer: Any) -> bool:
    """Whether the trainer's strategy shards the model (module/sharding.py), by name or target."""
    strategy = trainer.get("strategy")
    if isinstance(strategy, str):
        return strategy == "fsdp"
    return (
        isinstance(strategy, DictConfig)
        and strategy.get("_target_") == "polar_pl.module.sharding.FSDPStrategy"
    )


def is_generic_tiny_model(cfg: DictConfig) -> bool:
    """Whether the run trains the tiny model as `polar-pl tiny-model` builds it (no warm start): a
    plumbing model that has never seen a chat, let alone a CLI's prompt."""
    if cfg.get("warm_start") or cfg.get("pretrained"):
        return False
    model_dir = Path(cfg.model_dir)
    record = model_dir / BUILD_RECORD
    if record.exists():
        return "base" not in json.loads(record.read_text())  # a warm-started one names its base
    return not (model_dir / "config.json").exists() and model_dir.name == "tiny-model"


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


def check_warm_model(cfg: DictConfig) -> None:
    """A config with `warm_start` (a learning check's, a CLI's tiny-model recipe) trains a tiny
    model fine-tuned for it, which `polar-pl warm-start` builds before the run: a run never builds
    one (minutes of CPU; a CLI's is trained inside that CLI's request). Refused: the model missing,
    or, for a CLI, one built inside the request of other `harness.extra_args`."""
    model_dir = Path(cfg.model_dir)
    command = shlex.join(["polar-pl", "warm-start", *_overrides()])
    if not (model_dir / "config.json").exists():
        raise ConfigError(
            f"model_dir {model_dir} has no model: this config (warm_start) trains a warm-started tiny "
            f"model that the run does not build; build it once (minutes of CPU) with `{command}`"
        )
    if cfg.warm_start.get("harness"):
        records = [
            model_dir / name for name in (BUILD_RECORD, PRETRAINED_RECORD) if (model_dir / name).exists()
        ]
        built = json.loads(records[0].read_text()).get("harness_extra_args", []) if records else []
        wanted = list(cfg.harness.get("extra_args") or [])
        if built != wanted:
            raise ConfigError(
                f"model_dir {model_dir} was warm-started inside a CLI request with harness.extra_args "
                f"{built}, not this run's {wanted}: point model_dir elsewhere (or delete it) and build it "
                f"with `{command}`"
            )


def _overrides() -> list[str]:
    """The run's command-line overrides (`experiment=cli_sanity harness=pi`), when Hydra composed it."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _sessions_run_here(cfg: DictConfig) -> bool:
    """rollout=local and a one-node Ray (`address: local`) run their sandboxes on this machine.
    rollout=remote (a `url`) runs them in a service that checks its own config; a Ray cluster's
    nodes may hold the prefix where this machine does not (one without it fails its rollouts,
    and the run stops by fail-fast: datamodule/failfast.py)."""
    rollout = cfg.get("rollout") or {}
    return "url" not in rollout and rollout.get("address", "local") == "local"
