"""LoRA (`module.lora`) on the tiny model with the real embedded engine: only the adapter trains,
is checkpointed and resumed; the KL reference is the base; the engine serves base + adapter with
the trainer's logprobs, in-process and through the subprocess engine's route; the gateway asks for
the adapter and records its version; the export loads in PEFT and transformers."""

from __future__ import annotations

import json

import httpx
import lightning as L
import openai
import pytest
import torch
from module_rows import prompt_ids, sample_group
from test_grpo import BUDGET, Batches
from test_weight_sync import GAP_TOL, max_gap

from polar_pl.datamodule.collate import collate
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.gateway.handle import Gateway
from polar_pl.module.export import ExportModel, export_merged, hf_from_checkpoint
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import scorable, token_logprobs
from polar_pl.module.lora import LoraSpec
from polar_pl.module.losses import kl_k3
from polar_pl.module.model import load_model
from polar_pl.module.prepare import prepare
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.weight_sync import (
    DiskSync,
    EmbeddedStateDictSync,
    VLLMWeightTransferSync,
    hf_state_dict,
    nbytes,
)

LORA = LoraSpec(rank=4, alpha=8)


def lora_module(tiny_model_dir, sync=None, **kw) -> GRPOModule:
    return GRPOModule(tiny_model_dir, weight_sync=sync, settings=GRPOSettings(lr=2e-2, lora=LORA, **kw))


def step(module: GRPOModule, rows) -> dict[str, float]:
    m = module.update(collate(rows, token_budget=BUDGET), module.configure_optimizers())
    assert m["train/optimizer_steps"] >= 1.0
    return m


def logprobs(model, rows) -> torch.Tensor:
    """The sampled tokens' logprobs of `rows` under `model`."""
    batch = collate(rows, token_budget=BUDGET)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.input_ids, batch.position_ids)
    return logp[(batch.loss_mask > 0) & scorable(batch.position_ids)]


