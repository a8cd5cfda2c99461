"""The module against vLLM's CPU build, on one server (a start costs ~50 CPU seconds): its processed
logprobs match the trainer's at T=0.7 / top_p=0.5, then a disk push reloads the trained weights,
then LoRA adapters pushed over the base are served with the trainer's logprobs. The tests run in
file order: the first one needs the untrained weights the second one replaces."""

from __future__ import annotations

import httpx
import pytest
from module_rows import prompt_ids, sample_group
from test_lora import LORA, step
from test_processed_logprobs import bare
from test_weight_sync import GAP_TOL, max_gap, trained

from polar_pl.engine.vllm_engine import VLLMEngine, vllm_installed, vllm_python
from polar_pl.gateway.handle import Gateway
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import DiskSync, VLLMRoutes
from polar_pl.testing.sampling_gap import sample_records, trainer_gap

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_installed(), reason=f"no vLLM CPU build at {vllm_python()}"),
]


@pytest.fixture(scope="module")
def vllm(tiny_model_dir):
    with VLLMEngine(tiny_model_dir, served_model_name="tiny", max_model_len=2048, max_lora_rank=4) as server:
        yield server


def test_vllm_processed_logprobs_match_the_trainer(vllm, tiny_model_dir, tmp_path) -> None:
    """vLLM (launched with --logprobs-mode processed_logprobs) serving the untrained tiny model,
    whose nucleus at top_p 0.5 is thousands of tokens wide (not a near-certain token)."""
    assert vllm.policy_version() == 0
    sessions = sample_records(vllm, tmp_path / "v.db", tiny_model_dir, temperature=0.7, top_p=0.5)
    behaviour = [lp for recs in sessions for r in recs for lp in r.response_logprobs]
    gap = trainer_gap(tiny_model_dir, sessions)["train/logprob_gap_mean"]
    raw_gap = trainer_gap(tiny_model_dir, bare(sessions))["train/logprob_gap_mean"]
    mean_lp = sum(behaviour) / len(behaviour)
    print(
        f"vLLM, T=0.7 top_p=0.5: gap {gap:.2e} (settings ignored: {raw_gap:.3f}), mean logprob {mean_lp:.2f}"
    )
    assert gap < 0.01 and raw_gap > 0.05 and mean_lp < -1.0


def test_disk_push_into_vllm_cpu(vllm, tiny_model_dir, engine) -> None:
    """vLLM's CPU build reloads the pushed safetensors; its logprobs then equal the trainer's."""
    sync = DiskSync().bind(vllm)
    module = trained(tiny_model_dir, engine, sync)
    assert vllm.policy_version() == 1
    assert httpx.get(f"{vllm.url}/weight_info", timeout=10).json()["weight_version"] == "1"
    rows = sample_group(vllm, "vllm", prompt_ids(9, 4), seed=7)
    assert max_gap(module, rows) < GAP_TOL
    assert max_gap(GRPOModule(tiny_model_dir), rows) > GAP_TOL
    # The control-plane routes VLLMWeightTransferSync drives, on the real server (the data plane,
    # NCCL / IPC, needs a GPU).
    routes = VLLMRoutes(vllm.url, timeout=60)
    assert routes.world_size() == 1
    routes.pause("keep")
    assert httpx.get(f"{vllm.url}/is_paused", timeout=10).json()["is_paused"] is True
    routes.update_weight_version(7)
    routes.resume()
    assert httpx.get(f"{vllm.url}/is_paused", timeout=10).json()["is_paused"] is False
    assert httpx.get(f"{vllm.url}/weight_info", timeout=10).json()["weight_version"] == "7"
    with pytest.raises(RuntimeError, match="start_weight_update"):
        routes.start_weight_update()  # no weight-transfer backend was configured at launch


def test_lora_adapters_pushed_into_vllm_cpu(vllm, tiny_model_dir, engine, tmp_path) -> None:
    """vLLM's CPU build (--enable-lora) loads each pushed adapter under `tiny-lora-v<N>` and serves
    base + adapter with the trainer's logprobs; it keeps the newest two; the gateway asks for the
    newest and records its version from the answer's model name (vLLM tags no version)."""
    v0 = vllm.update_weights_from_disk(str(tiny_model_dir))  # back to the base the adapter trains on
    module = GRPOModule(
        tiny_model_dir, weight_sync=DiskSync().bind(vllm), settings=GRPOSettings(lr=2e-2, lora=LORA)
    )
    for seed in (3, 4, 5):
        step(module, sample_group(engine, "g", prompt_ids(6, 11), seed=seed))
    version = vllm.policy_version()
    assert version == v0 + 3 and vllm.model == f"tiny-lora-v{version}"
    listed = [c["id"] for c in httpx.get(f"{vllm.base_url}/models", timeout=10).json()["data"]]
    assert sorted(listed) == sorted(["tiny", f"tiny-lora-v{version - 1}", f"tiny-lora-v{version}"])
    rows = sample_group(vllm, "lora", prompt_ids(9, 4), seed=7)
    assert max_gap(module, rows) < GAP_TOL
    assert max_gap(GRPOModule(tiny_model_dir), rows) > GAP_TOL  # vLLM really runs the adapter
    with Gateway([vllm.url], tmp_path / "t.db") as gw:
        s = gw.create_session()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        httpx.post(f"{s.base_url}/v1/chat/completions", json=body, timeout=120).raise_for_status()
        (record,) = gw.records(s.session_id)
    assert record.normalized_request["model"] == f"tiny-lora-v{version}" and record.policy_version == version
