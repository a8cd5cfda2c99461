"""The trained policy as a plain Hugging Face folder that transformers, vLLM and `polar-pl engine`
load: weights (safetensors) and config from the model, tokenizer, chat template and generation
config from the folder it was trained from. Also what turns a training checkpoint into such a
folder (`polar-pl eval eval.ckpt_path=...`).

A LoRA run (`module.lora`) exports its adapter as PEFT writes it (`<run>/adapter/`:
`PeftModel.from_pretrained(base, dir)` and vLLM's LoRA loading read it) and, with
`module.lora.export_merged: true`, the base with the adapter merged in as that plain folder.

A sharded run (`trainer.strategy=fsdp`) exports from its shards: every rank joins the gathers, one
tensor at a time, and rank 0 writes them as they come (module/gather.py), so no rank holds a second
whole copy. A sharded checkpoint (a folder) converts like a one-file checkpoint."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import lightning as L
import torch
from torch import nn

from polar_pl.module.gather import drain, full_tensors, write_safetensors
from polar_pl.module.sharding import is_sharded
from polar_pl.rollout.runtime import feed_of

if TYPE_CHECKING:
    from peft import PeftModel

    from polar_pl.module.grpo import GRPOModule

log = logging.getLogger("polar_pl.train")

# What a model folder holds besides the weights and config.json: copied from the starting folder.
_KEEP = (
    "tokenizer*",
    "chat_template*",
    "special_tokens_map.json",
    "vocab*",
    "merges.txt",
    "generation_config.json",
    "polar_model.json",
    "tinymodel.json",
)


def export_hf(model: nn.Module, model_dir: str | Path, out: str | Path, *, write: bool = True) -> Path:
    """Write `model` with the tokenizer files of `model_dir` into `out` (replaced); returns it.
    A sharded model is gathered (a collective): every rank calls this, the one with `write` writes."""
    out = Path(out)
    if not is_sharded(model):
        if write:
            _fresh(out)
            model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]  # HF method; torch types it Tensor | Module
            _copy_tokenizer(model_dir, out)
        return out
    tensors = full_tensors(model, dedupe=True)  # a tied LM head once, as transformers saves it
    if not write:
        drain(tensors)
        return out
    _fresh(out)
    write_safetensors(tensors, out)
    hf: Any = model  # a transformers model: its config and generation config save themselves
    hf.config.save_pretrained(out)
    if getattr(hf, "generation_config", None) is not None:
        hf.generation_config.save_pretrained(out)
    _copy_tokenizer(model_dir, out)
    return out


def _fresh(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)


def _copy_tokenizer(model_dir: str | Path, out: Path) -> None:
    for pattern in _KEEP:
        for src in Path(model_dir).glob(pattern):
            if src.is_file() and not (out / src.name).exists():
                shutil.copy(src, out / src.name)


def export_adapter(
    peft_model: PeftModel, model_dir: str | Path, out: str | Path, *, write: bool = True
) -> Path:
    """The adapter of a PEFT model as PEFT saves it into `out` (replaced), with the tokenizer
    files of `model_dir` (so the folder names its own chat template); returns it. A sharded
    model's adapter is gathered (a collective): every rank calls this, the one with `write` writes."""
    out = Path(out)
    if is_sharded(peft_model):
        from polar_pl.engine.weights import save_adapter
        from polar_pl.module.lora import adapter_state

        tensors, config = adapter_state(peft_model)
        if write:
            _fresh(out)
            save_adapter(tensors, config, out)
    elif write:
        _fresh(out)
        peft_model.save_pretrained(out, safe_serialization=True)  # type: ignore[arg-type]  # PEFT annotates str, takes a path
    if write:
        _copy_tokenizer(model_dir, out)
    return out


def export_merged(adapter_dir: str | Path, model_dir: str | Path, out: str | Path) -> Path:
    """The base of `model_dir` with the adapter of `adapter_dir` merged in (PEFT's
    `merge_and_unload`, on a fresh copy of the base), as a plain HF folder at `out`."""
    from peft import PeftModel

    from polar_pl.module.model import load_model

    merged = PeftModel.from_pretrained(load_model(model_dir), str(adapter_dir)).merge_and_unload()
    return export_hf(merged, model_dir, out)


def hf_from_checkpoint(ckpt_path: str | Path, model_dir: str | Path, out: str | Path) -> Path:
    """A Lightning checkpoint of `GRPOModule` (trained from `model_dir`) as an HF folder at `out`;
    a LoRA checkpoint's adapter is merged into the base. A sharded checkpoint (a folder of
    torch.distributed.checkpoint files, `trainer.strategy=fsdp`) is read whole, in one process."""
    from polar_pl.module.model import load_model

    if Path(ckpt_path).is_dir():
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        ckpt = _load_distributed_checkpoint(Path(ckpt_path))
    else:
        ckpt = torch.load(str(ckpt_path), map_location="cpu", weights_only=False)
    weights = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    if not weights:
        raise ValueError(f"{ckpt_path}: no model.* weights in the checkpoint's state_dict")
    model = load_model(model_dir)
    lora = ckpt.get("grpo", {}).get("lora")
    if lora is None:
        model.load_state_dict(weights, strict=True)
        return export_hf(model, model_dir, out)
    from polar_pl.module.lora import LoraSpec, attach

    spec = LoraSpec.from_config(lora)
    assert spec is not None  # a LoRA checkpoint saves its spec with a rank
    peft_model = attach(model, spec)
    missing = set(model.load_state_dict(weights, strict=False).missing_keys)
    if lost := [n for n, p in model.named_parameters() if p.requires_grad and n in missing]:
        raise ValueError(f"{ckpt_path}: the LoRA checkpoint lacks adapter weights ({lost[:3]}...)")
    return export_hf(peft_model.merge_and_unload(), model_dir, out)


class ExportModel(L.Callback):
    """At the end of a run that was not interrupted: the final policy into `out_dir` (`<run>/model`).
    A LoRA run writes its adapter into `adapter_dir` (None: `adapter` beside `out_dir`), and the
    merged model into `out_dir` only with `module.lora.export_merged: true`."""

    def __init__(self, out_dir: str, adapter_dir: str | None = None) -> None:
        self.out_dir = out_dir
        self.adapter_dir = adapter_dir or str(Path(out_dir).parent / "adapter")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        feed = feed_of(trainer)
        interrupted = feed is not None and feed.runtime.interrupted
        module = cast("GRPOModule", pl_module)
        if module.sharded:  # every rank joins the gathers, as rank 0 decides
            interrupted = trainer.strategy.broadcast(interrupted, src=0)
        elif trainer.global_rank != 0:
            return
        if interrupted:
            return
        write = trainer.global_rank == 0
        assert module.model_dir is not None  # the training config always sets module.model_dir
        lora = module.settings.lora
        if lora is None:
            path = export_hf(module.model, module.model_dir, self.out_dir, write=write)
            if write:
                log.info(
                    "model: %s (transformers, vLLM and `polar-pl engine --model %s` load it)", path, path
                )
            return
        assert module.peft_model is not None  # LoRA: the PEFT model around `model`
        adapter = export_adapter(module.peft_model, module.model_dir, self.adapter_dir, write=write)
        if not write:
            return
        log.info(
            "adapter: %s (PeftModel.from_pretrained(base, %s) and vLLM's LoRA loading read it)",
            adapter,
            adapter,
        )
        if lora.export_merged:
            path = export_merged(adapter, module.model_dir, self.out_dir)
            log.info(
                "model: %s (base + adapter merged; transformers, vLLM and `polar-pl engine` load it)", path
            )
