"""`trainer.devices=2` with Lightning's ddp (gloo, CPU): on the same batch the loss and the
gradients equal one process's (global normalisation), both ranks apply the same gradient, and the
ranks trained on disjoint shares that cover the batch. The one-process reference runs here, through
`GRPOModule.update` with a plain optimiser (the same code path without Lightning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddp_step import fixed_batch, make_module

SCRIPT = Path(__file__).with_name("ddp_step.py")
TOL = 1e-5


def step(model: Path, out: Path, devices: int) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("LOCAL_RANK", None)
    cmd = [sys.executable, str(SCRIPT), "--model", str(model), "--devices", str(devices), "--out", str(out)]
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def one_process(model: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Gradients about to be applied, the loss and the sequences trained, in this process."""
    module = make_module(str(model))
    opt = module.configure_optimizers()
    grads: dict[str, torch.Tensor] = {}

    def keep(*_):
        grads.update(
            {n: p.grad.detach().clone() for n, p in module.model.named_parameters() if p.grad is not None}
        )

    opt.register_step_pre_hook(keep)
    loss = module.update(fixed_batch(), opt)["train/loss"]
    return grads, {"loss": loss, "seqs": module.trained_seqs}


@pytest.mark.slow
def test_two_ranks_loss_and_gradients_equal_one_process(tiny_model_dir, tmp_path):
    step(tiny_model_dir, tmp_path, 2)
    one, info1 = one_process(tiny_model_dir)
    ranks = [torch.load(tmp_path / f"grads-2-rank{r}.pt") for r in (0, 1)]
    info = {k: json.loads((tmp_path / f"step-{k}.json").read_text()) for k in ("2-rank0", "2-rank1")}
    info["1-rank0"] = info1

    assert set(one) == set(ranks[0]) == set(ranks[1]) and one
    worst = max(float((ranks[0][k] - one[k]).abs().max()) for k in one)
    scale = max(float(one[k].abs().max()) for k in one)
    print(f"ddp vs one process: max |grad diff| {worst:.2e} (max |grad| {scale:.2e}); losses "
          f"{info['1-rank0']['loss']:.6f} vs {info['2-rank0']['loss']:.6f}")  # fmt: skip
    assert worst < TOL and scale > 1e-3  # a real gradient, equal to the one-process one
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in one)  # both ranks step the same
    assert abs(info["2-rank0"]["loss"] - info["1-rank0"]["loss"]) < TOL
    assert info["2-rank0"]["loss"] == info["2-rank1"]["loss"]  # the loss is all-reduced
    share0, share1 = set(info["2-rank0"]["seqs"]), set(info["2-rank1"]["seqs"])
    assert share0 and share1 and not share0 & share1
    assert share0 | share1 == set(info["1-rank0"]["seqs"])
