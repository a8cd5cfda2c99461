"""conf/engine/*.yaml compose and instantiate the engine handles (train.py end to end: tests/test_train.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from recipes import tiny

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.protocol import Engine
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.engine.vllm_engine import VLLMEngine
from polar_pl.rollout.build import build_engine


def compose_engine(*overrides: str):
    """The engine group as the tiny model's recipe composes it (its model_dir: $POLAR_TINY_MODEL)."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="config", overrides=tiny(*overrides), return_hydra_config=True)
    HydraConfig().set_config(cfg)
    return cfg.engine


@pytest.mark.parametrize(("choice", "cls"), [("embedded", EmbeddedEngine), ("vllm", VLLMEngine)])
def test_engine_group_instantiates(choice, cls, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POLAR_TINY_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("POLAR_VLLM_PYTHON", "/opt/vllm/bin/python")
    engine = build_engine(compose_engine(f"engine={choice}"))
    assert isinstance(engine, cls) and isinstance(engine, Engine)
    assert engine.model_dir == Path(tiny_model_dir)
    if choice == "vllm":
        assert engine.python == "/opt/vllm/bin/python"
        engine.port = 1234
        cmd = engine.command()
        assert cmd[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
        assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes" and "--port" in cmd
        assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"  # what the trainer rebuilds


def test_vllm_python_comes_from_env_or_path_and_is_a_clear_error_when_absent(tmp_path, monkeypatch):
    """The vLLM interpreter was a hard-coded machine path (/work/main/.venv-vllm): now
    $POLAR_VLLM_PYTHON, this interpreter if it has vLLM, or the `vllm` script on PATH."""
    import importlib.util
    import sys

    from polar_pl.engine.vllm_engine import vllm_python

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vLLM: it is the answer")
    monkeypatch.delenv("POLAR_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm_python() is None
    with pytest.raises(FileNotFoundError, match="engine.python"):
        VLLMEngine(tmp_path).command()
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nprint('vllm')\n")
    script.chmod(0o755)
    assert vllm_python() == sys.executable
    monkeypatch.setenv("POLAR_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert vllm_python() == "/opt/vllm/bin/python"


@pytest.mark.parametrize("choice", ["embedded", "vllm"])
def test_engine_replicas_build_one_handle_over_n_engines(choice, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("POLAR_TINY_MODEL", str(tiny_model_dir))
    engines = build_engine(compose_engine(f"engine={choice}", "engine.replicas=2"))
    assert isinstance(engines, EngineReplicas) and isinstance(engines, Engine)
    assert len(engines.engines) == 2 and engines.engines[0] is not engines.engines[1]
    assert engines.model_dir == Path(tiny_model_dir)  # what the replicas share, from the first
    with pytest.raises(ValueError, match=r"engine.replicas=2: needs engine.port=null"):
        build_engine(compose_engine(f"engine={choice}", "engine.replicas=2", "engine.port=8000"))


def test_vllm_tensor_parallel_size_reaches_the_server(tiny_model_dir, monkeypatch):
    """`engine.tensor_parallel_size=N` shards one vLLM server over N GPUs (vLLM's own
    --tensor-parallel-size); it used to take `engine.extra_args` spelled by hand."""
    monkeypatch.setenv("POLAR_TINY_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("POLAR_VLLM_PYTHON", "/opt/vllm/bin/python")
    engine = build_engine(compose_engine("engine=vllm", "engine.tensor_parallel_size=4", "engine.port=1234"))
    cmd = engine.command()
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    default = build_engine(compose_engine("engine=vllm", "engine.port=1234"))
    assert "--tensor-parallel-size" not in default.command()
    with pytest.raises(ValueError, match=r"engine.tensor_parallel_size=0"):
        VLLMEngine(tiny_model_dir, tensor_parallel_size=0)
