"""A run that cannot work stops `python train.py` at start-up, before the engine starts, in one line
naming the setting and the fix: a CLI harness whose harness prefix is missing (issue 27: every
rollout failed with "bwrap: Can't find source path .cache/harness" and the run spun on with no
further line), a warm-started model that is not built (issue 29: the run no longer builds it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fixture_paths import CONF, REPO
from hydra import compose, initialize_config_dir

from polar_pl.errors import ConfigError
from polar_pl.preflight import check_warm_model, preflight
from polar_pl.warmstart.cli import compose_config as compose_run


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


def test_a_missing_warm_started_model_names_the_command_that_builds_it(tmp_path):
    """Issue 29: train.py built the learning checks' warm-started models mid-run (minutes of CPU,
    a CLI's inside that CLI); now it stops in seconds and says which command builds it."""
    missing = tmp_path / "tiny-model-multiturn"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=multiturn", f"model_dir={missing}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=fresh_env(tmp_path, tmp_path / "harness"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    took = time.monotonic() - t0
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and took < 30, (proc.returncode, took, proc.stdout[-3000:])
    assert len(lines) == 1, proc.stdout[-3000:]
    assert f"model_dir {missing}" in lines[-1], lines[-1]
    assert f"`polar-pl warm-start experiment=multiturn model_dir={missing}`" in lines[-1], lines[-1]
    assert not missing.exists()


def test_a_model_warm_started_inside_another_request_is_refused(tmp_path):
    """Claude Code's check trains inside the request its extra_args shrink (~1.9k tokens, not
    ~15k): a model warm-started without them learnt a context the run never shows it."""
    model = tmp_path / "tiny-model-claude_code-case-lean"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tinymodel.json").write_text('{"harness_extra_args": []}')
    cfg = compose_run(
        ["experiment=cli_sanity_claude_code", f"model_dir={model}"]
    )  # the harness from its choice
    with pytest.raises(ConfigError, match=r"harness\.extra_args \[\], not this run's \['--tools', 'Bash'"):
        check_warm_model(cfg)
    (model / "tinymodel.json").write_text(json.dumps({"harness_extra_args": list(cfg.harness.extra_args)}))
    check_warm_model(cfg)
