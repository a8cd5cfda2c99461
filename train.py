"""Training entry point (Hydra): `python train.py [group=option ...]`, sweeps with `-m`.

    python train.py                                   # CPU default: tiny model, mini harness
    python train.py harness=claude_code merge=prefix
    python train.py -m harness=claude_code,codex,qwen_code,pi
    python train.py experiment=sanity                 # the learning-sanity run
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from polar_pl.training import train


@hydra.main(version_base=None, config_path="pkg://polar_pl.conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    return metrics.get("rollout/reward_mean")


if __name__ == "__main__":
    main()
