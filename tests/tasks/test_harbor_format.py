"""The Harbor task format: the built-in tasks load, malformed folders get errors naming the file or
key, rewards are read as Harbor defines them, `task=harbor` composes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from polar_pl.tasks.harbor import BUILTIN_DIR, load_harbor_task
from polar_pl.tasks.harbor_verifier import RewardFormatError, parse_reward
from polar_pl.tasks.sources import HarborTaskSource
from polar_pl.tasks.task import TaskFormatError, task_from_row


def test_builtin_harbor_tasks():
    tasks = {t.instance_id: t for t in HarborTaskSource().tasks()}
    assert set(tasks) == {"polar/hello-harbor", "polar/fix-mean", "polar/word-count"}
    t = tasks["polar/word-count"]
    assert (
        t.image.startswith("polar-pl/harbor-polar-word-count:")
        and Path(t.image_context, "Dockerfile").is_file()
    )
    assert t.verifier_env == {"CASES": "4"} and t.agent_timeout_s == 180.0 and t.solution_dir
    assert t.prompt == (BUILTIN_DIR / "word-count" / "instruction.md").read_text()
    assert "/logs/verifier" in t.owned_paths


def test_image_name_follows_the_environment(tmp_path):
    """An edited environment/ gets a new image name, so a stale image is never reused."""
    task_dir = tmp_path / "t"
    shutil.copytree(BUILTIN_DIR / "hello-harbor", task_dir)
    before = load_harbor_task(task_dir).image
    (task_dir / "environment" / "app" / "README.txt").write_text("changed\n")
    assert load_harbor_task(task_dir).image != before


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: (d / "instruction.md").unlink(), "instruction.md"),
    (lambda d: (d / "tests" / "test.sh").unlink(), "tests/test.sh"),
    (lambda d: (d / "task.toml").write_text("[verifier\n"), "not valid TOML"),
    (lambda d: (d / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n"), "verifier.timeout_sec"),
    (lambda d: (d / "task.toml").write_text("[bogus]\n"), "unknown sections"),
    (lambda d: (d / "environment" / "Dockerfile").unlink(), "environment/Dockerfile"),
    (lambda d: (d / "environment" / "docker-compose.yaml").write_text("services: {main: {}, db: {}}\n"),
     "sidecars"),
])  # fmt: skip
def test_malformed_task_folders(tmp_path, edit, message):
    task_dir = tmp_path / "t"
    shutil.copytree(BUILTIN_DIR / "hello-harbor", task_dir)
    edit(task_dir)
    with pytest.raises(TaskFormatError, match=message):
        load_harbor_task(task_dir)


def test_prebuilt_image_instead_of_a_dockerfile(tmp_path):
    task_dir = tmp_path / "t"
    shutil.copytree(BUILTIN_DIR / "hello-harbor", task_dir)
    (task_dir / "environment" / "Dockerfile").unlink()
    with (task_dir / "task.toml").open("a") as f:
        f.write('docker_image = "registry.example.com/team/hello:1"\n')
    t = load_harbor_task(task_dir)
    assert (t.image, t.image_context) == ("registry.example.com/team/hello:1", None)


def test_reward_files():
    assert parse_reward(b"0.75\n", b'{"reward": 0.1}') == 0.75  # reward.txt first
    assert parse_reward(None, b'{"reward": 1, "quality": 0.2}') == 1.0
    assert parse_reward(None, b'{"score": 0.5}') == 0.5  # one numeric value
    assert parse_reward(None, b"0.25") == 0.25
    assert parse_reward(None, None) is None  # then the exit status decides
    for txt, js in ((b"yes", None), (None, b'{"a": 1, "b": 2}'), (None, b"{")):
        with pytest.raises(RewardFormatError):
            parse_reward(txt, js)


def test_rows_name_their_images():
    row = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "problem_statement": "p",
           "FAIL_TO_PASS": '["t"]'}  # fmt: skip
    for key in ("image", "image_name", "docker_image"):
        t = task_from_row({**row, key: "namanjain12/pandas_final:x"}, repo_path="/repos/o__r")
        assert t.image == "namanjain12/pandas_final:x" and t.repo_path is None  # the image holds the repo
    assert task_from_row(row, repo_path="/repos/o__r").image is None
    with pytest.raises(TaskFormatError, match="image_context"):
        task_from_row({**row, "image_context": "/ctx"})


def test_harbor_config_composes():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=tiny", "task=harbor", "sandbox=docker"])
    source = instantiate(cfg.task)
    assert len(source.tasks()) == 3
    factory = instantiate(cfg.sandbox)
    assert factory.per_task_images and factory.prefetch_tasks == 4 and factory.retries.attempts == 3
    assert type(source.make_evaluator(factory)).__name__ == "HarborVerifier"
    factory.close()
