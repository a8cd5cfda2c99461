"""Training entry point (Hydra): `python train.py [group=option ...]`, sweeps with `-m`.

python train.py                                   # experiment=first_run: SmolLM2-135M-Instruct, mini harness
python train.py experiment=tiny                   # the plumbing check on the tiny model
python train.py experiment=cli_tiny harness=claude_code
python train.py -m experiment=cli_tiny harness=claude_code,codex,qwen_code,pi
python train.py experiment=smollm2_arith          # the real model's longer run, held-out eval
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from polar_pl.errors import ConfigError, RunFailed
from polar_pl.preflight import preflight

log = logging.getLogger("polar_pl.train")


@hydra.main(version_base=None, config_path="pkg://polar_pl.conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    try:
        preflight(cfg)  # in seconds: a config that cannot work stops before torch and Lightning load
        from polar_pl.training import train

        metrics = train(cfg)
    except (ConfigError, RunFailed) as exc:  # why the run cannot go on: its last line, exit 1
        log.error("%s", exc)
        raise SystemExit(1) from None
    return metrics.get("rollout/reward_mean")


if __name__ == "__main__":
    main()
