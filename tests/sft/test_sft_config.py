"""conf/sft.yaml composes on the training groups; the accept rule and option checks."""

from __future__ import annotations

import pytest
import yaml
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from polar_pl.rollout.pools import FAILED, OK, TIMEOUT, RolloutResult
from polar_pl.sft.run import SFTOptions, resolved_config_yaml, verdict
from polar_pl.trajectory.rows import TrajectoryRow


def test_sft_config_reuses_the_training_groups(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POLAR_TINY_MODEL", str(tiny_model_dir))
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(
            config_name="sft", overrides=["harness=pi", "merge=per_request"], return_hydra_config=True
        )
    HydraConfig().set_config(cfg)
    resolved = yaml.safe_load(resolved_config_yaml(cfg))
    assert resolved["sft"]["output_dir"] == "outputs/sft/pi-builtin"  # stable: rerunning resumes
    assert resolved["datamodule"]["store_path"] == "outputs/sft/pi-builtin/traces.db"
    assert resolved["harness"]["_target_"] == "polar_pl.harness.pi.Pi"
    assert resolved["merge"]["_target_"].endswith("PerRequestBuilder")
    assert resolved["task"]["_target_"].endswith("BuiltinTaskSource")
    assert resolved["sft"]["tokenizer"] == str(tiny_model_dir)
    SFTOptions(**resolved["sft"])


def _result(status: str, reward: float, rows: int = 1) -> RolloutResult:
    row = TrajectoryRow([1, 2], [0, 1], [0.0, -0.1], [-1, 0], "s", "r", "g")
    return RolloutResult("r", "g", "t", status, reward, rows=(row,) * rows)


def test_only_ok_attempts_at_or_above_the_threshold_are_accepted():
    assert verdict(_result(OK, 1.0), 1.0) == "accepted"
    assert verdict(_result(OK, 0.8), 0.75) == "accepted"
    assert verdict(_result(OK, 0.5), 1.0) == "below_threshold"
    assert verdict(_result(OK, 1.0, rows=0), 1.0) == "no_rows"
    assert verdict(_result(TIMEOUT, 1.0), 1.0) == TIMEOUT
    assert verdict(_result(FAILED, 1.0), 1.0) == FAILED


def test_bad_options_name_the_key():
    with pytest.raises(ValueError, match="sft.max_groups=0"):
        SFTOptions(output_dir="x", max_groups=0, tokenizer="t")
    with pytest.raises(ValueError, match="sft.tokenizer"):
        SFTOptions(output_dir="x")