def test_bad_lora_config_names_the_key(tiny_model_dir) -> None:
    assert LoraSpec.from_config({"rank": None, "alpha": 32}) is None  # full fine-tuning
    for cfg, key in (
        ({"rank": 0}, "module.lora.rank"), ({"rank": "8"}, "module.lora.rank"),
        ({"rank": 8, "alpha": -1}, "module.lora.alpha"), ({"rank": 8, "dropout": 1.0}, "module.lora.dropout"),
        ({"rank": 8, "target_modules": []}, "module.lora.target_modules"), ({"rank": 8, "lr": 0}, "module.lora.lr"),
        ({"rank": 8, "ranks": 8}, "module.lora.ranks: unknown key"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=key):
            LoraSpec.from_config(cfg)
    with pytest.raises(ValueError, match="module.lora.target_modules=.*no_such_proj"):
        GRPOModule(
            tiny_model_dir, settings=GRPOSettings(lora=LoraSpec(rank=4, target_modules=("no_such_proj",)))
        )
    with pytest.raises(ValueError, match="VLLMWeightTransferSync cannot push a LoRA adapter"):
        GRPOModule(tiny_model_dir, weight_sync=VLLMWeightTransferSync(), settings=GRPOSettings(lora=LORA))


def test_only_the_adapter_trains_and_is_checkpointed(tiny_model_dir, rows) -> None:
    module = lora_module(tiny_model_dir)
    base = {n: p.detach().clone() for n, p in module.model.named_parameters() if "lora_" not in n}
    opt = module.configure_optimizers()
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    names = {n for n, p in module.model.named_parameters() if id(p) in in_opt}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    trainable = sum(p.numel() for g in opt.param_groups for p in g["params"])
    total = sum(p.numel() for p in module.model.parameters())
    assert trainable < 0.1 * total, (trainable, total)
    module.update(collate(rows, token_budget=BUDGET), opt)
    # the optimizer holds state for the adapter alone, and the base did not move
    assert len(opt.state) == len(names) and all(id(p) in in_opt for p in opt.state)
    now = dict(module.model.named_parameters())
    assert all(torch.equal(base[n], now[n]) for n in base)
    assert any(now[n].abs().sum() > 0 for n in names if ".lora_B." in n)  # B starts at 0
    # a checkpoint keeps the adapter only (the base is module.model_dir)
    keys = set(module.state_dict())
    assert keys == {f"model.{n}" for n in names}


def test_kl_reference_is_the_base_with_the_adapter_off(tiny_model_dir, rows) -> None:
    module = lora_module(tiny_model_dir, kl=kl_k3, kl_coef=0.1)
    assert module._ref is None  # no second copy of the model
    step(module, rows)
    batch = collate(rows, token_budget=BUDGET)
    sel = (batch.loss_mask > 0) & scorable(batch.position_ids)
    module.model.train()
    ref = module._ref_logprobs(batch, prepare(batch).sampling)[sel]
    assert module.model.training  # its mode is given back, and the adapter is on again
    base = logprobs(load_model(tiny_model_dir), rows)
    assert torch.allclose(ref, base, atol=1e-5)
    policy = logprobs(module.model.eval(), rows)
    assert (policy - base).abs().max() > 1e-3  # the adapter moved the policy away from it
    m = step(module, rows)
    assert m["train/kl"] > 0


def test_engine_serves_base_plus_adapter_with_the_trainers_logprobs(tiny_model_dir, fresh_engine) -> None:
    sync = EmbeddedStateDictSync().bind(fresh_engine)
    module = lora_module(tiny_model_dir, sync)
    v0 = fresh_engine.policy_version()
    m = step(module, sample_group(fresh_engine, "g", prompt_ids(6, 11), seed=3))
    full_mb = nbytes(hf_state_dict(load_model(tiny_model_dir))) / 1e6
    assert 0 < m["train/push_mb"] < 0.1 * full_mb  # the adapter alone
    v1 = fresh_engine.policy_version()
    assert v1 == v0 + 1 and fresh_engine.model == f"tiny-lora-v{v1}"
    cards = httpx.get(f"{fresh_engine.base_url}/models", timeout=10).json()["data"]
    assert [c["id"] for c in cards] == ["tiny", f"tiny-lora-v{v1}"]
    rows = sample_group(fresh_engine, "after", prompt_ids(9, 4), seed=7)
    assert {v for r in rows for v in r.policy_version if v >= 0} == {v1}
    assert max_gap(module, rows) < GAP_TOL
    assert max_gap(GRPOModule(tiny_model_dir), rows) > GAP_TOL  # the engine runs the adapter
    # the next push starts from the base again: the engine equals base + the newest adapter only
    step(module, rows)
    again = sample_group(fresh_engine, "again", prompt_ids(9, 4), seed=8)
    assert max_gap(module, again) < GAP_TOL
    # a full push replaces the base and drops the adapter
    fresh_engine.update_weights_from_state_dict(load_model(tiny_model_dir).state_dict())
    assert fresh_engine.model == "tiny"
    assert max_gap(GRPOModule(tiny_model_dir), sample_group(fresh_engine, "base", prompt_ids(9, 4))) < GAP_TOL


def test_subprocess_engine_loads_the_adapter_folder(tiny_model_dir, tmp_path) -> None:
    """DiskSync writes PEFT's folder; the engine process loads it over its admin route."""
    with EmbeddedEngine(
        tiny_model_dir, served_model_name="tiny", mode="subprocess", max_model_len=512
    ) as eng:
        sync = DiskSync(dir=str(tmp_path / "push")).bind(eng)
        module = lora_module(tiny_model_dir, sync)
        step(module, sample_group(eng, "g", prompt_ids(6, 11), seed=3))
        assert sorted(p.name for p in (tmp_path / "push").iterdir()) == [
            "adapter_config.json", "adapter_model.safetensors",
        ]  # fmt: skip
        assert eng.model == "tiny-lora-v1"
        rows = sample_group(eng, "after", prompt_ids(9, 4), seed=7)
        assert max_gap(module, rows) < GAP_TOL
        # weights come from the trainer only: no token, no push; a folder that is not an adapter: 400
        url = f"{eng.url}/update_adapter_from_disk"
        assert httpx.post(url, json={"path": str(tmp_path / "push")}, timeout=30).status_code == 401
        bad = httpx.post(url, json={"path": str(tmp_path)}, timeout=30,
                         headers={"authorization": f"Bearer {eng.admin_token}"})  # fmt: skip
        assert bad.status_code == 400 and "adapter_model.safetensors" in bad.json()["error"]["message"]
        assert eng.policy_version() == 1


def test_gateway_asks_for_the_newest_adapter_and_records_its_version(
    tiny_model_dir, fresh_engine, tmp_path
) -> None:
    with Gateway([fresh_engine.url], tmp_path / "t.db") as gw:
        s = gw.create_session()
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        ask = [{"role": "user", "content": "hi"}]
        first = client.chat.completions.create(model="whatever", messages=ask, max_tokens=4)
        module = lora_module(tiny_model_dir, EmbeddedStateDictSync().bind(fresh_engine))
        step(module, sample_group(fresh_engine, "g", prompt_ids(6, 11), seed=3))
        version = fresh_engine.policy_version()
        gw.set_policy_version(version)
        second = client.chat.completions.create(model="whatever", messages=ask, max_tokens=4)
        records = gw.records(s.session_id)
    assert first.model == second.model == "whatever"  # the harness gets the name it asked for
    assert [r.normalized_request["model"] for r in records] == ["tiny", f"tiny-lora-v{version}"]
    assert [r.policy_version for r in records] == [version - 1, version]


def test_resume_from_a_lora_checkpoint(tiny_model_dir, fresh_engine, rows, tmp_path) -> None:
    pushed: list[dict[str, torch.Tensor]] = []

    class Recording(EmbeddedStateDictSync):
        def push(self, model):
            named = model.named_parameters()  # a PeftModel's: base_model.model.<HF name>
            pushed.append(
                {n.removeprefix("base_model.model."): p.detach().clone() for n, p in named if "lora_" in n}
            )
            return super().push(model)

    def fit(max_steps: int, ckpt_path=None, lora=LORA) -> GRPOModule:
        module = GRPOModule(
            tiny_model_dir, weight_sync=Recording(), settings=GRPOSettings(lr=2e-2, lora=lora)
        )
        trainer = L.Trainer(
            accelerator="cpu", max_steps=max_steps, default_root_dir=tmp_path, logger=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        batches = [collate(rows, token_budget=BUDGET) for _ in range(max_steps)]
        trainer.fit(module, datamodule=Batches(fresh_engine, batches), ckpt_path=ckpt_path)
        return module

    first = fit(1)
    (ckpt,) = tmp_path.glob("checkpoints/*.ckpt")
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert all(".lora_" in k for k in saved["state_dict"]) and saved["grpo"]["lora"]["rank"] == 4
    trained = {n: p.detach().clone() for n, p in first.model.named_parameters() if "lora_" in n}
    pushed.clear()
    resumed = fit(2, ckpt_path=str(ckpt))
    assert resumed.optimizer_steps == 2
    assert all(torch.equal(trained[n], pushed[0][n]) for n in trained)  # the restored adapter first
    assert any(not torch.equal(trained[n], p) for n, p in pushed[-1].items())  # then trained on
    with pytest.raises(ValueError, match="LoRA rank 4.*module.lora.rank=None"):
        fit(2, ckpt_path=str(ckpt), lora=None)


def test_export_writes_the_adapter_and_the_merged_model(tiny_model_dir, rows, tmp_path) -> None:
    """<run>/adapter loads with PEFT over the base; the merged folder and a LoRA checkpoint's
    conversion load as plain transformers models; all three give the trainer's logprobs."""
    from peft import PeftModel

    module = lora_module(tiny_model_dir)
    step(module, rows)
    module.eval()
    want = logprobs(module.model, rows)

    class Run:  # what ExportModel reads from the trainer
        global_rank, datamodule = 0, None

    ExportModel(str(tmp_path / "model"), str(tmp_path / "adapter")).on_fit_end(Run(), module)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file() and not (
        tmp_path / "model"
    ).exists()
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    peft = PeftModel.from_pretrained(load_model(tiny_model_dir), str(tmp_path / "adapter")).eval()
    assert torch.allclose(logprobs(peft.base_model.model, rows), want, atol=1e-5)  # the HF model inside
    merged = export_merged(tmp_path / "adapter", tiny_model_dir, tmp_path / "merged")
    assert torch.allclose(logprobs(load_model(merged), rows), want, atol=1e-4)
    ckpt = {"state_dict": module.state_dict()}  # what Lightning writes (test_resume_from_a_lora_checkpoint)
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, tmp_path / "lora.ckpt")
    from_ckpt = hf_from_checkpoint(tmp_path / "lora.ckpt", tiny_model_dir, tmp_path / "from-ckpt")
    assert torch.allclose(logprobs(load_model(from_ckpt), rows), want, atol=1e-4)
