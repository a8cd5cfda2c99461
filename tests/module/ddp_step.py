"""One GRPO step through Lightning on a fixed batch, in 1 or N processes (`strategy=ddp`, gloo on
CPU), for tests/module/test_ddp.py. Each rank saves the gradients the optimiser is about to apply,
the logged loss, and the sequences it ran forward/backward on.

    python tests/module/ddp_step.py --model DIR --devices 2 --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning as L
import torch
from synthetic import mixed_rows, row
from torch.utils.data import DataLoader

from polar_pl.datamodule.collate import collate
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings


def fixed_batch():
    """Packed sequences of unequal groups, split rollouts and side rows (token budget 14)."""
    rows = mixed_rows() + [row(f"c{i}", "c", float(i % 2), [(2, 6)], 8) for i in range(4)]
    return collate(rows, token_budget=14)


class OneBatch(L.LightningDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader([fixed_batch()], batch_size=None)


class Record(L.Callback):
    def __init__(self, out: Path, devices: int) -> None:
        self.out, self.devices = out, devices

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = {
            n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters() if p.grad is not None
        }
        torch.save(grads, self.out / f"grads-{self.devices}-rank{trainer.global_rank}.pt")

    def on_train_end(self, trainer, pl_module) -> None:
        info = {"loss": float(trainer.callback_metrics["train/loss"]), "seqs": pl_module.trained_seqs}
        (self.out / f"step-{self.devices}-rank{trainer.global_rank}.json").write_text(json.dumps(info))


class Counting(GRPOModule):
    """Records which sequences this rank trained on (its share)."""

    trained_seqs: list[int]

    def _micro_step(self, targets, idx, *args, **kwargs) -> None:
        self.trained_seqs = [*getattr(self, "trained_seqs", []), *idx.tolist()]
        super()._micro_step(targets, idx, *args, **kwargs)


def make_module(model: str) -> Counting:
    L.seed_everything(0, verbose=False)
    return Counting(
        model,
        settings=GRPOSettings(
            lr=1e-2, grad_clip=None, micro_batch_size=1, filter_zero_variance=False, tis=None
        ),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    module = make_module(a.model)
    trainer = L.Trainer(
        accelerator="cpu", devices=a.devices, strategy="ddp" if a.devices > 1 else "auto", max_steps=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Record(out, a.devices)],
    )  # fmt: skip
    trainer.fit(module, datamodule=OneBatch())


if __name__ == "__main__":
    main()
