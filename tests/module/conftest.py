"""Module test fixtures: the tiny model served by the embedded engine (in-process), and real
trajectory rows sampled from it through its token-in completions route."""

from __future__ import annotations

import pytest
from module_rows import prompt_ids, sample_group

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.trajectory.rows import TrajectoryRow


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with EmbeddedEngine(
        tiny_model_dir, served_model_name="tiny", max_batch_size=16, max_model_len=512
    ) as eng:
        yield eng


@pytest.fixture
def fresh_engine(engine):
    """The module's engine, put back to the initial weights after the test (versions keep rising)."""
    original = {k: v.clone() for k, v in engine.backend.model.state_dict().items()}
    yield engine
    engine.update_weights_from_state_dict(original)


@pytest.fixture
def rows(engine) -> list[TrajectoryRow]:
    """Two groups of four sampled rollouts, rewards 0/1 alternating."""
    return sample_group(engine, "g0", prompt_ids(7, 0), seed=1) + sample_group(
        engine, "g1", prompt_ids(5, 1), seed=2
    )
