"""`python -m polar_pl.sft [group=option ...] [sft.key=value ...]`: the SFT generation command on
the Hydra config conf/sft.yaml (same groups as training). Running the same command again resumes
an interrupted run from its output directory.

    python -m polar_pl.sft                                    # CPU default: tiny model, built-in tasks
    python -m polar_pl.sft harness=pi task=builtin engine=vllm datamodule.group_size=8
    python -m polar_pl.sft task=swebench task.data_files=swe-gym.jsonl sft.output_dir=data/swegym
"""

from __future__ import annotations

import os

import hydra
from omegaconf import DictConfig

from polar_pl.sft.run import generate

# The package's configs (polar_pl/conf, the checkout's conf/); POLAR_CONF_DIR or Hydra's
# --config-dir override them.
CONF = os.environ.get("POLAR_CONF_DIR") or "pkg://polar_pl.conf"


@hydra.main(version_base=None, config_path=CONF, config_name="sft")
def main(cfg: DictConfig) -> float:
    stats = generate(cfg)
    print(
        f"sft: {stats['accepted']}/{stats['attempts']} attempts accepted "
        f"({stats['acceptance_rate']:.1%}), {stats['token_rows']} token rows, "
        f"groups {stats['groups_done']}/{stats['groups_total']} -> {cfg.sft.output_dir}"
    )
    return float(stats["acceptance_rate"])


if __name__ == "__main__":
    main()
