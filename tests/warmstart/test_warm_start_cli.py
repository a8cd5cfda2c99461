"""`polar-pl warm-start <overrides>`: the training config of the same overrides names the model it
builds; a config without `warm_start`, or whose model is built, costs a second and prints nothing
(`make train` runs it before every train.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from fixture_paths import REPO

from polar_pl.cli import main
from polar_pl.warmstart.cli import compose_config, sweep


def warm_start(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polar_pl.cli", "warm-start", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_config_without_warm_start_is_a_silent_no_op():
    t0 = time.monotonic()
    proc = warm_start("debug=fast", "steps=2")
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc.stderr
    assert time.monotonic() - t0 < 30


def test_a_built_model_dir_is_left_as_it_is(tmp_path):
    model = tmp_path / "tiny-model-multiturn"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = warm_start("experiment=multiturn", f"model_dir={model}")
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc.stderr
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]


def test_a_bad_override_is_refused_without_a_traceback():
    proc = warm_start("experiment=no_such_experiment")
    assert proc.returncode == 2 and "no_such_experiment" in proc.stderr and "Traceback" not in proc.stderr


def test_the_model_is_the_one_train_py_would_load(monkeypatch):
    """The harness's model folder comes from the group choice (`${hydra:runtime.choices.harness}`),
    which only a config composed with Hydra's run-time values resolves."""
    monkeypatch.setenv("POLAR_MODEL_CACHE", "/models")
    cfg = compose_config(["experiment=cli_tiny", "harness=pi"])
    assert cfg.model_dir == "/models/tiny-model-pi" and cfg.warm_start.harness == "pi"
    cfg = compose_config(["experiment=cli_sanity", "harness=claude_code"])
    assert cfg.model_dir == "/models/tiny-model-claude_code-case" and cfg.warm_start.case == 0.7


def test_a_sweep_builds_each_runs_model(capsys):
    """`make train ARGS="-m harness=mini,pi"`: train.py's sweep flag is taken, each run composed."""
    assert sweep(["experiment=cli_tiny", "harness=pi,claude_code"]) == [
        ["experiment=cli_tiny", "harness=pi"],
        ["experiment=cli_tiny", "harness=claude_code"],
    ]
    assert sweep([]) == [[]]
    assert main(["warm-start", "-m", "harness=mini,pi", "steps=1,2"]) == 0
    assert capsys.readouterr() == ("", "")


def test_the_tool_cold_start_is_the_one_train_py_would_load_and_bad_values_name_their_key(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("POLAR_MODEL_CACHE", "/models")
    cfg = compose_config(["experiment=smollm2_tools"])
    assert (
        cfg.model_dir == "/models/smollm2-135m-instruct-pi-tools"
        and cfg.sandbox.workspace_alias == "/workspace"
    )
    assert cfg.warm_start.harness == "pi" and cfg.warm_start.tools.steps > 0
    proc = warm_start("experiment=smollm2_tools", f"model_dir={tmp_path / 'm'}", "warm_start.tools.steps=0")
    assert proc.returncode == 1 and "warm_start.tools.steps must be positive" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "m").exists()
