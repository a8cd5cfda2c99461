"""The Hydra group `task/`: each option instantiates its TaskSource, and the evaluator it builds
takes the sandbox factory from the `sandbox/` group (what train.py and the DataModule do)."""

from __future__ import annotations

import json

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from polar_pl.tasks.answer import AnswerEvaluator
from polar_pl.tasks.evaluator import SandboxEvaluator
from polar_pl.tasks.learnable import LearnableTaskSource
from polar_pl.tasks.sources import BuiltinTaskSource, SWEBenchTaskSource, TaskSource


def _task_cfg(name: str, **over):
    cfg = OmegaConf.create({"seed": 0, "task": OmegaConf.load(CONF / "task" / f"{name}.yaml")})
    for key, value in over.items():
        OmegaConf.update(cfg, f"task.{key}", value)
    return cfg


def test_builtin_option_scores_in_the_configured_sandbox():
    cfg = _task_cfg("builtin", instance_ids=["graphkit-3"])
    source = instantiate(cfg.task)
    assert isinstance(source, BuiltinTaskSource) and isinstance(source, TaskSource)
    sandbox_factory = instantiate(OmegaConf.create({"sandbox": OmegaConf.load(CONF / "sandbox" / "bwrap.yaml")}).sandbox,
                                  owner="pytest", harness_prefix=None)  # fmt: skip
    evaluator = source.make_evaluator(sandbox_factory)
    assert isinstance(evaluator, SandboxEvaluator) and evaluator.reward == "binary"
    try:
        (task,) = source.tasks()
        assert evaluator.evaluate(evaluator.prewarm(task), task.patch).resolved
    finally:
        evaluator.close()


def test_learnable_option():
    source = instantiate(_task_cfg("learnable", n_tasks=4).task)
    assert isinstance(source, LearnableTaskSource) and len(source.tasks()) == 4
    assert isinstance(source.make_evaluator(None), AnswerEvaluator)


def test_swebench_option_requires_data_files(tmp_path):
    from omegaconf.errors import MissingMandatoryValue

    with pytest.raises(MissingMandatoryValue):
        instantiate(_task_cfg("swebench").task)
    row = {"instance_id": "x-1", "repo": "o/r", "base_commit": "abc", "problem_statement": "broken",
           "FAIL_TO_PASS": '["t.T.test_a"]', "PASS_TO_PASS": "[]"}  # fmt: skip
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    cfg = _task_cfg("swebench", data_files=str(tmp_path / "t.jsonl"), **{"evaluator.reward": "partial"})
    source = instantiate(cfg.task)
    assert isinstance(source, SWEBenchTaskSource) and source.tasks()[0].instance_id == "x-1"
    evaluator = source.make_evaluator(None)
    assert evaluator.reward == "partial"
    evaluator.close()


def test_composes_with_the_root_config():
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        for option, cls in (("builtin", BuiltinTaskSource), ("learnable", LearnableTaskSource)):
            cfg = compose(config_name="config", overrides=["experiment=tiny", f"task={option}"])
            assert cfg.task._target_ == f"{cls.__module__}.{cls.__name__}"
            assert isinstance(instantiate(cfg.task), cls)
