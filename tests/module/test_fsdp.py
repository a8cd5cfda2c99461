"""`trainer.strategy=fsdp` (FSDP2 over gloo, 2 CPU processes, module/sharding.py): one GRPO step
gives the loss and gradients of one process on the same batch, the engine receives the whole
unsharded model from the shards, `<run>/model` is exported from them, a sharded checkpoint resumes
to the same next step as an uninterrupted run, and LoRA under FSDP pushes the adapter alone.

The ranks run tests/module/fsdp_step.py, started here with LOCAL_RANK / WORLD_SIZE set (as torchrun
would); the one-process reference runs in this process through `GRPOModule.update` with a plain
optimiser, as in test_ddp.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddp_step import Counting, fixed_batch
from fsdp_step import KW
from safetensors.torch import load_file

from polar_pl.module.export import hf_from_checkpoint
from polar_pl.module.lora import LoraSpec
from polar_pl.module.settings import GRPOSettings
from polar_pl.utils.serving import free_port

SCRIPT = Path(__file__).with_name("fsdp_step.py")
TOL = 1e-5  # relative: max |difference| over max |value|


def ranks(model: Path, mode: str, out: Path, *args: str, world: int = 2) -> None:
    """fsdp_step.py once per rank; fails with the ranks' output tails if any rank fails."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(world), "NODE_RANK": "0", "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [sys.executable, str(SCRIPT), "--model", str(model), "--mode", mode, "--out", str(out), *args]
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for r in range(world)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(
        f"rank {r}:\n{log[-4000:]}" for r, log in enumerate(logs)
    )


def reference(model: Path, **extra) -> tuple[dict[str, torch.Tensor], float, Counting]:
    """One process: the gradients about to be applied, the loss, and the module after the step."""
    import lightning as L

    L.seed_everything(0, verbose=False)
    module = Counting(str(model), settings=GRPOSettings(**{**KW, **extra}))
    opt = module.configure_optimizers()
    grads: dict[str, torch.Tensor] = {}
    opt.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.detach().clone() for n, p in module.model.named_parameters() if p.grad is not None}))  # fmt: skip
    metrics = module.update(fixed_batch(), opt)
    module.last_kl_ref = metrics.get("train/kl_ref", float("nan"))
    module.last_grad_norm = metrics["train/grad_norm"]
    return grads, metrics["train/loss"], module


def applied(model: Path, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights after one step of the module's optimizer on `grads`, in one process."""
    module = Counting(str(model), settings=GRPOSettings(**KW))
    opt = module.configure_optimizers()
    for n, p in module.model.named_parameters():
        p.grad = grads[n].clone()
    opt.step()
    return module.model.state_dict()


def rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b) and a
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    return worst / max(float(b[k].float().abs().max()) for k in b)


def info(out: Path, tag: str, rank: int = 0) -> dict:
    return json.loads((out / f"{tag}-rank{rank}.json").read_text())


def assert_same_step(out: Path, tag: str, model: Path, **extra) -> tuple[float, float, Counting]:
    """The ranks' gathered gradients and loss against one process's; (grad rel diff, loss rel diff)."""
    one, loss, module = reference(model, **extra)
    grads = torch.load(out / f"{tag}-grads-0.pt")
    g, l0, l1 = rel_diff(grads, one), info(out, tag, 0), info(out, tag, 1)
    lrel = abs(l0["loss"] - loss) / abs(loss)
    print(f"fsdp vs one process ({model.name}): grad rel diff {g:.2e}, loss {l0['loss']:.8f} vs {loss:.8f} "
          f"(rel {lrel:.2e})")  # fmt: skip
    assert l0["sharded"] and l1["sharded"]
    assert g <= TOL and lrel <= TOL
    assert l0["loss"] == l1["loss"]  # all-reduced
    # the norm of the sharded gradients (a DTensor reduced over the ranks) is the whole gradient's
    assert l0["grad_norm"] == l1["grad_norm"]
    assert abs(l0["grad_norm"] - module.last_grad_norm) <= TOL * module.last_grad_norm
    share0, share1 = set(l0["seqs"]), set(l1["seqs"])
    assert share0 and share1 and not share0 & share1 and share0 | share1 == set(module.trained_seqs)
    return g, lrel, module


@pytest.mark.slow
def test_fsdp_step_equals_one_process_and_pushes_the_whole_model(tiny_model_dir, tmp_path):
    ranks(tiny_model_dir, "step", tmp_path)
    _, _, module = assert_same_step(tmp_path, "step", tiny_model_dir, kl_monitor=True)
    kl = info(tmp_path, "step")["kl_ref"]  # the sharded reference's logprobs against pi_old's
    assert abs(kl - module.last_kl_ref) <= TOL * max(abs(module.last_kl_ref), 1e-6)

    trained = torch.load(tmp_path / "step-weights.pt")  # the sharded model, gathered
    engine = torch.load(tmp_path / "engine.pt")
    assert engine["version"] == 1 and info(tmp_path, "step", 1)["version"] == 1
    # what the engine loaded is the unsharded model, exactly
    assert set(engine["weights"]) == set(trained)
    assert all(torch.equal(engine["weights"][k], trained[k]) for k in trained)
    pushed = load_file(str(tmp_path / "pushed" / "model.safetensors"))
    assert set(pushed) == set(trained) and all(torch.equal(pushed[k], trained[k]) for k in trained)
    # the sharded AdamW step is the unsharded one: the gathered gradients applied in one process
    # (AdamW's first step moves a weight by ~lr whatever its gradient's size, so a gradient that is
    # ~0 and 1e-7 apart in the two runs can move it differently: compared on the same gradients)
    expected = applied(tiny_model_dir, torch.load(tmp_path / "step-grads-0.pt"))
    worst = max(float((trained[k] - expected[k]).abs().max()) for k in expected)
    print(f"trained weights vs the same gradients applied in one process: max |diff| {worst:.2e}")
    assert worst < 1e-6

    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model")).state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    assert (tmp_path / "model" / "tokenizer_config.json").exists()


