"""`rollout=remote`: the training config's DataModule and GRPO module against a real `polar-pl
rollout serve` (the `service` fixture of conftest.py): groups with rows and rewards come over
HTTP, each weight push reaches the service's engine, and bad settings get clear errors."""

from __future__ import annotations

import csv

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from omegaconf.errors import MissingMandatoryValue
from recipes import tiny
from rollout_kit import SERVICE_TOKEN

from polar_pl.rollout.remote import RemoteRollout, RolloutServiceError
from polar_pl.rollout.service import RolloutsStopped
from polar_pl.training import build_parts


def compose_run(run_dir, *overrides: str):
    """The root config as train.py composes it on the tiny model's recipe, with the run directory
    set by hand."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=tiny(*overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def test_remote_without_url_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(MissingMandatoryValue, match=r"rollout\.url"):
        build_parts(compose_run(tmp_path, "rollout=remote"))


def test_token_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("POLAR_ROLLOUT_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"rollout\.token_file or \$POLAR_ROLLOUT_TOKEN"):
        RemoteRollout("http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"rollout\.token_file=.*missing"):
        RemoteRollout("http://127.0.0.1:1", token_file=str(tmp_path / "missing"))
    monkeypatch.setenv("POLAR_ROLLOUT_TOKEN", "from-env")
    assert RemoteRollout("http://127.0.0.1:1").token == "from-env"
    with pytest.raises(ValueError, match=r"rollout\.url='127\.0\.0\.1:8100'"):
        RemoteRollout("127.0.0.1:8100")


@pytest.mark.slow
def test_bad_token_gets_the_services_message(service, tmp_path):
    api, _ = service
    bad = tmp_path / "token"
    bad.write_text("not-the-token\n")
    with pytest.raises(
        RolloutServiceError, match=rf"{api.base_url}: GET /v1/policy_version -> 401: .*bearer token"
    ):
        RemoteRollout(str(api.base_url), token_file=str(bad)).engine().start()


@pytest.mark.slow
def test_train_through_the_rollout_service(service, tiny_model_dir, tmp_path):
    """Two GRPO steps of train(cfg) with rollout=remote: every batch holds rows and rewards from
    the service's groups, and each weight push advances the service engine's policy version."""
    from polar_pl.training import train

    api, _ = service
    token = tmp_path / "token"
    token.write_text(SERVICE_TOKEN)
    client = RemoteRollout(str(api.base_url), token_file=str(token)).connect(None)
    try:  # a group as the DataModule gets it: decoded by the service's own schema
        (group,) = client.next_groups(1, timeout=600, consume=False)
        client.mark_consumed([group.seq])
        client.stop_feeding()  # Ctrl-C: this trainer takes no more groups (the service feeds on)
        with pytest.raises(RolloutsStopped):
            client.next_groups(1)
    finally:
        client.close()
    assert len(group.results) == 2 and all(isinstance(r.reward, float) for r in group.results)
    # each attempt's AttemptInfo crossed the wire: the service's harness, session and call count
    assert all(r.info.harness == "mini" and r.info.session_id and r.info.calls >= 1 for r in group.results)
    rows = [row for r in group.results for row in r.rows]
    assert rows and all(row.num_trainable > 0 and len(row.input_ids) == len(row.loss_mask) for row in rows)

    before = api.get("/v1/policy_version").raise_for_status().json()["policy_version"]
    cfg = compose_run(
        tmp_path, f"model_dir={tiny_model_dir}", "debug=fast", "steps=2", "torch_threads=null",
        "datamodule.progress=false", "rollout=remote", f"rollout.url={api.base_url}",
        f"rollout.token_file={token}", f"rollout.weights_dir={tmp_path / 'weights'}", "rollout.poll_s=1",
    )  # fmt: skip
    logged = train(cfg)
    after = api.get("/v1/policy_version").raise_for_status().json()["policy_version"]
    # a batch whose rewards are all equal trains nothing and pushes nothing: at least one push
    assert after > before and logged["train/policy_version"] == float(after)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        steps = [r for r in csv.DictReader(f) if r.get("rollout/rows")]
    assert len(steps) == 2 and all(float(r["rollout/rows"]) > 0 and r["rollout/reward_mean"] for r in steps)
    assert not list((tmp_path / "weights").iterdir())  # each push's files are gone once loaded
