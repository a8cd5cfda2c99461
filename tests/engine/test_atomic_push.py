"""A weight or adapter push that fails its check changes nothing (issue 58): the embedded engine's
admin routes answer 4xx, and the engine keeps serving exactly what it served (greedy logprobs to
1e-6, token ids), under the same policy version, with its prefix cache intact. A push that passes
bumps the version as before."""

from __future__ import annotations

import httpx
import pytest
import torch

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.weights import save_adapter, save_state_dict

PROMPT = list(range(200, 240))
LAST = "model.norm.weight"  # sorts last among the checkpoint's names: loaded (and copied) last


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with EmbeddedEngine(tiny_model_dir, served_model_name="tiny", max_batch_size=4, max_model_len=512) as eng:
        yield eng


def greedy(engine: EmbeddedEngine, model: str | None = None) -> tuple[list[int], list[float]]:
    body = {"model": model or engine.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "logprobs": 0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    r = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def stats(engine: EmbeddedEngine) -> dict:
    return httpx.get(f"{engine.url}/stats", timeout=10).json()


def post(engine: EmbeddedEngine, route: str, path) -> httpx.Response:
    auth = {"authorization": f"Bearer {engine.admin_token}"}
    return httpx.post(f"{engine.url}/{route}", json={"path": str(path)}, headers=auth, timeout=120)


def perturbed(engine: EmbeddedEngine, seed: int) -> dict[str, torch.Tensor]:
    """Every weight of the engine's model moved by noise: valid, and different from what it serves."""
    g = torch.Generator().manual_seed(seed)
    state = engine.backend.model.state_dict()
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in state.items()}


BAD_TENSORS = {
    "wrong shape": lambda t: torch.zeros(3, 3),
    "not finite": lambda t: torch.where(torch.arange(t.numel()).view(t.shape) == 7, torch.nan, t),
    "integer dtype": lambda t: torch.ones(t.shape, dtype=torch.int64),
}


def assert_unchanged(engine, before, version, cache) -> None:
    ids, lps = greedy(engine)
    assert ids == before[0]
    assert max(abs(a - b) for a, b in zip(lps, before[1], strict=True)) < 1e-6, (lps, before[1])
    assert engine.policy_version() == version
    after = stats(engine)
    assert after["prefix_cache_entries"] == cache["prefix_cache_entries"] > 0
    assert after["prefix_cache_hits"] > cache["prefix_cache_hits"]  # the KV cached before was reused


@pytest.mark.parametrize("bad", list(BAD_TENSORS))
def test_a_weight_folder_with_one_bad_tensor_changes_nothing(engine, tmp_path, bad) -> None:
    """Failure guarded: the route checked names, then copied tensor by tensor and found the last
    one's shape wrong after copying the others (logprobs moved by up to 0.37 under the old version,
    with the old KV still cached); a NaN or an integer tensor was not checked at all."""
    before = greedy(engine)
    version, cache = engine.policy_version(), stats(engine)
    state = perturbed(engine, seed=1)
    state[LAST] = BAD_TENSORS[bad](state.pop(LAST))
    save_state_dict(state, tmp_path)
    r = post(engine, "update_weights_from_disk", tmp_path)
    assert r.status_code == 400, r.text
    assert LAST in r.json()["error"]["message"] and r.json()["error"]["param"] == "path"
    assert_unchanged(engine, before, version, cache)
    # the same folder with the tensor fixed loads, bumps the version and clears the prefix cache
    state[LAST] = engine.backend.model.state_dict()[LAST].clone()
    save_state_dict(state, tmp_path)
    assert post(engine, "update_weights_from_disk", tmp_path).json()["policy_version"] == version + 1
    assert stats(engine)["prefix_cache_entries"] == 0 and greedy(engine)[1] != before[1]


def adapter(engine: EmbeddedEngine, seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """A LoRA adapter (PEFT names) on q_proj and v_proj of every layer, random A and B."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in engine.backend.model.named_parameters():
        if name.endswith(("q_proj.weight", "v_proj.weight")):
            module = f"base_model.model.{name.removesuffix('.weight')}"
            tensors[f"{module}.lora_A.weight"] = 0.1 * torch.randn(4, p.shape[1], generator=g)
            tensors[f"{module}.lora_B.weight"] = 0.1 * torch.randn(p.shape[0], 4, generator=g)
    return tensors, {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


@pytest.mark.parametrize("bad", ["not finite", "integer dtype"])
def test_an_adapter_folder_with_one_bad_tensor_changes_nothing(engine, tmp_path, bad) -> None:
    """Failure guarded: an adapter whose last lora_B held a NaN (or integers) was merged into the
    weights: the engine answered 200 under a new version and served NaN logprobs."""
    tensors, config = adapter(engine, seed=2)
    good = post(engine, "update_adapter_from_disk", save_adapter(tensors, config, tmp_path / "good"))
    assert good.status_code == 200 and good.json()["model"] == engine.model
    before = greedy(engine)
    version, cache = engine.policy_version(), stats(engine)
    last = sorted(tensors)[-1]
    assert last.endswith("lora_B.weight")
    wrong, _ = adapter(engine, seed=3)
    wrong[last] = BAD_TENSORS[bad](wrong[last])
    r = post(engine, "update_adapter_from_disk", save_adapter(wrong, config, tmp_path / "bad"))
    assert r.status_code == 400, r.text
    assert last in r.json()["error"]["message"]
    assert_unchanged(engine, before, version, cache)
    assert engine.model.endswith(f"-lora-v{version}")
