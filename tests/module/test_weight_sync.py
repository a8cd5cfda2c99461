"""Weight push into real engines: the embedded engine in-process (state dict and disk), vLLM's CPU
build from disk (test_vllm_cpu.py), the no-push control, and the errors of an unbound or unavailable sync."""

from __future__ import annotations

import httpx
import pytest
import torch
from module_rows import prompt_ids, sample_group

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import scorable, token_logprobs
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import (
    DiskSync,
    EmbeddedStateDictSync,
    NoSync,
    VLLMWeightTransferSync,
    WeightSync,
)

GAP_TOL = 0.01


def greedy(engine, prompt: list[int]) -> tuple[list[float], int]:
    """Logprobs of a greedy completion of `prompt`, and the version that answered."""
    body = {"model": engine.model, "prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 0,
            "ignore_eos": True}  # fmt: skip
    r = httpx.post(f"{engine.base_url}/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["logprobs"]["token_logprobs"], int(r.headers["x-policy-version"])


def trained(tiny_model_dir, engine, sync: WeightSync | None = None) -> GRPOModule:
    """A module after one GRPO step (lr large enough that the engine's answers visibly change)."""
    module = GRPOModule(tiny_model_dir, weight_sync=sync, settings=GRPOSettings(lr=1e-2))
    rows = sample_group(engine, "g", prompt_ids(6, 11), seed=3)
    m = module.update(collate(rows, token_budget=64), module.configure_optimizers())
    assert m["train/optimizer_steps"] == 1.0
    return module


def max_gap(module: GRPOModule, rows) -> float:
    """Largest |trainer logprob - engine logprob| over the sampled tokens of `rows`."""
    batch = collate(rows, token_budget=64)
    with torch.no_grad():
        logp, _ = token_logprobs(module.model, batch.input_ids, batch.position_ids)
    sel = (batch.loss_mask > 0) & scorable(batch.position_ids)
    return float((logp.double() - batch.behavior_logprobs)[sel].abs().max())


def test_protocol_is_implemented() -> None:
    for sync in (EmbeddedStateDictSync(), DiskSync(), NoSync(), VLLMWeightTransferSync()):
        assert isinstance(sync, WeightSync) and sync.engine is None


def test_state_dict_push_changes_engine_logprobs_and_bumps_version(tiny_model_dir, fresh_engine) -> None:
    prompt = prompt_ids(8, 21)
    before, v0 = greedy(fresh_engine, prompt)
    module = trained(tiny_model_dir, fresh_engine, EmbeddedStateDictSync().bind(fresh_engine))
    after, v1 = greedy(fresh_engine, prompt)
    assert v1 == v0 + 1 == fresh_engine.policy_version() == module.current_version()
    assert after != pytest.approx(before, abs=1e-4)
    # Samples taken now carry the new version and match the trainer's weights.
    rows = sample_group(fresh_engine, "after", prompt, seed=5)
    assert {v for r in rows for v in r.policy_version if v >= 0} == {v1}
    assert max_gap(module, rows) < GAP_TOL


def test_disk_push_engine_logprobs_equal_trainer(tiny_model_dir, fresh_engine, tmp_path) -> None:
    sync = DiskSync(dir=str(tmp_path / "weights")).bind(fresh_engine)
    v0 = fresh_engine.policy_version()
    module = trained(tiny_model_dir, fresh_engine, sync)
    assert fresh_engine.policy_version() == v0 + 1
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["model.safetensors"]
    rows = sample_group(fresh_engine, "disk", prompt_ids(9, 4), seed=7)
    assert max_gap(module, rows) < GAP_TOL
    # The engine really runs the new weights: the initial model no longer matches its samples.
    assert max_gap(GRPOModule(tiny_model_dir), rows) > GAP_TOL
    temp = trained(tiny_model_dir, fresh_engine, DiskSync().bind(fresh_engine))  # temporary directory
    assert fresh_engine.policy_version() == v0 + 2
    assert max_gap(temp, sample_group(fresh_engine, "tmp", prompt_ids(9, 4), seed=8)) < GAP_TOL


def test_bind_engine_binds_the_sync(tiny_model_dir, engine) -> None:
    module = GRPOModule(tiny_model_dir, weight_sync=DiskSync())
    module.bind_engine(engine)
    assert module.weight_sync.engine is engine and module.current_version() == engine.policy_version()
    GRPOModule(tiny_model_dir).bind_engine(engine)  # no sync: nothing to bind, no error


def test_fit_binds_the_datamodules_push_target_and_never_the_raw_engine(
    tiny_model_dir, engine, tmp_path
) -> None:
    """on_fit_start used to fall back to `datamodule.engine`, which skips the gateway pause and the
    policy-version hint; the sync is now bound to the rollout runtime's `push_target()` or the fit
    fails."""
    import lightning as L

    class EngineOnly(L.LightningDataModule):
        def __init__(self) -> None:
            super().__init__()
            self.engine = engine

        def train_dataloader(self):
            return [None]

    trainer = L.Trainer(accelerator="cpu", max_steps=1, default_root_dir=tmp_path, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    module = GRPOModule(tiny_model_dir, weight_sync=DiskSync())
    with pytest.raises(ValueError, match="no rollout runtime feeds the trainer"):
        trainer.fit(module, datamodule=EngineOnly())
    assert module.weight_sync.engine is None


def test_no_sync_keeps_weights_and_version(tiny_model_dir, fresh_engine) -> None:
    prompt = prompt_ids(8, 22)
    before, v0 = greedy(fresh_engine, prompt)
    module = trained(tiny_model_dir, fresh_engine, NoSync().bind(fresh_engine))
    after, v1 = greedy(fresh_engine, prompt)
    # equal up to numerics: a cached prompt prefix is not recomputed bit for bit
    assert v1 == v0 and after == pytest.approx(before, abs=1e-5) and module.current_version() == v0


def test_unbound_or_unavailable_sync_errors(tiny_model_dir, engine) -> None:
    with pytest.raises(RuntimeError, match=r"bind\(engine\)"):
        trained(tiny_model_dir, engine, DiskSync())
    with pytest.raises(RuntimeError, match="DiskSync"):  # vllm is not importable in the trainer env here
        VLLMWeightTransferSync().bind(engine).push(torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="backend"):
        VLLMWeightTransferSync(backend="rdma")
    with pytest.raises(ValueError, match="dtype"):
        DiskSync(dtype="float33")
