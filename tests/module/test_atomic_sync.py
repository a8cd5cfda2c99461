"""A push the engine cannot take changes nothing, in every push path of the weight sync
(issue 58): the in-process copy (`EmbeddedStateDictSync` into a thread-mode engine), the adapter
push, the subprocess engine's routes (`DiskSync`) and replicas. Each refuses with a ValueError that
names the bad tensor, and the engine keeps its greedy logprobs (to 1e-6), version and model name."""

from __future__ import annotations

import httpx
import pytest
import torch
from torch import nn

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.replicas import EngineReplicas
from polar_pl.module.lora import LoraSpec, attach
from polar_pl.module.model import load_model
from polar_pl.module.weight_sync import DiskSync, EmbeddedStateDictSync

PROMPT = list(range(300, 330))


def greedy(engine) -> list[float]:
    body = {"model": engine.model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "ignore_eos": True}  # fmt: skip
    r = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["token_logprobs"]


def same(a: list[float], b: list[float]) -> bool:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-6


def moved(tiny_model_dir, seed: int) -> nn.Module:
    """The tiny model with every weight moved by noise (a push of it changes the logprobs)."""
    torch.manual_seed(seed)
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def wrong_norm(tiny_model_dir) -> nn.Module:
    """Every weight valid but the final norm's (pushed after the layers, before the head)."""
    model = moved(tiny_model_dir, seed=1)
    model.model.norm.weight = nn.Parameter(torch.zeros(3, 3))
    return model


def lora(tiny_model_dir, seed: int, nan: bool = False):
    """A PEFT model with random adapter weights; `nan`: its last lora_B holds a NaN."""
    torch.manual_seed(seed)
    peft = attach(load_model(tiny_model_dir), LoraSpec(rank=4, alpha=8.0))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.05)
        if nan:
            last = [p for name, p in peft.named_parameters() if "lora_B" in name][-1]
            last[0, 0] = torch.nan
    return peft


@pytest.fixture
def thread_engine(tiny_model_dir):
    with EmbeddedEngine(tiny_model_dir, served_model_name="tiny", max_batch_size=4, max_model_len=256) as eng:
        yield eng


def test_in_process_push_with_one_wrong_tensor_changes_nothing(tiny_model_dir, thread_engine) -> None:
    """Failure guarded: `update_weights_from_state_dict` copied every tensor before the wrong one,
    then raised: logprobs moved while the version stayed."""
    sync = EmbeddedStateDictSync().bind(thread_engine)
    before = greedy(thread_engine)
    with pytest.raises(ValueError, match="model.norm.weight"):
        sync.push(wrong_norm(tiny_model_dir))
    assert same(greedy(thread_engine), before) and thread_engine.policy_version() == 0
    with pytest.raises(ValueError, match="lora_B"):
        sync.push(lora(tiny_model_dir, seed=2, nan=True))
    assert same(greedy(thread_engine), before) and thread_engine.policy_version() == 0
    assert thread_engine.model == "tiny"
    assert sync.push(moved(tiny_model_dir, seed=3)) == 1 and not same(greedy(thread_engine), before)


def test_replicas_refuse_a_bad_push_together_and_stay_in_rotation(tiny_model_dir) -> None:
    """Failure guarded: every replica refused the push, so every one was taken out of rotation and
    stopped: one bad tensor ended the run (and the first ones had half-loaded weights)."""
    replica = {"served_model_name": "tiny", "max_batch_size": 4, "max_model_len": 256}
    with EngineReplicas([EmbeddedEngine(tiny_model_dir, **replica) for _ in range(2)]) as engines:
        sync = EmbeddedStateDictSync().bind(engines)
        before = [greedy(e) for e in engines.engines]
        with pytest.raises(ValueError, match="model.norm.weight"):
            sync.push(wrong_norm(tiny_model_dir))
        assert engines.taken_out == {} and engines.urls == [e.url for e in engines.engines]
        assert all(same(greedy(e), b) for e, b in zip(engines.engines, before, strict=True))
        assert engines.policy_version() == 0
        assert sync.push(moved(tiny_model_dir, seed=3)) == 1
        assert [e.policy_version() for e in engines.engines] == [1, 1]


def test_subprocess_engine_refuses_a_bad_push_and_keeps_its_adapter(tiny_model_dir, tmp_path) -> None:
    """Failure guarded: the subprocess handle forgot its adapter before posting a full push, so a
    refused push left `model` naming the base while the engine still served the adapter; the
    refusal came back as an httpx error instead of the engine's reason."""
    with EmbeddedEngine(
        tiny_model_dir, served_model_name="tiny", mode="subprocess", max_model_len=256
    ) as eng:
        sync = DiskSync(dir=str(tmp_path / "push")).bind(eng)
        assert sync.push(lora(tiny_model_dir, seed=4)) == 1 and eng.model == "tiny-lora-v1"
        before = greedy(eng)
        with pytest.raises(ValueError, match="model.norm.weight"):
            sync.push(wrong_norm(tiny_model_dir))
        assert eng.model == "tiny-lora-v1" and eng.policy_version() == 1 and same(greedy(eng), before)
        with pytest.raises(ValueError, match="lora_B"):
            sync.push(lora(tiny_model_dir, seed=5, nan=True))
        assert eng.model == "tiny-lora-v1" and eng.policy_version() == 1 and same(greedy(eng), before)
