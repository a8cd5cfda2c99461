"""`python -m polar_pl.eval [group=option ...] [eval.key=value ...]` (also `polar-pl eval ...`):
the held-out evaluation on the Hydra config conf/eval.yaml (the training groups).

    polar-pl eval experiment=smollm2_arith                                # the base model
    polar-pl eval experiment=smollm2_arith model_dir=outputs/.../model eval.label=trained \\
        eval.compare=outputs/eval/base                                    # + the paired difference
    polar-pl eval experiment=smollm2_tools harness=pi eval.ckpt_path=outputs/.../last.ckpt
"""

from __future__ import annotations

import logging
import os

import hydra
from omegaconf import DictConfig

from polar_pl.errors import ConfigError, RunFailed
from polar_pl.eval.app import evaluate

log = logging.getLogger("polar_pl.eval")

CONF = os.environ.get("POLAR_CONF_DIR") or "pkg://polar_pl.conf"


@hydra.main(version_base=None, config_path=CONF, config_name="eval")
def main(cfg: DictConfig) -> float:
    try:
        report = evaluate(cfg)
    except (ConfigError, RunFailed) as exc:
        log.error("%s", exc)
        raise SystemExit(1) from None
    return report.estimates[min(report.estimates)].mean


if __name__ == "__main__":
    main()
