"""A run that cannot work stops `python train.py` at start-up, before the engine starts, in one line
naming the setting and the fix: a CLI harness whose harness prefix is missing (issue 27: every
rollout failed with "bwrap: Can't find source path .cache/harness" and the run spun on with no
further line), a warm-started model that is not built (issue 29: the run no longer builds it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from fixture_paths import REPO

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
        [sys.executable, "train.py", "experiment=cli_tiny", "harness=claude_code", f"hydra.run.dir={tmp_path / 'run'}"],
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
        [sys.executable, "-m", "polar_pl.eval", "experiment=cli_tiny", "harness=claude_code", f"eval.output_dir={tmp_path / 'eval'}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=fresh_env(tmp_path, prefix), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout[-3000:]
    assert f"polar-pl harness install claude_code --prefix {prefix}" in lines[-1], lines[-1]


def compose_config(*overrides: str):
    """The config as `python train.py OVERRIDES` composes it (Hydra's run-time values set)."""
    return compose_run(list(overrides))


def test_the_mini_harness_needs_no_prefix(tmp_path):
    preflight(compose_config(f"sandbox.harness_prefix={tmp_path / 'missing'}"))


@pytest.mark.parametrize("overrides", [["sandbox=docker", "sandbox.harness_prefix=''"],
                                       ["sandbox.harness_prefix=/nonexistent/harness"]])  # fmt: skip
def test_every_sandbox_backend_is_checked(overrides):
    with pytest.raises(ConfigError, match=r"sandbox\.harness_prefix .*harness=pi"):
        preflight(compose_config("experiment=cli_tiny", "harness=pi", *overrides))


def test_a_remote_rollout_service_checks_its_own(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cfg = compose_config("~experiment", "harness=pi", f"model_dir={tmp_path / 'model'}", "rollout=remote",
                         "rollout.url=http://127.0.0.1:1", f"sandbox.harness_prefix={tmp_path / 'missing'}")  # fmt: skip
    preflight(cfg)


CLI_HARNESSES = ["claude_code", "codex", "qwen_code", "pi", "gemini_cli", "opencode"]


@pytest.mark.parametrize(
    ("recipe", "refusal"),
    [([], "with experiment=first_run, a recipe made for harness mini"),
     (["experiment=tiny"], "on the untrained tiny model")],
    ids=["base", "tiny"],
)  # fmt: skip
@pytest.mark.parametrize("harness", CLI_HARNESSES)
def test_a_cli_harness_on_the_base_config_is_refused_with_the_command_that_trains(harness, recipe, refusal):
    """Issue 55: `python train.py harness=claude_code merge=prefix` started Claude Code against the
    untrained tiny model (lr 0.03, the capitals task; then the default) and nothing stopped it. Every
    CLI harness on the base config's recipe (SmolLM2 through the mini harness) or the tiny model's is
    refused in one line that names a recipe which trains something."""
    with pytest.raises(ConfigError) as err:
        preflight(compose_config(f"harness={harness}", "merge=prefix", *recipe))
    line = str(err.value)
    assert "\n" not in line and f"harness={harness} {refusal}" in line, line
    assert "`python train.py experiment=smollm2_tools`" in line, line
    assert f"`python train.py experiment=cli_tiny harness={harness}`" in line, line


def test_the_real_model_recipe_on_another_model_is_refused(tiny_model_dir):
    """With the real model's first run as the default, `python train.py model_dir=X` would train X
    with SmolLM2's learning rate and sizes; it is refused like the tiny recipe on another model."""
    tiny = str(tiny_model_dir)
    with pytest.raises(ConfigError, match=re.escape(f"not for model_dir {tiny} (hidden_size, layers, vocab")):
        preflight(compose_config(f"model_dir={tiny}"))


@pytest.mark.parametrize("experiment", ["first_run", "smollm2_arith"])
def test_a_cli_harness_on_a_mini_harness_recipe_is_refused(experiment):
    """The real model's arith recipes answer plain questions through the mini harness: the base
    model has never seen a CLI's tools, so `harness=claude_code` on them would train nothing."""
    with pytest.raises(ConfigError) as err:
        preflight(compose_config(f"experiment={experiment}", "harness=claude_code"))
    line = str(err.value)
    assert "\n" not in line and f"harness=claude_code with experiment={experiment}" in line, line
    assert "`python train.py experiment=cli_tiny harness=claude_code`" in line, line
    preflight(compose_config(f"experiment={experiment}"))  # its own harness passes


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["experiment=tiny", "module=grpo_gpu", "trainer=gpu"], "trainer.accelerator=gpu on the untrained tiny model"),
        (["~experiment", "trainer=gpu", "engine.device=cpu", "model_dir=/models/real"],
         "trainer.accelerator=gpu with engine.device=cpu"),
        (["~experiment", "module.lora.rank=8", "module/weight_sync=vllm_nccl", "model_dir=/models/real"],
         "module.lora.rank=8 with module/weight_sync=VLLMWeightTransferSync"),

        # vLLM's NCCL transfer reads whole parameters: a sharded trainer's first push would fail
        (["~experiment", "trainer.strategy=fsdp", "module/weight_sync=vllm_nccl", "model_dir=/models/real"],
         "trainer.strategy=fsdp with module/weight_sync=VLLMWeightTransferSync"),
    ],
)  # fmt: skip
def test_parts_that_do_not_fit_each_other_are_refused_naming_the_keys(overrides, keys):
    """Issue 57: the README's GPU line inherited the tiny model's CPU recipe, and nothing checked
    that the parts chosen fit each other."""
    with pytest.raises(ConfigError, match=re.escape(keys)):
        preflight(compose_config(*overrides))


def test_the_tiny_recipe_is_refused_for_another_model(tmp_path):
    """experiment=tiny sets lr 3e-2 and the tiny model's sizes: with another model_dir a run would
    silently train a real model at the tiny model's learning rate."""
    (tmp_path / "config.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=tiny", f"model_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, env=fresh_env(tmp_path, tmp_path / "harness"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout[-3000:]
    assert "experiment=tiny is the tiny model's recipe" in lines[-1], lines[-1]


def test_the_headline_command_and_the_sweep_stop_in_one_line(tmp_path):
    """`python train.py harness=claude_code merge=prefix` and the sweep over the CLIs stop within
    seconds, before any engine starts or the base config's SmolLM2 is built, with the line naming
    what to run instead."""
    for args in (["harness=claude_code", "merge=prefix"], ["-m", "harness=claude_code,codex,qwen_code,pi"]):
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}",
             f"hydra.sweep.dir={tmp_path / 'sweep'}"],
            cwd=REPO, env=fresh_env(tmp_path, tmp_path / "harness"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=300, check=False,
        )  # fmt: skip
        took = time.monotonic() - t0
        lines = [
            line
            for line in proc.stdout.strip().splitlines()
            if "Launching" not in line and "#0 :" not in line
        ]
        assert proc.returncode == 1 and took < 30, (args, proc.returncode, took, proc.stdout[-3000:])
        assert len(lines) == 1 and "harness=claude_code with experiment=first_run" in lines[-1], proc.stdout
        for command in ("`python train.py experiment=smollm2_tools`",
                        "`python train.py experiment=cli_tiny harness=claude_code`"):  # fmt: skip
            assert command in lines[-1], lines[-1]
        assert not (tmp_path / "cache").exists()  # nothing built


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
