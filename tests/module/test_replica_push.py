"""Two embedded engine replicas behind one handle and one gateway: sessions stick to a replica and
spread over both; a weight push reaches both (their logprobs equal the trainer's, one version); a
replica killed before a push is taken out of rotation (reported, no longer routed to) and training
goes on with the other. The replicas start at once on two threads (this once failed with "Cannot
copy out of meta tensor": transformers' model loading is not thread-safe)."""

from __future__ import annotations

import httpx
import pytest
import torch
from module_rows import prompt_ids, sample_group

from polar_pl.datamodule.collate import collate
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.gateway.handle import Gateway
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import scorable, token_logprobs
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import EmbeddedStateDictSync

GAP_TOL = 0.01


def max_gap(module: GRPOModule, rows) -> float:
    batch = collate(rows, token_budget=64)
    with torch.no_grad():
        logp, _ = token_logprobs(module.model, batch.input_ids, batch.position_ids)
    sel = (batch.loss_mask > 0) & scorable(batch.position_ids)
    return float((logp.double() - batch.behavior_logprobs)[sel].abs().max())


def step(module: GRPOModule, engine, optimizer, seed: int) -> None:
    rows = sample_group(engine, f"s{seed}", prompt_ids(6, seed), seed=seed)
    assert module.update(collate(rows, token_budget=64), optimizer)["train/optimizer_steps"] == 1.0


def chat(session) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(f"{session.base_url}/v1/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {session.token}"}, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_push_reaches_every_replica_and_a_dead_one_is_taken_out(tiny_model_dir, tmp_path):
    replica = {"served_model_name": "tiny", "max_batch_size": 8, "max_model_len": 512}
    engines = EngineReplicas([EmbeddedEngine(tiny_model_dir, **replica) for _ in range(2)]).start()
    gw = Gateway(engines.urls, tmp_path / "t.db", health_interval=0.2).start()
    engines.on_take_out.append(gw.take_out_upstream)
    try:
        sessions = [gw.create_session() for _ in range(4)]
        for _ in range(2):
            for s in sessions:
                chat(s)
        served = [{r.upstream for r in gw.records(s.session_id)} for s in sessions]
        assert all(len(u) == 1 for u in served)  # sticky
        assert set().union(*served) == set(engines.urls)  # spread over both

        module = GRPOModule(
            tiny_model_dir, weight_sync=EmbeddedStateDictSync().bind(engines), settings=GRPOSettings(lr=1e-2)
        )
        opt = module.configure_optimizers()
        step(module, engines.engines[0], opt, seed=3)
        assert [e.policy_version() for e in engines.engines] == [1, 1] == [engines.policy_version()] * 2
        for i, e in enumerate(engines.engines):
            rows = sample_group(e, f"after{i}", prompt_ids(9, 4), seed=7)
            assert {v for r in rows for v in r.policy_version if v >= 0} == {1}
            assert max_gap(module, rows) < GAP_TOL, f"replica {i} does not run the pushed weights"

        dead, live = engines.engines
        dead_url = dead.url
        dead.stop()  # killed before the next push
        step(module, live, opt, seed=5)
        assert engines.policy_version() == 2 and engines.urls == [live.url]
        assert list(engines.taken_out) == [dead_url] and "not healthy" in engines.taken_out[dead_url]
        assert max_gap(module, sample_group(live, "live", prompt_ids(9, 4), seed=8)) < GAP_TOL
        for s in sessions:  # sessions stuck to the dead replica move on; nothing fails
            chat(s)
            assert gw.records(s.session_id)[-1].upstream == live.url
        health = {h["url"]: h["healthy"] for h in httpx.get(f"{gw.url}/health").json()["replicas"]}
        assert health == {live.url: True, dead_url: False}
    finally:
        gw.stop()
        engines.stop()
