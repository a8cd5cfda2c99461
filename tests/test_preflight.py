"""A CLI harness whose harness prefix is missing stops `python train.py` at start-up, before the
engine starts, in one line naming the setting and the fix (issue 27: every rollout failed with
"bwrap: Can't find source path .cache/harness" and the run spun on with no further line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fixture_paths import CONF, REPO
from hydra import compose, initialize_config_dir

from polar_pl.errors import ConfigError
from polar_pl.preflight import preflight


def fresh_env(tmp_path, prefix) -> dict[str, str]:
    """A fresh machine's environment: no POLAR_* variables but the prefix, no cached models."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    return env | {"POLAR_HARNESS_PREFIX": str(prefix), "POLAR_MODEL_CACHE": str(tmp_path / "cache"),
                  "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}  # fmt: skip


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_a_cli_harness_without_its_prefix_stops_in_one_line(state, tmp_path):
    prefix = tmp_path / "harness"
    if state == "empty":
        prefix.mkdir()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "train.py", "harness=claude_code", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=fresh_env(tmp_path, prefix), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    took = time.monotonic() - t0
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode != 0 and took < 30, (proc.returncode, took, proc.stdout[-3000:])
    assert len(lines) == 1, proc.stdout[-3000:]  # the error alone: no traceback, no engine start
    for part in ("sandbox.harness_prefix", "POLAR_HARNESS_PREFIX", str(prefix),
                 f"polar-pl harness install claude_code --prefix {prefix}"):  # fmt: skip
        assert part in lines[-1], lines[-1]


def test_an_evaluation_checks_the_prefix_too(tmp_path):
    """`polar-pl eval` runs the same sessions as training: the same check, the same one line."""
    prefix = tmp_path / "harness"
    proc = subprocess.run(
        [sys.executable, "-m", "polar_pl.eval", "harness=claude_code", f"eval.output_dir={tmp_path / 'eval'}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=fresh_env(tmp_path, prefix), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout[-3000:]
    assert f"polar-pl harness install claude_code --prefix {prefix}" in lines[-1], lines[-1]


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=list(overrides))


def test_the_mini_harness_needs_no_prefix(tmp_path):
    preflight(compose_config(f"sandbox.harness_prefix={tmp_path / 'missing'}"))


@pytest.mark.parametrize("overrides", [["sandbox=docker", "sandbox.harness_prefix=''"],
                                       ["sandbox.harness_prefix=/nonexistent/harness"]])  # fmt: skip
def test_every_sandbox_backend_is_checked(overrides):
    with pytest.raises(ConfigError, match=r"sandbox\.harness_prefix .*harness=pi"):
        preflight(compose_config("harness=pi", *overrides))


def test_a_remote_rollout_service_checks_its_own(tmp_path):
    cfg = compose_config("harness=pi", "rollout=remote", "rollout.url=http://127.0.0.1:1",
                         f"sandbox.harness_prefix={tmp_path / 'missing'}")  # fmt: skip
    preflight(cfg)