@pytest.mark.slow
def test_resume_from_a_sharded_checkpoint_equals_continuing(tiny_model_dir, tmp_path):
    ranks(tiny_model_dir, "resume", tmp_path)
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    assert ckpt.is_dir() and len(list(ckpt.glob("*.distcp"))) == 2  # one shard file per rank
    continued, resumed = (torch.load(tmp_path / f"{t}-weights.pt") for t in ("continued", "resumed"))
    assert info(tmp_path, "resumed")["optimizer_steps"] == info(tmp_path, "continued")["optimizer_steps"] == 2
    worst = max(float((continued[k] - resumed[k]).abs().max()) for k in continued)
    moved = max(
        float((continued[k] - torch.load(tmp_path / "first-weights.pt")[k]).abs().max()) for k in continued
    )
    print(
        f"resumed vs continued after step 2: max |diff| {worst:.2e} (step 2 moved weights by up to {moved:.2e})"
    )
    assert worst == 0.0 and moved > 1e-3
    assert info(tmp_path, "resumed")["loss"] == info(tmp_path, "continued")["loss"]
    # the engine (started from the initial model) got the checkpoint's weights before the first
    # batch: under FSDP Lightning restores after on_fit_start, so the resume push waits for it
    first = torch.load(tmp_path / "first-weights.pt")
    at_start = torch.load(tmp_path / "engine-at-start.pt")
    assert at_start["version"] == 1
    assert all(torch.equal(at_start["weights"][k], first[k]) for k in first)

    # the sharded checkpoint as one HF folder (`polar-pl eval eval.ckpt_path=<folder>`)
    from transformers import AutoModelForCausalLM

    out = hf_from_checkpoint(ckpt, tiny_model_dir, tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert all(torch.equal(exported[k], first[k]) for k in first)


@pytest.mark.slow
def test_lora_under_fsdp_pushes_only_the_adapter(tiny_model_dir, tmp_path):
    lora = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    ranks(tiny_model_dir, "lora", tmp_path)
    one, loss, module = reference(tiny_model_dir, lora=lora)
    grads = torch.load(tmp_path / "lora-grads-0.pt")
    g, got = rel_diff(grads, one), info(tmp_path, "lora")
    print(
        f"lora fsdp vs one process: grad rel diff {g:.2e}, loss rel diff {abs(got['loss'] - loss) / abs(loss):.2e}"
    )
    assert g <= TOL and abs(got["loss"] - loss) / abs(loss) <= TOL
    assert set(grads) == {n for n, p in module.model.named_parameters() if p.requires_grad}  # adapter only

    adapter = torch.load(tmp_path / "lora-adapter.pt")  # gathered from the shards
    assert adapter and all("lora_" in k for k in adapter)
    assert got["pushed_bytes"] == sum(t.numel() * t.element_size() for t in adapter.values())
    engine = torch.load(tmp_path / "engine.pt")
    assert engine["version"] == 1 and "-lora-" in engine["model"]  # serving base + the pushed adapter
    from polar_pl.module.lora import adapter_state

    ref_adapter = adapter_state(module.peft_model)[0]
    assert rel_diff(adapter, ref_adapter) < 1e-4
    assert (tmp_path / "adapter" / "adapter_config.json").exists()  # ExportModel from the shards

    # the sharded checkpoint keeps the adapter alone, and converts to the merged model
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    assert ckpt.is_dir()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(
        str(hf_from_checkpoint(ckpt, tiny_model_dir, tmp_path / "hf"))
    )
    expected = module.peft_model.merge_and_unload().state_dict()
    worst = max(float((merged.state_dict()[k] - expected[k]).abs().max()) for k in expected)
    assert worst < 1e-4, worst


@pytest.mark.slow
def test_smollm2_fsdp_step_equals_one_process(smollm2_model_dir, tmp_path):
    """In float64: in float32, summing the ranks' micro-batch gradients in another order than one
    process does moves SmolLM2's layer norms' gradients by up to 5e-5 of the largest gradient,
    under DDP exactly as under FSDP (FSDP and DDP agree to 1.4e-6); float64 leaves the math."""
    ranks(smollm2_model_dir, "grads", tmp_path, "--dtype", "float64")
    assert_same_step(tmp_path, "grads", smollm2_model_dir, dtype="float64", micro_batch_size=2)
