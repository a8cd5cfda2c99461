"""Shared fixtures: the tiny offline model (built once if absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CAPTURES = SHARED / "fixtures" / "harness-captures"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model directory ($POLAR_TINY_MODEL, else .cache/tiny-model), built if absent."""
    path = Path(os.environ.get("POLAR_TINY_MODEL", REPO / ".cache" / "tiny-model"))
    if not (path / "config.json").exists():
        from polar_pl.tinymodel.build import build_tiny_model

        build_tiny_model(path)
    return path


# The real Docker engine and the offline base image, shared by the sandbox, harness and task tests.
from polar_pl.testing.sandbox import docker_engine, docker_image, no_sandbox_leftovers  # noqa: F401
