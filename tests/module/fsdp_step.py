"""GRPO steps through Lightning with `trainer.strategy=fsdp` (FSDP2, gloo on CPU) on the fixed batch
of ddp_step.py, for tests/module/test_fsdp.py. Run once per rank (tests/module/test_fsdp.py starts
the ranks with LOCAL_RANK / WORLD_SIZE set, so Lightning launches nothing and one process can fit
several times):

    grads:  one step, no push, in --dtype, two sequences per micro-batch: the gradients about to
            be applied (gathered) and the loss;
    step:   one step (KL to the sharded reference monitored); the gradients about to be applied
            (gathered), the loss, what the engine holds
            after the push (a DiskSync folder, rank 0's embedded engine), the trained weights
            (gathered), and `<out>/model` exported by ExportModel;
    resume: two steps uninterrupted; then one step that saves a sharded checkpoint, and a second
            run resumed from it, pushing to rank 0's engine; the weights after each (gathered),
            and what the engine serves when the resumed run's first batch starts;
    lora:   one LoRA step and its sharded checkpoint; the adapter gathered, and what the engine got.

    python tests/module/fsdp_step.py --model DIR --mode step --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning as L
import torch
from ddp_step import Counting, OneBatch
from lightning.pytorch.callbacks import ModelCheckpoint

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.module.export import ExportModel
from polar_pl.module.gather import full
from polar_pl.module.lora import LoraSpec, adapter_state
from polar_pl.module.settings import GRPOSettings
from polar_pl.module.sharding import FSDPStrategy
from polar_pl.module.weight_sync import DiskSync, EmbeddedStateDictSync, hf_state_dict

# the module's settings here and in the one-process reference (activation checkpointing as configured)
KW = {"lr": 1e-2, "grad_clip": None, "micro_batch_size": 1, "filter_zero_variance": False, "tis": None,
      "gradient_checkpointing": True}  # fmt: skip


class Record(L.Callback):
    """Gradients before the optimizer step and the weights at the end, gathered on every rank
    (collectives), saved by rank 0 under `<out>/<tag>-*`."""

    def __init__(self, out: Path, tag: str) -> None:
        self.out, self.tag = out, tag

    def _save(self, trainer, obj, name: str) -> None:
        if trainer.global_rank == 0:
            torch.save(obj, self.out / f"{self.tag}-{name}")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = {n: full(p.grad).clone() for n, p in pl_module.model.named_parameters() if p.grad is not None}
        self._save(trainer, grads, f"grads-{pl_module.optimizer_steps}.pt")

    def on_train_end(self, trainer, pl_module) -> None:
        self._save(trainer, hf_state_dict(pl_module.model), "weights.pt")
        if pl_module.settings.lora is not None:
            self._save(trainer, adapter_state(pl_module.peft_model)[0], "adapter.pt")
        m = trainer.callback_metrics
        info = {"loss": float(m["train/loss"]), "kl_ref": float(m.get("train/kl_ref", float("nan"))),
                "grad_norm": float(m["train/grad_norm"]),
                "seqs": pl_module.trained_seqs,
                "optimizer_steps": pl_module.optimizer_steps, "sharded": pl_module.sharded,
                "version": pl_module.own_version, "pushed_bytes": getattr(pl_module.weight_sync, "pushed_bytes", 0)}  # fmt: skip
        (self.out / f"{self.tag}-rank{trainer.global_rank}.json").write_text(json.dumps(info))


class EngineAtStart(L.Callback):
    """What rank 0's engine serves when the first batch starts (weights and version)."""

    def __init__(self, engine: EmbeddedEngine, out: Path) -> None:
        self.engine, self.out, self.done = engine, out, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and not self.done:
            self.done = True
            torch.save(served(self.engine), self.out / "engine-at-start.pt")


def served(engine: EmbeddedEngine) -> dict:
    assert engine.backend is not None  # thread mode
    state = {k: v.clone() for k, v in engine.backend.model.state_dict().items()}
    return {"weights": state, "model": engine.model, "version": engine.policy_version()}


def fit(module: Counting, out: Path, tag: str, steps: int, *, ckpt_dir: Path | None = None,
        ckpt_path: str | None = None, callbacks: tuple = ()) -> L.Trainer:  # fmt: skip
    extra = (
        [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_last=True, save_top_k=-1)]
        if ckpt_dir
        else []
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=FSDPStrategy(), max_steps=steps, logger=False,
        enable_checkpointing=ckpt_dir is not None, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Record(out, tag), *extra, *callbacks], default_root_dir=out,
    )  # fmt: skip
    trainer.fit(module, datamodule=OneBatch(), ckpt_path=ckpt_path)
    return trainer


def engine_for(model: str, rank: int) -> EmbeddedEngine:
    """Rank 0's engine, started; the other ranks bind one they never call (only rank 0 pushes)."""
    engine = EmbeddedEngine(model, served_model_name="policy", max_batch_size=4, max_model_len=256)
    return engine.start() if rank == 0 else engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=("grads", "step", "resume", "lora"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default=None)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    kw = KW
    L.seed_everything(0, verbose=False)
    if a.mode == "grads":
        fit(
            Counting(a.model, settings=GRPOSettings(**{**kw, "dtype": a.dtype, "micro_batch_size": 2})),
            out,
            "grads",
            1,
        )
        return
    rank = int(os.environ["LOCAL_RANK"])
    if a.mode == "resume":
        fit(Counting(a.model, settings=GRPOSettings(**kw)), out, "continued", 2)
        fit(Counting(a.model, settings=GRPOSettings(**kw)), out, "first", 1, ckpt_dir=out / "ckpt")
        engine = engine_for(a.model, rank)
        try:
            module = Counting(a.model, weight_sync=DiskSync().bind(engine), settings=GRPOSettings(**kw))
            fit(module, out, "resumed", 2, ckpt_path=str(out / "ckpt" / "last.ckpt"),
                callbacks=(EngineAtStart(engine, out),))  # fmt: skip
        finally:
            if rank == 0:
                engine.stop()
        return
    import torch.distributed as dist

    engine = engine_for(a.model, rank)
    try:
        if a.mode == "step":
            sync = DiskSync(dir=str(out / "pushed"))
            # kl_monitor: the frozen reference is sharded too, and runs a forward every step
            module = Counting(
                a.model, weight_sync=sync.bind(engine), settings=GRPOSettings(kl_monitor=True, **kw)
            )
            fit(module, out, "step", 1, callbacks=(ExportModel(str(out / "model")),))
        else:
            sync = EmbeddedStateDictSync()
            lora = LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
            module = Counting(a.model, weight_sync=sync.bind(engine), settings=GRPOSettings(lora=lora, **kw))
            fit(module, out, "lora", 1, ckpt_dir=out / "ckpt", callbacks=(ExportModel(str(out / "model")),))
        if rank == 0:
            torch.save(served(engine), out / "engine.pt")
        dist.barrier()
    finally:
        if rank == 0:
            engine.stop()


if __name__ == "__main__":
    main()
